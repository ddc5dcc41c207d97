#!/bin/bash
# bench/attn_variants.sh "VARIANT" ["VARIANT" ...]: decode attention under several environment
# settings, in one call on the GPU machine, from the repository root. A VARIANT is a
# space-separated list of NAME=VALUE pairs ("" for the defaults). Builds tpinfer,
# check_backend_ops and gpu_attention in build-gpu (with .gpu-deps, as tests/gpu/run.sh does),
# then per variant: the attention group of check_backend_ops against the CPU backend (PASS or
# FAIL), bench/gpu_attention at ATTN_SHAPES (default "128x192 128x256 128x1024 1x4096"; us a
# call, L2 flushed), and, unless ATTN_AB=0, the b128 benchmark through bench/ab_decode.sh
# (ATTN_AB_REPEAT times each, default 2, variants interleaved). Tables last, also in
# $OUT/attn-variants.md.
set -u
root=$(pwd)
OUTDIR=${OUT:-/tmp/tpinfer-attn-out}
mkdir -p "$OUTDIR"
export NCCL_NVLS_ENABLE=0
deps=$root/.gpu-deps/root
lib=$deps/usr/lib/x86_64-linux-gnu
export PKG_CONFIG_PATH=$lib/pkgconfig
export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
( set -e
  autoreconf -fi >/dev/null 2>&1
  mkdir -p build-gpu && cd build-gpu
  [ -f Makefile ] || ../configure -q --with-cuda CPPFLAGS="-I$deps/usr/include" LDFLAGS="-L$lib" >"$OUTDIR/configure.log" 2>&1
  make -j16 tpinfer tests/check_backend_ops bench/gpu_attention >"$OUTDIR/build.log" 2>&1
) || { tail -30 "$OUTDIR/build.log" "$OUTDIR/configure.log" 2>/dev/null; echo "build failed"; exit 1; }
B=$root/build-gpu
shapes=${ATTN_SHAPES:-128x192 128x256 128x1024 1x4096}
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader

head="| variant | attention group |"
sep="| --- | --- |"
for s in $shapes; do head+=" $s us (tight / graph) |"; sep+=" ---: |"; done
rows=
i=0
for v in "$@"; do
    i=$((i + 1))
    log=$OUTDIR/variant-$i.log
    ck=FAIL
    ( for kv in $v; do export "${kv?}"; done
      CK_FORK=no CK_RUN_CASE=attention timeout 300 "$B/tests/check_backend_ops" ) >"$log" 2>&1 && ck=PASS
    [ "$ck" = PASS ] || tail -5 "$log"
    ( for kv in $v; do export "${kv?}"; done
      timeout 300 "$B/bench/gpu_attention" 25 $shapes ) >"$OUTDIR/gpu_attention-$i.txt" 2>&1
    row="| ${v:-defaults} | $ck |"
    for s in $shapes; do # the flash kernel at max_pos = the context / = a graph's bound
        t=$(awk -F'|' -v s="$s" '{ split($1, a, " "); split($3, f, " "); split($4, g, " ");
                                   if (a[1] "x" a[2] == s) { print f[1] " / " g[1]; exit } }' "$OUTDIR/gpu_attention-$i.txt")
        row+=" ${t:-?} |"
    done
    rows+=$'\n'"$row"
    echo "== variant $i (${v:-defaults}): attention $ck"; cat "$OUTDIR/gpu_attention-$i.txt" | head -12
done
ab=
if [ "${ATTN_AB:-1}" = 1 ]; then
    args=()
    for r in $(seq "${ATTN_AB_REPEAT:-2}"); do args+=("$@"); done
    ab=$(OUT=$OUTDIR BENCH_RUNS=${BENCH_RUNS:-b128} BENCH_TPINFER=$B/tpinfer bash bench/ab_decode.sh "${args[@]}")
fi
{ echo "$head"; echo "$sep$rows"; echo; echo "$ab"; } | tee "$OUTDIR/attn-variants.md"
