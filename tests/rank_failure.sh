#!/bin/sh
# A failure on some ranks only (a tensor only pipeline stage 1 reads has the wrong shape)
# ends every rank within seconds, non-zero, with the failing ranks naming the tensor, in a
# dry run and in a real one; so does a backend that one rank of a tp group cannot make (the
# others must not wait for it in the group's communicator: on GPUs NCCL's, made after every
# rank's backend exists).
. "$top_srcdir/tests/lib.sh"
[ "$PYTHON3" != no ] || skip "python3 not found"
"$PYTHON3" "$top_srcdir/tests/gen_tiny_model.py" "$TMP/m" || fail "gen_tiny_model.py"
# Swap the two dims of a layer-3 weight: the file stays valid, the shape does not fit.
"$PYTHON3" "$top_srcdir/tests/swap_tensor_shape.py" "$TMP/m/model.safetensors" model.layers.3.mlp.down_proj.weight ||
    fail "rewriting the header"
start=$(date +%s)
expect_fail 1 "model.layers.3.mlp.down_proj.weight" mpi 4 "$TPINFER" --model "$TMP/m" --dry-run --tp 2 --pp 2
elapsed=$(( $(date +%s) - start ))
[ $elapsed -le 30 ] || fail "took ${elapsed}s to end the job"
grep -q "tpinfer\[2/4" "$TMP/err" && grep -q "tpinfer\[3/4" "$TMP/err" || fail "stage-1 ranks did not report"
grep "down_proj" "$TMP/err" | grep -q "tpinfer\[[01]/4" && fail "stage-0 ranks reported an error they did not have"
grep -q "rank 2 (tp 0, pp 1)\|128 x 64\|64 x 128" "$TMP/err" || fail "message lacks the shapes"
printf 'Once upon a time\n' >"$TMP/p.txt"
expect_fail 1 "model.layers.3.mlp.down_proj.weight has 2-D shape" mpi 4 "$TPINFER" --model "$TMP/m" --tp 2 --pp 2 \
    --input "$TMP/p.txt" --output "$TMP/out.jsonl" --max-tokens 2
# rank 1 asks for a GPU backend this machine or build cannot give (mpirun's MPMD form)
"$PYTHON3" "$top_srcdir/tests/gen_tiny_model.py" "$TMP/ok" || fail "gen_tiny_model.py"
start=$(date +%s)
expect_fail 1 "rank 1" mpi 1 "$TPINFER" --model "$TMP/ok" --tp 2 --input "$TMP/p.txt" --output "$TMP/mixed.jsonl" \
    --max-tokens 2 --backend cpu : -np 1 env CUDA_VISIBLE_DEVICES= "$TPINFER" --model "$TMP/ok" --tp 2 \
    --input "$TMP/p.txt" --output "$TMP/mixed.jsonl" --max-tokens 2 --backend cuda
[ $(( $(date +%s) - start )) -le 30 ] || fail "a backend failing on one rank took over 30 s to end the job"
grep -q "built without CUDA\|sees no GPU" "$TMP/err" || { cat "$TMP/err"; fail "rank 1 did not say why"; }
exit 0
