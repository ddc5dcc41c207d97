#!/bin/bash
# tests/gpu/sample.sh: the CUDA sample op, right and timed, on a GPU machine, in one call,
# from the repository root (the -dev packages in .gpu-deps/ as for tests/gpu/run.sh;
# GPU_PREBUILT=DIR takes a build made elsewhere):
#   1. build tpinfer, tests/check_backend_ops, bench/gpu_sample; check_backend_ops' sample
#      group (sample_cases against the CPU, rows without logprobs among them; the draw
#      frequencies; the faults);
#   2. bench/gpu_sample: the op alone at 128,256 columns, 1, 16 and 128 rows, per rule,
#      every token against the CPU backend's; SAMPLE_OP_BASE=PATH: another build's
#      gpu_sample (before a change) and this one's, twice each, interleaved, their timings
#      side by side;
#   2b. where the shared models are (./shared, ../shared or SAMPLE_SHARED): tpinfer on
#      stories260K with tests/sample_prompts.jsonl (14 requests under every rule, so rows
#      go to teams of blocks), eager and in CUDA graphs: the device's sample op against the
#      host sampler, the same bytes with each step waiting for the one before
#      (TPINFER_OVERLAP=0, the host's batches), the same tokens and logprobs within 1e-4
#      with steps enqueued ahead (other batches: logits that differ in their last bits);
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
ops_check sample 300 "blocks=sample .*ok"
if timeout 300 "$B/bench/gpu_sample" >"$OUTDIR/gpu_sample.log" 2>&1; then
    # every row's "tokens = CPU" column reads "N of N"
    differ=$(awk -F'|' '/ of / { split($6, a, " of "); if (a[1] + 0 != a[2] + 0) n++ } END { print n + 0 }' \
        "$OUTDIR/gpu_sample.log")
    record "bench/gpu_sample" "$([ "$differ" = 0 ] && echo "ran; every token the CPU's" || echo "FAIL: $differ rows with tokens other than the CPU's")"
else
    record "bench/gpu_sample" "FAIL rc $?: $(log_tail "$OUTDIR/gpu_sample.log")"
fi
if [ -n "${SAMPLE_OP_BASE:-}" ]; then
    for k in 1 2; do
        timeout 300 "$SAMPLE_OP_BASE" >"$OUTDIR/gpu_sample-base$k.log" 2>&1
        timeout 300 "$B/bench/gpu_sample" >"$OUTDIR/gpu_sample-this$k.log" 2>&1
    done
    awk -F' *[|] *' 'FNR == 1 { f++ }
        /^[|].* of / { k = $2 " | " $3 " | " $4; t[k] = t[k] (t[k] == "" ? "" : " / ") $5; if (f == 1) order[++n] = k }
        END { print "| logits | rule | rows | us a call: base / this / base / this |\n| --- | --- | ---: | --- |"
              for (i = 1; i <= n; i++) print "| " order[i] " | " t[order[i]] " |" }' \
        "$OUTDIR"/gpu_sample-base1.log "$OUTDIR"/gpu_sample-this1.log "$OUTDIR"/gpu_sample-base2.log \
        "$OUTDIR"/gpu_sample-this2.log >"$OUTDIR/gpu_sample-ab.md"
