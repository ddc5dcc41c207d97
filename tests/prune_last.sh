#!/bin/sh
# The last layer past its attention runs on the logit rows alone (a step with fewer logit
# rows than tokens: a prefill's last token of each prompt): every completion, logprob and
# prompt logprob is the same as with every row computed (TPINFER_PRUNE_LAST=0), on the CPU
# backend bit for bit: greedy and sampled requests, n = 2, prompt logprobs (every prompt
# row samples), prefill chunks that end inside a prompt (no row samples), models with q/k
# norms and with biases, tp 2 and pp 2 (the last stage's input from the stage before).
# PRUNE_BACKEND=cuda (tests/gpu/run.sh): in float32, the same tokens (the products of L
# rows may take other cuBLASLt algorithms than those of T rows: logprobs equal up to
# rounding), tp 2 and pp 2 where MPIRUN is given (a machine of two GPUs).
. "$top_srcdir/tests/lib.sh"
need_shared
export OMP_NUM_THREADS=1
cat >"$TMP/in.jsonl" <<'JSONL'
{"id": "a", "prompt": "Once upon a time", "max_tokens": 12, "logprobs": 3}
{"id": "b", "prompt": "Lily and Ben went to the park and", "max_tokens": 5, "logprobs": 2, "prompt_logprobs": 2}
{"id": "c", "prompt": "The cat sat", "max_tokens": 8, "temperature": 0.9, "seed": 3, "logprobs": 1}
{"id": "d", "prompt": "One day, a little girl named Sue saw a big red ball in the garden", "max_tokens": 6, "n": 2, "temperature": 0.8, "seed": 1}
JSONL
ab_backend "${PRUNE_BACKEND:-cpu}"
# both NAME MODEL [flags...]: TPINFER_PRUNE_LAST=0 and the default give the same bytes
both() {
    name=$1 model=$2; shift 2
    for p in 0 1; do
        TPINFER_LOG=debug TPINFER_WARMUP=0 TPINFER_PRUNE_LAST=$p "$@" --model "$MODELS/$model" --backend "$backend" \
            $flags --input "$TMP/in.jsonl" \
            --output "$TMP/$name$p.jsonl" 2>"$TMP/$name$p.err" || { cat "$TMP/$name$p.err"; fail "$name, TPINFER_PRUNE_LAST=$p"; }
    done
    [ "$(ab_output "$TMP/${name}0.jsonl")" = "$(ab_output "$TMP/${name}1.jsonl")" ] ||
        { diff "$TMP/${name}0.jsonl" "$TMP/${name}1.jsonl" | head -5; fail "$name: pruning the last layer changed the output"; }
    grep -q "the last layer past its attention" "$TMP/${name}1.err" || { cat "$TMP/${name}1.err"; fail "$name: no step was pruned"; }
    ! grep -q "the last layer past its attention" "$TMP/${name}0.err" || fail "$name: TPINFER_PRUNE_LAST=0 pruned"
    grep -q '"prompt_logprobs":\[null,{' "$TMP/${name}1.jsonl" || fail "$name: no prompt logprobs"
}
both stories stories260K-hf "$TPINFER"
both chunked stories260K-hf "$TPINFER" --max-num-batched-tokens 5 --max-num-seqs 2
both qwen3 tiny-qwen3 "$TPINFER"
both qwen2 tiny-qwen2 "$TPINFER" --max-num-batched-tokens 7
if [ -n "${MPIRUN:-}" ] && [ "$MPIRUN" != no ]; then
    both tp2 stories260K-hf mpi 2 "$TPINFER" --tp 2
    both pp2 stories260K-hf mpi 2 "$TPINFER" --pp 2
fi
exit 0
