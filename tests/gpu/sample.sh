#!/bin/bash
# tests/gpu/sample.sh: the CUDA sample op, right and timed, on a GPU machine, in one call,
# from the repository root (the -dev packages in .gpu-deps/ as for tests/gpu/run.sh;
# GPU_PREBUILT=DIR takes a build made elsewhere):
#   1. build tpinfer, tests/check_backend_ops, bench/gpu_sample; check_backend_ops' sample
#      group (sample_cases against the CPU, rows without logprobs among them; the draw
#      frequencies; the faults);
#   2. bench/gpu_sample: the op alone at 128,256 columns, 1, 16 and 128 rows, per rule,
#      every token against the CPU backend's;
#   2b. where the shared models are (./shared, ../shared or SAMPLE_SHARED): tpinfer on
#      stories260K with tests/sample_prompts.jsonl (14 requests under every rule, so rows
#      go to teams of blocks), the device's sample op against the host sampler: the same
#      completions and logprobs, eager and in CUDA graphs (as tests/gpu/run.sh);
#   3. unless SAMPLE_AB=0: bench/ab_decode.sh b128 (BENCH_RUNS) greedy, at temperature 0.8,
#      and at temperature 0.8 with logprobs 1 (the log-sum-exp a row), SAMPLE_REPEAT times
#      (default 1), interleaved; SAMPLE_AB_REQUESTS: other requests instead (space-separated
#      JSON objects without spaces, "greedy" for the defaults); SAMPLE_AB_BASE=PATH: each
#      also with that tpinfer (a build before the change) just before this one.
# Prints a table last; logs in $OUT (default /tmp/tpinfer-sample-out).
set -u
OUTDIR=${OUT:-/tmp/tpinfer-sample-out}
mkdir -p "$OUTDIR"
. tests/gpu/build.sh
gpu_build tpinfer tests/check_backend_ops bench/gpu_sample
if CK_FORK=no CK_RUN_CASE=sample timeout 300 "$B/tests/check_backend_ops" >"$OUTDIR/ops-sample.log" 2>&1; then
    record "check_backend_ops sample" "PASS ($(grep -c 'sample .*ok' "$OUTDIR/ops-sample.log") blocks)"
else
    record "check_backend_ops sample" "FAIL: $(grep -m2 -E 'Failure|Error|error|FAIL' "$OUTDIR/ops-sample.log" | tr '|' '/' | cut -c1-200)"
fi
if timeout 300 "$B/bench/gpu_sample" >"$OUTDIR/gpu_sample.log" 2>&1; then
    # every row's "tokens = CPU" column reads "N of N"
    differ=$(awk -F'|' '/ of / { split($6, a, " of "); if (a[1] + 0 != a[2] + 0) n++ } END { print n + 0 }' \
        "$OUTDIR/gpu_sample.log")
    record "bench/gpu_sample" "$([ "$differ" = 0 ] && echo "ran; every token the CPU's" || echo "FAIL: $differ rows with tokens other than the CPU's")"
else
    record "bench/gpu_sample" "FAIL rc $?: $(tail -2 "$OUTDIR/gpu_sample.log" | tr '|\n' '/ ' | cut -c1-200)"
fi
SHARED=${SAMPLE_SHARED:-$( [ -d shared/models ] && echo shared || echo ../shared)}
if [ -d "$SHARED/models/stories260K-hf" ]; then
    for mode in eager graphs; do
        flag=(); [ $mode = eager ] && flag=(--enforce-eager)
        for h in 0 1; do
            rm -f "$OUTDIR/engine-$mode-$h.jsonl"
            TPINFER_SAMPLE_ON_HOST=$h TPINFER_LOG=debug timeout 120 "$B/tpinfer" --model "$SHARED/models/stories260K-hf" \
                --backend cuda --dtype float32 "${flag[@]}" --input tests/sample_prompts.jsonl \
                --output "$OUTDIR/engine-$mode-$h.jsonl" >"$OUTDIR/engine-$mode-$h.log" 2>&1
            sort "$OUTDIR/engine-$mode-$h.jsonl" >"$OUTDIR/engine-$mode-$h.sorted" 2>/dev/null
        done
        if [ -s "$OUTDIR/engine-$mode-0.sorted" ] && cmp -s "$OUTDIR/engine-$mode-0.sorted" "$OUTDIR/engine-$mode-1.sorted" &&
            grep -q "[1-9][0-9]* by its sample op" "$OUTDIR/engine-$mode-0.log" &&
            ! grep -q "cannot record" "$OUTDIR/engine-$mode-0.log"; then
            record "stories260K: device sample op = host sampler, $mode" "PASS ($(grep -m1 -o 'tokens chosen.*' "$OUTDIR/engine-$mode-0.log" | cut -c1-120))"
        else
            record "stories260K: device sample op = host sampler, $mode" "FAIL: $( (grep -m1 'cannot record\|error' "$OUTDIR/engine-$mode-0.log"; diff "$OUTDIR/engine-$mode-0.sorted" "$OUTDIR/engine-$mode-1.sorted") | head -2 | tr '|\n' '/ ' | cut -c1-200)"
        fi
    done
else
    record "stories260K: device sample op = host sampler" "not run: no $SHARED/models/stories260K-hf"
fi
if [ "${SAMPLE_AB:-1}" = 1 ]; then
    requests=(greedy '{"temperature":0.8,"seed":1}' '{"temperature":0.8,"seed":1,"logprobs":1}')
    [ -n "${SAMPLE_AB_REQUESTS:-}" ] && read -ra requests <<<"$SAMPLE_AB_REQUESTS"
    args=()
    for _ in $(seq "${SAMPLE_REPEAT:-1}"); do
        for q in "${requests[@]}"; do
            v=$([ "$q" = greedy ] || echo "BENCH_REQUEST=$q")
            [ -n "${SAMPLE_AB_BASE:-}" ] && args+=("BENCH_TPINFER=$SAMPLE_AB_BASE${v:+ $v}")
            args+=("$v")
        done
    done
    OUT=$OUTDIR/ab BENCH_RUNS=${BENCH_RUNS:-b128} BENCH_TPINFER=$B/tpinfer timeout ${SAMPLE_AB_TIMEOUT:-400} \
        bash bench/ab_decode.sh "${args[@]}" >"$OUTDIR/ab.log" 2>&1
    while IFS= read -r line; do
        case $line in "| defaults"* | "| BENCH_REQUEST"* | "| BENCH_TPINFER"*) record "ab" "$line" ;; esac
    done <"$OUTDIR/ab.log"
fi
cat "$OUTDIR/gpu_sample.log"
print_results
