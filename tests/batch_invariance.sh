#!/bin/sh
# A request's output does not depend on what it is batched with (CPU backend, tp 1):
# each prompt alone, all together, in tiny prefill chunks, under KV-cache pressure that
# forces preemption and recomputation, split over two data-parallel replicas, and over two
# pipeline stages, gives bit-identical logits and the same completions (tpinfer(1),
# Reproducibility).
. "$top_srcdir/tests/lib.sh"
need_shared
export OMP_NUM_THREADS=1
m="$MODELS/stories260K-hf"
cmp_logits="$top_builddir/tests/compare_logits"
"$cmp_logits" --make-input "$m/reference/logits.safetensors" "$TMP/all.jsonl" || fail "reference"
run_on() { # run_on RANKS NAME INPUT [flags...]: tpinfer over RANKS ranks (1: without mpirun)
    ranks=$1 name=$2 input=$3; shift 3
    launch=
    [ "$ranks" -gt 1 ] && launch="mpi $ranks"
    $launch "$TPINFER" --model "$m" --backend cpu --input "$input" --output "$TMP/$name.jsonl" \
        --dump-logits "$TMP/$name" "$@" 2>"$TMP/$name.err" || { cat "$TMP/$name.err"; fail "run $name"; }
}
run() { run_on 1 "$@"; } # run NAME INPUT [flags...]
same_dumps() { # same_dumps A B: A and B dumped the same requests, each file byte for byte
    [ "$(cd "$TMP/$1" && ls)" = "$(cd "$TMP/$2" && ls)" ] ||
        fail "'$1' and '$2' dumped other requests: $(ls "$TMP/$1" | tr '\n' ' ')/ $(ls "$TMP/$2" | tr '\n' ' ')"
    for f in "$TMP/$1"/*.safetensors; do
        cmp -s "$f" "$TMP/$2/$(basename "$f")" || fail "$(basename "$f"): logits of '$1' and '$2' differ"
    done
}

run together "$TMP/all.jsonl"
# each prompt on its own
i=0
while IFS= read -r line; do
    printf '%s\n' "$line" >"$TMP/in$i.jsonl"
    run "one$i" "$TMP/in$i.jsonl"
    mkdir -p "$TMP/alone" && cp "$TMP/one$i"/*.safetensors "$TMP/alone/"
    i=$((i + 1))
done <"$TMP/all.jsonl"
same_dumps alone together
# prefill in chunks of 7 tokens, two sequences at a time
run chunked "$TMP/all.jsonl" --max-num-batched-tokens 7 --max-num-seqs 2
same_dumps chunked together
# KV cache of 10 blocks of 16 tokens (20 KiB each), room for one sequence: they preempt each other
run tight "$TMP/all.jsonl" --kv-cache-memory 200KiB --max-model-len 160
grep -q "preempted" "$TMP/tight.err" && ! grep -q " 0 preempted" "$TMP/tight.err" ||
    { cat "$TMP/tight.err"; fail "the tight KV cache did not force preemption"; }
same_dumps tight together
cmp -s "$TMP/together.jsonl" "$TMP/tight.jsonl" || fail "completions differ under preemption"
# two pipeline stages (each rank its layers; the activations passed on): the same bits
run_on 2 pp2 "$TMP/all.jsonl" --pp 2
same_dumps pp2 together
# decode steps padded to the batch sizes of the CUDA graphs (as they run on a GPU): the
# padding rows change nothing, at tp 1 and at tp 2 (whose gathered logits carry the padded
# row count)
TPINFER_PAD_DECODE=1 run padded "$TMP/all.jsonl"
same_dumps padded together
cmp -s "$TMP/together.jsonl" "$TMP/padded.jsonl" || fail "completions differ with padded decode steps"
for pad in 0 1; do TPINFER_PAD_DECODE=$pad run_on 2 tp2pad$pad "$TMP/all.jsonl" --tp 2; done
same_dumps tp2pad1 tp2pad0
cmp -s "$TMP/tp2pad0.jsonl" "$TMP/tp2pad1.jsonl" || fail "completions differ with padded decode steps at tp 2"
# the warm-up before the first step (on by default on a GPU: a prefill-sized step and every
# graph batch size, dummy tokens that write nothing to the KV cache) changes nothing, with the
# logits copied out (dumps), the device's argmax (greedy) and its sample op (sampled), at tp 1,
# tp 2 and pp 2 (whose stages pass the warm-up's activations on)
TPINFER_LOG=debug TPINFER_WARMUP=1 TPINFER_PAD_DECODE=1 run warm "$TMP/all.jsonl"
grep -q "warm-up before the first step" "$TMP/warm.err" || { cat "$TMP/warm.err"; fail "no warm-up ran"; }
# (and the debug level's step timeline: the first step, a prefill of every prompt)
grep -q "debug: step 0 at [0-9.]* ms: [0-9]* tokens of 4 sequences, 4 sampled; forward" "$TMP/warm.err" ||
    { grep "debug: step" "$TMP/warm.err" | head -3; fail "no step timeline at TPINFER_LOG=debug"; }
# (the first step's own product shapes are warmed too: a prefill of its token count, here
# smaller than the prefill-sized step)
first=$(sed -n 's/.*debug: step 0 at [0-9.]* ms: \([0-9]*\) tokens of 4 sequences.*/\1/p' "$TMP/warm.err")
grep -q "warm-up: the first step's prefill too, $first tokens in 4 sequences (the first step's: 4)" "$TMP/warm.err" ||
    { grep "warm-up" "$TMP/warm.err"; fail "the warm-up did not run the first step's prefill ($first tokens)"; }
same_dumps warm together
cmp -s "$TMP/together.jsonl" "$TMP/warm.jsonl" || fail "completions differ after the warm-up"
# (and where the KV cache admits fewer of the prompts: 3 blocks of 16 tokens take 3 sequences,
# the third in part, so the warmed step is the first step's size, not the prompts')
sed 's/"max_tokens": 128/"max_tokens": 8/' "$TMP/all.jsonl" >"$TMP/short.jsonl"
TPINFER_LOG=debug TPINFER_WARMUP=1 TPINFER_PAD_DECODE=1 run warm_kv "$TMP/short.jsonl" --kv-cache-memory 60KiB \
    --max-model-len 48
step0=$(sed -n 's/.*debug: step 0 at [0-9.]* ms: \([0-9]*\) tokens of \([0-9]*\) sequences.*/\1 \2/p' "$TMP/warm_kv.err")
set -- $step0
[ $# -eq 2 ] && [ "$2" -lt 4 ] || { cat "$TMP/warm_kv.err"; fail "the tight KV cache admitted every prompt at once ($step0)"; }
grep -q "warm-up: the first step's prefill too, $1 tokens in $2 sequences (the first step's: $2)" "$TMP/warm_kv.err" ||
    { grep "warm-up\|step 0" "$TMP/warm_kv.err"; fail "the warm-up's first step is not the admitted one ($1 tokens, $2 sequences)"; }
# a prefill step of more tokens than the largest graph batch, each in fewer sequences than it
# (the warm-up's host arrays must hold the larger of both)
TPINFER_WARMUP=1 TPINFER_PAD_DECODE=1 run warm_small "$TMP/all.jsonl" --max-num-batched-tokens 300 --max-num-seqs 200
same_dumps warm_small together
sed 's/^{/{"temperature": 0.8, "top_p": 0.9, "seed": 11, /' "$TMP/all.jsonl" >"$TMP/sampled.jsonl"
for grid in tp1 tp2 pp2; do
    np=${grid#??}
    for input in all sampled; do
        for w in 0 1; do
            name=w$w-$input-$grid
            TPINFER_WARMUP=$w TPINFER_PAD_DECODE=1 mpi "$np" "$TPINFER" --model "$m" --backend cpu "--${grid%?}" "$np" \
                --input "$TMP/$input.jsonl" --output "$TMP/$name.jsonl" 2>"$TMP/$name.err" ||
                { cat "$TMP/$name.err"; fail "$name"; }
        done
        cmp -s "$TMP/w0-$input-$grid.jsonl" "$TMP/w1-$input-$grid.jsonl" ||
            fail "$input completions at $grid differ after the warm-up"
        # (pp's micro-batches finish in their own order: the sets of lines)
        sort "$TMP/w0-$input-tp1.jsonl" >"$TMP/a.sorted"
        sort "$TMP/w1-$input-$grid.jsonl" >"$TMP/b.sorted"
        cmp -s "$TMP/a.sorted" "$TMP/b.sorted" || fail "$input completions at $grid after the warm-up differ from tp 1's"
    done
done
cmp -s "$TMP/w0-all-tp1.jsonl" "$TMP/w0-sampled-tp1.jsonl" && fail "the sampled input was not sampled"
# two data-parallel replicas split the prompts
run_on 2 dp2 "$TMP/all.jsonl"
same_dumps dp2 together
# (replicas finish in their own order: compare the sets of lines)
sort "$TMP/together.jsonl" >"$TMP/a.sorted"
sort "$TMP/dp2.jsonl" >"$TMP/b.sorted"
cmp -s "$TMP/a.sorted" "$TMP/b.sorted" || fail "completions differ at dp 2"
exit 0
