#!/bin/sh
# Sampling on the device (the backend's sample op, tp_sample_row rules built by the engine)
# gives what the host sampler gives: the same completions, logprobs and top logprobs, for
# temperature, top-k, top-p, min-p, the three penalties, min_tokens (end tokens banned),
# n > 1 (each choice its own stream) and greedy rows with logprobs, at tp 1 and tp 2 (where
# the gathered logits are re-laid out on the device). CPU backend; tests/gpu/run.sh does the
# same on a GPU.
. "$top_srcdir/tests/lib.sh"
need_shared
export OMP_NUM_THREADS=1
m="$MODELS/stories260K-hf"
cat >"$TMP/in.jsonl" <<'JSONL'
{"id":"topk-rep","prompt":"Once upon a time","max_tokens":40,"temperature":0.9,"top_k":20,"repetition_penalty":1.3,"logprobs":3,"seed":5}
{"id":"minp-pen-n2","prompt":"The cat","max_tokens":30,"temperature":1.2,"min_p":0.05,"presence_penalty":0.5,"frequency_penalty":0.4,"n":2,"seed":7}
{"id":"min-tokens","prompt":"Lily","max_tokens":30,"temperature":0.7,"min_tokens":20,"logprobs":5}
{"id":"greedy-logprobs","prompt":"Tom went","max_tokens":20,"temperature":0,"logprobs":2}
{"id":"topp","prompt":"One day","max_tokens":25,"temperature":1.0,"top_p":0.8,"seed":11}
JSONL
run() { # run NAME NP [NAME=VALUE...]: tpinfer on the prompts (under mpirun at tp NP when NP is set)
    name=$1 np=$2; shift 2
    ( for kv in "$@"; do export "$kv"; done
      if [ -n "$np" ]; then
          mpi "$np" -x TPINFER_SAMPLE_ON_HOST "$TPINFER" --model "$m" --backend cpu --tp "$np" \
              --input "$TMP/in.jsonl" --output "$TMP/$name.jsonl"
      else
          "$TPINFER" --model "$m" --backend cpu --input "$TMP/in.jsonl" --output "$TMP/$name.jsonl"
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
if [ -n "${MPIRUN:-}" ] && [ "$MPIRUN" != no ]; then
    run device2 2 TPINFER_SAMPLE_ON_HOST=0
    run host2 2 TPINFER_SAMPLE_ON_HOST=1
    cmp -s "$TMP/device2.jsonl" "$TMP/host2.jsonl" || fail "tp 2: the sample op and the host sampler differ"
fi
echo "PASS: the sample op and the host sampler agree"
