#!/bin/bash
# tests/gpu/custom_ar.sh BUILD_DIR [NP]: build tests/gpu/check_custom_ar in BUILD_DIR (a
# configured --with-cuda build of this tree, already built with make) and run it under
# mpirun on NP ranks (default 2, one GPU each, one host): the custom one-shot all-reduce
# against NCCL, bit for bit, eager and in a CUDA graph, then its time at 16 KiB.
# CHECK_CAR_MAX=BYTES (a power of two) tests the custom path up to that limit instead of 512 KiB.
# Exit status: the check's (0 pass, 1 mismatch, 2 no custom path on this machine).
set -u
B=${1:?usage: tests/gpu/custom_ar.sh BUILD_DIR [NP]}
NP=${2:-2}
src=$(cd "$(dirname "$0")/../.." && pwd)
make -C "$B" -s -f Makefile -f "$src/tests/gpu/custom_ar.mk" tests/gpu/check_custom_ar || exit 1
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
pass=(-x NCCL_NVLS_ENABLE)
for v in LD_LIBRARY_PATH TPINFER_PDL TPINFER_LOG CHECK_CAR_MAX; do [ -n "${!v:-}" ] && pass+=(-x "$v"); done
exec timeout 600 mpirun --allow-run-as-root "${pass[@]}" -np "$NP" "$B/tests/gpu/check_custom_ar"
