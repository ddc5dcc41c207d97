#!/bin/bash
# tests/gpu/gemv_early.sh: the GEMV's first weight chunks loaded before the wait for the kernel
# before (TPINFER_GEMV_EARLY, on by default) against the old way (=0, their first chunks into
# L2 only) and, on branch gemv-pipe, one row's next chunks asked for half a round at a time
# (TPINFER_GEMV_PIPE=1, off by default), on a GPU machine, in one call, from the repository root (the -dev packages in
# .gpu-deps/ as for tests/gpu/run.sh; GPU_PREBUILT=DIR for binaries built elsewhere):
#   1. build tpinfer, tests/check_backend_ops, bench/gpu_matmul; the matmul group as it is
#      (the one-row route) and under TPINFER_GEMV=all (every GEMV shape at 1-8 rows), with
#      the early loads and without (TPINFER_GEMV_EARLY=0 stays an option, so it is checked);
#   2. bench/ab_decode.sh on Llama-3.2-1B's shape (b1, b2) and Llama-3-8B's (b1): the default
#      and TPINFER_GEMV_EARLY=0 interleaved EARLY_REPEAT times (default 2), TPINFER_GEMV=0
#      once, then both at TPINFER_LOG=debug: the warm-up's timings of a batch-1 step through
#      the GEMV and through cuBLASLt, and its choice;
#   3. bench/gpu_matmul's one-row products both ways.
# Prints a table last; logs in $OUT (default /tmp/tpinfer-ge-out).
set -u
OUTDIR=${OUT:-/tmp/tpinfer-ge-out}
mkdir -p "$OUTDIR"
. tests/gpu/build.sh
gpu_build tpinfer tests/check_backend_ops bench/gpu_matmul
ops_check matmul 200 "one-row calls=one row, .*ok"
TPINFER_GEMV=all ops_check matmul 200
TPINFER_GEMV=all TPINFER_GEMV_EARLY=0 ops_check matmul 200
args=()
for _ in $(seq "${EARLY_REPEAT:-2}"); do args+=("TPINFER_GEMV_EARLY=0" "" "TPINFER_GEMV_PIPE=1"); done
args+=("TPINFER_GEMV=0" "TPINFER_LOG=debug" "TPINFER_LOG=debug TPINFER_GEMV_EARLY=0")
OUT=$OUTDIR/ab BENCH_SHAPES="llama-3.2-1b:2048:16:32:8:8192:128256 llama-3-8b:4096:32:32:8:14336:128256" \
    BENCH_RUNS=${BENCH_RUNS:-b1 b2} BENCH_RUNS_OTHER=${BENCH_RUNS_OTHER:-b1} BENCH_TPINFER=$B/tpinfer timeout 330 \
    bash bench/ab_decode.sh "${args[@]}" >"$OUTDIR/ab.log" 2>&1
while IFS= read -r line; do
    case $line in "| defaults"* | "| TPINFER_"*) record "ab" "$line" ;; esac
done <"$OUTDIR/ab.log"
n=${#args[@]}
mkdir -p "$OUTDIR/debug" && tar -C "$OUTDIR/debug" -xzf "$OUTDIR/ab/ab-logs.tar.gz" "ab-$((n - 1))" "ab-$n" 2>/dev/null
for log in "$OUTDIR"/debug/ab-*/llama-*.log; do
    [ -f "$log" ] || continue
    l=$(grep -o 'warm-up: a batch-1 step takes.*' "$log") && record "$(basename "$(dirname "$log")") $(basename "$log" .log)" "$l"
done
for v in "TPINFER_GEMV_EARLY=1" "TPINFER_GEMV_EARLY=0" "TPINFER_GEMV_PIPE=1"; do
    env "$v" timeout 60 "$B/bench/gpu_matmul" >"$OUTDIR/matmul-$v.log" 2>&1
    while IFS= read -r l; do record "gpu_matmul $v" "$l"; done < <(grep -E "^\| [a-z_+]+ \| 1 \|" "$OUTDIR/matmul-$v.log")
done
TPINFER_GEMV=all TPINFER_GEMV_PIPE=1 ops_check matmul 200
print_results