fi
SHARED=${SAMPLE_SHARED:-$( [ -d shared/models ] && echo shared || echo ../shared)}
# engine_run MODE NAME ENV...: tpinfer on stories260K's sample prompts into $OUTDIR/engine-MODE-NAME.*
engine_run() {
    local mode=$1 name=$2 flag=()
    shift 2
    [ "$mode" = eager ] && flag=(--enforce-eager)
    rm -f "$OUTDIR/engine-$mode-$name.jsonl"
    env "$@" TPINFER_LOG=debug timeout 120 "$B/tpinfer" --model "$SHARED/models/stories260K-hf" --backend cuda \
        --dtype float32 "${flag[@]}" --input tests/sample_prompts.jsonl --output "$OUTDIR/engine-$mode-$name.jsonl" \
        >"$OUTDIR/engine-$mode-$name.log" 2>&1
    sort "$OUTDIR/engine-$mode-$name.jsonl" >"$OUTDIR/engine-$mode-$name.sorted" 2>/dev/null
}
# the same completions (ids) in A and B, logprobs within BOUND; prints the first difference
same_ids() {
    python3 - "$@" <<'PY'
import json, sys
a, b, bound = sys.argv[1], sys.argv[2], float(sys.argv[3])
load = lambda p: {json.loads(l)["id"]: json.loads(l) for l in open(p)}
A, B = load(a), load(b)
worst = 0.0
def walk(x, y, where):
    global worst
    if isinstance(x, dict) and isinstance(y, dict) and x.keys() == y.keys():
        for k in x: walk(x[k], y[k], where + "." + k)
    elif isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
        for k, (u, v) in enumerate(zip(x, y)): walk(u, v, "%s[%d]" % (where, k))
    elif where.endswith(".logprob") and isinstance(x, float) and isinstance(y, float):
        worst = max(worst, abs(x - y))
        if abs(x - y) > bound: sys.exit("%s: %r against %r" % (where, x, y))
    elif x != y: sys.exit("%s: %s against %s" % (where, json.dumps(x)[:80], json.dumps(y)[:80]))
walk(A, B, "")
print("%d requests; logprobs within %.1e" % (len(A), worst))
PY
}
if [ -d "$SHARED/models/stories260K-hf" ]; then
    for mode in eager graphs; do
        engine_run $mode host TPINFER_SAMPLE_ON_HOST=1
        engine_run $mode device-waiting TPINFER_SAMPLE_ON_HOST=0 TPINFER_OVERLAP=0
        engine_run $mode device TPINFER_SAMPLE_ON_HOST=0
        why=$(grep -m1 'cannot record\|error' "$OUTDIR"/engine-$mode-*.log | cut -c1-150)
        used=$(grep -m1 -o 'tokens chosen.*' "$OUTDIR/engine-$mode-device.log" | cut -c1-110)
        # each step waiting for the one before: the batches, so the logits, are the host's
        if [ -z "$why" ] && [ -s "$OUTDIR/engine-$mode-host.sorted" ] &&
            cmp -s "$OUTDIR/engine-$mode-host.sorted" "$OUTDIR/engine-$mode-device-waiting.sorted" &&
            grep -q "[1-9][0-9]* by its sample op" "$OUTDIR/engine-$mode-device-waiting.log"; then
            record "stories260K $mode: sample op = host sampler, waiting loop" "PASS (the same bytes)"
        else
            record "stories260K $mode: sample op = host sampler, waiting loop" "FAIL: ${why:-$(same_ids "$OUTDIR/engine-$mode-host.jsonl" "$OUTDIR/engine-$mode-device-waiting.jsonl" 0 2>&1 | tail -1 | cut -c1-150)}"
        fi
        # steps enqueued ahead: other batches (an ended row's step already enqueued), so
        # logits that differ in their last bits; the same tokens
        if r=$(same_ids "$OUTDIR/engine-$mode-host.jsonl" "$OUTDIR/engine-$mode-device.jsonl" 1e-4 2>&1) && [ -z "$why" ] &&
            grep -q "[1-9][0-9]* by its sample op" "$OUTDIR/engine-$mode-device.log"; then
            record "stories260K $mode: sample op = host sampler, steps ahead" "PASS ($r; $used)"
        else
            record "stories260K $mode: sample op = host sampler, steps ahead" "FAIL: ${why:-$(echo "$r" | tail -1 | cut -c1-150)}"
        fi
    done
else
    record "stories260K: sample op = host sampler" "not run: no $SHARED/models/stories260K-hf"
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
    ab_rows "ab" "$OUTDIR/ab.log"
fi
cat "$OUTDIR/gpu_sample.log"
[ -z "${SAMPLE_OP_BASE:-}" ] || cat "$OUTDIR/gpu_sample-ab.md"
print_results
