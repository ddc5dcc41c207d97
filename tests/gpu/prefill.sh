#!/bin/bash
# tests/gpu/prefill.sh: the prefill attention kernel on a GPU machine, in one call, from the
# repository root (the -dev packages in .gpu-deps/ as for tests/gpu/run.sh):
#   1. build tpinfer, tests/check_backend_ops, bench/gpu_attention; the attention group (every
#      prefill case against the CPU with the kernel on and off) and the errors group (the
#      prefill faults);
#   2. bench/gpu_attention 15 (its prefill table: the flash kernel alone against the prefill
#      kernel; L2 flushed; prints the decode table first);
#   3. unless GPU_PF_AB=0: bench/ab_decode.sh with BENCH_RUNS (default "b128 o256x2048x128")
#      for the variants in GPU_PF_VARIANTS (default: the defaults alone; e.g. '"" "X=1"').
# Prints a table last (exit 1 if a row failed); logs in $OUT (default /tmp/tpinfer-pf-out).
set -u
OUTDIR=${OUT:-/tmp/tpinfer-pf-out}
mkdir -p "$OUTDIR"
. tests/gpu/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
gpu_build tpinfer tests/check_backend_ops bench/gpu_attention
for group in attention errors; do ops_check $group "prefill checks=prefill.*ok"; done
if timeout 240 "$B/bench/gpu_attention" 15 >"$OUTDIR/gpu_attention.log" 2>&1; then
    while IFS= read -r line; do record "prefill (batch, context: flash / prefill)" "$line"; done \
        < <(sed -n '/^# prefill/,$p' "$OUTDIR/gpu_attention.log" | grep -E '^ *[0-9]+ +[0-9]+ \|')
else
    record "bench/gpu_attention" "FAIL: $(log_tail "$OUTDIR/gpu_attention.log")"
fi
if [ "${GPU_PF_AB:-1}" = 1 ]; then
    eval "args=(${GPU_PF_VARIANTS:-\"\"})"
    OUT=$OUTDIR/ab BENCH_RUNS=${BENCH_RUNS:-b128 o256x2048x128} BENCH_TPINFER=$B/tpinfer timeout 400 \
        bash bench/ab_decode.sh "${args[@]}" >"$OUTDIR/ab.log" 2>&1
    ab_rows "ab" "$OUTDIR/ab.log"
fi
print_results
! printf '%s\n' "${results[@]}" | grep -q "FAIL"
