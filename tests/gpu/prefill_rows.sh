#!/bin/bash
# tests/gpu/prefill_rows.sh: the prefill attention kernel with warps of 32 query rows
# (TPINFER_ATTN_PF_ROWS=2) on a GPU machine, in one call, from the repository root (the -dev
# packages in .gpu-deps/ as for tests/gpu/run.sh):
#   1. build tpinfer, tests/check_backend_ops, bench/gpu_attention; the attention group (every
#      prefill case against the CPU with the kernel on, off and with warps of 32 rows) and the
#      errors group (the prefill faults the same three ways);
#   2. bench/gpu_attention 15 (its prefill table: flash, prefill, prefill with warps of 32 rows;
#      L2 flushed; prints the decode table first);
#   3. unless GPU_PR_AB=0: bench/ab_decode.sh with BENCH_RUNS (default "b128 o256x2048x128")
#      for the default and TPINFER_ATTN_PF_ROWS=2, GPU_PR_REPEAT times (default 1), interleaved.
# Prints a table last; logs in $OUT (default /tmp/tpinfer-pr-out).
set -u
OUTDIR=${OUT:-/tmp/tpinfer-pr-out}
mkdir -p "$OUTDIR"
. tests/gpu/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
gpu_build tpinfer tests/check_backend_ops bench/gpu_attention
for group in attention errors; do
    if CK_FORK=no CK_RUN_CASE=$group timeout 400 "$B/tests/check_backend_ops" >"$OUTDIR/ops-$group.log" 2>&1; then
        record "check_backend_ops $group" "PASS ($(grep -c 'rows 2.*ok' "$OUTDIR/ops-$group.log") checks with warps of 32 rows)"
    else
        record "check_backend_ops $group" "FAIL: $(grep -m2 -E 'Failure|Error|error|FAIL' "$OUTDIR/ops-$group.log" | tr '|' '/' | cut -c1-200)"
    fi
done
if timeout 240 "$B/bench/gpu_attention" 15 >"$OUTDIR/gpu_attention.log" 2>&1; then
    while IFS= read -r line; do record "prefill (batch, context: flash / prefill / rows 2)" "$line"; done \
        < <(sed -n '/^# prefill/,$p' "$OUTDIR/gpu_attention.log" | grep -E '^ *[0-9]+ +[0-9]+ \|')
else
    record "bench/gpu_attention" "FAIL: $(tail -2 "$OUTDIR/gpu_attention.log" | tr '|\n' '/ ' | cut -c1-200)"
fi
if [ "${GPU_PR_AB:-1}" = 1 ]; then
    args=()
    for _ in $(seq "${GPU_PR_REPEAT:-1}"); do args+=("" "TPINFER_ATTN_PF_ROWS=2"); done
    OUT=$OUTDIR/ab BENCH_RUNS=${BENCH_RUNS:-b128 o256x2048x128} BENCH_TPINFER=$B/tpinfer timeout 400 \
        bash bench/ab_decode.sh "${args[@]}" >"$OUTDIR/ab.log" 2>&1
    while IFS= read -r line; do
        case $line in "| defaults"* | "| TPINFER_ATTN"*) record "ab" "$line" ;; esac
    done <"$OUTDIR/ab.log"
fi
print_results
