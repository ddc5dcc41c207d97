#!/bin/bash
# tests/gpu/prefix_cache.sh: prefix caching on a GPU machine, in one call, from the repository
# root (the -dev packages in .gpu-deps/ as for tests/gpu/run.sh):
#   1. build tpinfer; tests/prefix_cache.sh on the CUDA backend in float32 (the cache on and
#      off give the same tokens) over the shared models ($TPINFER_SHARED);
#   2. bench/ab_decode.sh, the cache on (the default) and off (BENCH_ARGS=--no-enable-prefix-caching)
#      on the 8B shape: BENCH_RUNS, default s1024x1024x128x128 (1024 prompts sharing a 1024-token
#      system prompt, 128 of their own, 128 new tokens) and b128 o1024x128x128 (no prefix in
#      common: what the cache's books cost where it finds nothing).
# Prints a table last; logs in $OUT (default /tmp/tpinfer-pc-out).
set -u
OUTDIR=${OUT:-/tmp/tpinfer-pc-out}
mkdir -p "$OUTDIR"
. tests/gpu/build.sh
gpu_build tpinfer
SHARED=${TPINFER_SHARED:-$root/../shared}
if top_srcdir=$root top_builddir=$B TPINFER_SHARED=$SHARED PREFIX_BACKEND=cuda MPIRUN=no PYTHON3=python3 \
    timeout 300 bash tests/prefix_cache.sh >"$OUTDIR/prefix-cache.log" 2>&1; then
    record "tests/prefix_cache.sh, cuda f32 (tokens equal, cache on / off)" PASS
else
    record "tests/prefix_cache.sh, cuda f32" "FAIL: $(log_tail "$OUTDIR/prefix-cache.log" 3)"
fi
OUT=$OUTDIR/ab BENCH_RUNS=${BENCH_RUNS:-s1024x1024x128x128 b128 o1024x128x128} BENCH_TPINFER=$B/tpinfer \
    timeout "${PC_AB_TIMEOUT:-420}" bash bench/ab_decode.sh "" "BENCH_ARGS=--no-enable-prefix-caching" >"$OUTDIR/ab.log" 2>&1
ab_rows "ab" "$OUTDIR/ab.log"
tar -xzOf "$OUTDIR/ab/ab-logs.tar.gz" 2>/dev/null | grep -h "prefix cache" | head -3
print_results
