#!/bin/sh
# Sampling on the device (the backend's sample op, tp_sample_row rules built by the engine)
# gives what the host sampler gives: the same completions, logprobs and top logprobs, for
# temperature, top-k, top-p, min-p, the three penalties, min_tokens (end tokens banned),
# n > 1 (each choice its own stream) and greedy rows with logprobs, at tp 1 and tp 2 (where
# the gathered logits are re-laid out on the device), also where the first step the sample
# op takes is a padded decode step (a prefill with prompt logprobs goes to the host sampler:
# tp 2's ranks must all run that step unpadded), and where a setting that changes the steps'
# collectives reaches one rank only. CPU backend; tests/gpu/run.sh does the same on a GPU.
. "$top_srcdir/tests/lib.sh"
need_shared
export OMP_NUM_THREADS=1
m="$MODELS/stories260K-hf"
in="$top_srcdir/tests/sample_prompts.jsonl"
run() { # run NAME NP [NAME=VALUE...]: tpinfer on $in (under mpirun at tp NP when NP is set)
    name=$1 np=$2; shift 2
    ( export TPINFER_PAD_DECODE=0
      for kv in "$@"; do export "$kv"; done
      if [ -n "$np" ]; then
          mpi "$np" -x TPINFER_SAMPLE_ON_HOST -x TPINFER_PAD_DECODE "$TPINFER" --model "$m" --backend cpu --tp "$np" \
              --input "$in" --output "$TMP/$name.jsonl"
      else
          "$TPINFER" --model "$m" --backend cpu --input "$in" --output "$TMP/$name.jsonl"
      fi ) 2>"$TMP/$name.err" || { cat "$TMP/$name.err"; fail "run $name"; }
}
run device "" TPINFER_SAMPLE_ON_HOST=0 TPINFER_LOG=debug
run host "" TPINFER_SAMPLE_ON_HOST=1 TPINFER_LOG=debug
grep -q "by the device's argmax, [1-9][0-9]* by its sample op, 0 by the host sampler" "$TMP/device.err" ||
    { grep "tokens chosen" "$TMP/device.err"; fail "the sample op did not choose the tokens"; }
grep -q "by its sample op, 0 by the host sampler" "$TMP/host.err" &&
    fail "TPINFER_SAMPLE_ON_HOST=1 did not keep the host sampler"
cmp -s "$TMP/device.jsonl" "$TMP/host.jsonl" || { diff "$TMP/device.jsonl" "$TMP/host.jsonl" | head -5; fail "tp 1: the sample op and the host sampler differ"; }
[ "$(grep -c '"logprobs"' "$TMP/device.jsonl")" -ge 3 ] || fail "the requests that ask for logprobs have none"
# decode steps padded to the CUDA graphs' batch sizes (as on a GPU, where they replay as
# graphs with the sample op inside): the padding rows sample greedily and change nothing
run padded "" TPINFER_SAMPLE_ON_HOST=0 TPINFER_PAD_DECODE=1
cmp -s "$TMP/padded.jsonl" "$TMP/host.jsonl" || fail "tp 1: padded steps with the sample op differ from the host sampler"
if [ -n "${MPIRUN:-}" ] && [ "$MPIRUN" != no ]; then
    run device2 2 TPINFER_SAMPLE_ON_HOST=0
    run host2 2 TPINFER_SAMPLE_ON_HOST=1
    cmp -s "$TMP/device2.jsonl" "$TMP/host2.jsonl" || fail "tp 2: the sample op and the host sampler differ"
    run padded2 2 TPINFER_SAMPLE_ON_HOST=0 TPINFER_PAD_DECODE=1
    cmp -s "$TMP/padded2.jsonl" "$TMP/host2.jsonl" || fail "tp 2: padded steps with the sample op differ"
    # prompt logprobs: the prefill on the host sampler, the sample op first in a decode step
    sed '1 s/^{/{"prompt_logprobs":1,/' "$top_srcdir/tests/sample_prompts.jsonl" >"$TMP/prompt_lp.jsonl"
    in=$TMP/prompt_lp.jsonl
    run plhost2 2 TPINFER_SAMPLE_ON_HOST=1
    run plpadded2 2 TPINFER_SAMPLE_ON_HOST=0 TPINFER_PAD_DECODE=1 TPINFER_LOG=debug
    grep -q "by its sample op, 1 by the host sampler" "$TMP/plpadded2.err" ||
        { grep "tokens chosen" "$TMP/plpadded2.err"; fail "tp 2, prompt logprobs: not one host-sampled prefill, then the sample op"; }
    cmp -s "$TMP/plpadded2.jsonl" "$TMP/plhost2.jsonl" ||
        fail "tp 2, prompt logprobs: padded steps with the sample op differ from the host sampler"
    # a setting that changes a step's collectives, given to one rank only (mpirun without -x
    # across hosts): the ranks agree on it (the host sampler where one asks; padding and the
    # pruned last layer only where all do), so the run ends and matches the host sampler's
    in=$top_srcdir/tests/sample_prompts.jsonl
    for v in TPINFER_SAMPLE_ON_HOST=1 TPINFER_PAD_DECODE=1 TPINFER_PRUNE_LAST=0; do
        OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout -k 10 120 "$MPIRUN" --oversubscribe \
            -np 1 env TPINFER_PAD_DECODE=0 "$v" "$TPINFER" --model "$m" --backend cpu --tp 2 --input "$in" \
            --output "$TMP/one-rank.jsonl" : \
            -np 1 env TPINFER_PAD_DECODE=0 "$TPINFER" --model "$m" --backend cpu --tp 2 --input "$in" \
            --output "$TMP/one-rank.jsonl" 2>"$TMP/one-rank.err" || { cat "$TMP/one-rank.err"; fail "tp 2, $v on rank 0 only"; }
        want=$TMP/device2.jsonl
        [ "$v" = TPINFER_SAMPLE_ON_HOST=1 ] && want=$TMP/host2.jsonl
        cmp -s "$TMP/one-rank.jsonl" "$want" || fail "tp 2, $v on rank 0 only: the completions differ"
        rm -f "$TMP/one-rank.jsonl"*
    done
fi
echo "PASS: the sample op and the host sampler agree"
