#!/bin/sh
# The o and down products added into the residual where they are made (matmul_add, at tp 1)
# give what the products written to delta and added by the next add_rmsnorm give
# (TPINFER_RESIDUAL_ADD=0): on the CPU backend the same bytes, completions, logprobs and
# every dumped logit; greedy and sampled requests, prefill chunks, the last layer pruned and
# not, biases on o (its product goes through delta while down's is added in place) and on
# down, pp 2 (a stage that sends leaves its last product in delta, the receiver adds it; its
# output is tp 1's) and tp 2 (where it is off: the all-reduce comes first).
# RESIDUAL_BACKEND=cuda (tests/gpu/run.sh): in float32, the same tokens (cuBLASLt's
# epilogue adds in f32 as add_rmsnorm does; logprobs equal up to rounding).
. "$top_srcdir/tests/lib.sh"
need_shared
export OMP_NUM_THREADS=1
cat >"$TMP/in.jsonl" <<'JSONL'
{"id": "a", "prompt": "Once upon a time", "max_tokens": 12, "logprobs": 3}
{"id": "b", "prompt": "Lily and Ben went to the park and", "max_tokens": 5, "logprobs": 2, "prompt_logprobs": 2}
{"id": "c", "prompt": "The cat sat", "max_tokens": 8, "temperature": 0.9, "seed": 3, "logprobs": 1}
JSONL
for bias in attention mlp; do
    "${PYTHON3:-python3}" "$top_srcdir/tests/gen_tiny_model.py" "$TMP/$bias-bias" --$bias-bias ||
        fail "gen_tiny_model.py --$bias-bias"
done
ab_backend "${RESIDUAL_BACKEND:-cpu}"
# both NAME MODEL_DIR EXPECT [launcher and flags...]: TPINFER_RESIDUAL_ADD=0 and the default
# give the same output; EXPECT is whether the default adds in place (the debug line says so)
both() {
    name=$1 model=$2 expect=$3; shift 3
    for r in 0 1; do
        rm -rf "$TMP/$name$r.dump"
        TPINFER_LOG=debug TPINFER_WARMUP=0 TPINFER_RESIDUAL_ADD=$r "$@" --model "$model" --backend "$backend" \
            $flags --input "$TMP/in.jsonl" --dump-logits "$TMP/$name$r.dump" \
            --output "$TMP/$name$r.jsonl" 2>"$TMP/$name$r.err" || { cat "$TMP/$name$r.err"; fail "$name, TPINFER_RESIDUAL_ADD=$r"; }
    done
    [ "$(ab_output "$TMP/${name}0.jsonl")" = "$(ab_output "$TMP/${name}1.jsonl")" ] ||
        { diff "$TMP/${name}0.jsonl" "$TMP/${name}1.jsonl" | head -5; fail "$name: adding in place changed the output"; }
    if [ "$backend" = cpu ]; then
        [ "$(ls "$TMP/${name}0.dump")" = "$(ls "$TMP/${name}1.dump")" ] || fail "$name: the dumps are not the same files"
        for f in "$TMP/${name}0.dump"/*; do
            cmp -s "$f" "$TMP/${name}1.dump/${f##*/}" || fail "$name: ${f##*/}'s logits differ"
        done
    fi
    ! grep -q "added into the residual" "$TMP/${name}0.err" || fail "$name: TPINFER_RESIDUAL_ADD=0 added in place"
    if [ "$expect" = yes ]; then
        grep -q "added into the residual" "$TMP/${name}1.err" || { cat "$TMP/${name}1.err"; fail "$name: not added in place"; }
    else
        ! grep -q "added into the residual" "$TMP/${name}1.err" || fail "$name: added in place where it must not"
    fi
}
# same_as NAME OTHER: the default runs of two grids give the same output
same_as() {
    [ "$(ab_output "$TMP/${1}1.jsonl")" = "$(ab_output "$TMP/${2}1.jsonl")" ] ||
        { diff "$TMP/${1}1.jsonl" "$TMP/${2}1.jsonl" | head -5; fail "$1 differs from $2"; }
}
both stories "$MODELS/stories260K-hf" yes "$TPINFER"
both chunked "$MODELS/stories260K-hf" yes "$TPINFER" --max-num-batched-tokens 5 --max-num-seqs 2
both unpruned "$MODELS/stories260K-hf" yes env TPINFER_PRUNE_LAST=0 "$TPINFER"
both qwen2 "$MODELS/tiny-qwen2" yes "$TPINFER" --max-num-batched-tokens 7
both obias "$TMP/attention-bias" yes "$TPINFER"
both downbias "$TMP/mlp-bias" yes "$TPINFER" --max-num-batched-tokens 6
if [ -n "${MPIRUN:-}" ] && [ "$MPIRUN" != no ]; then
    both pp2 "$MODELS/stories260K-hf" yes mpi 2 "$TPINFER" --pp 2
    same_as pp2 stories
    both obias-pp2 "$TMP/attention-bias" yes mpi 2 "$TPINFER" --pp 2
    same_as obias-pp2 obias
    both tp2 "$MODELS/stories260K-hf" no mpi 2 "$TPINFER" --tp 2
fi
exit 0
