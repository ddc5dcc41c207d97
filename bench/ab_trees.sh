#!/bin/bash
# bench/ab_trees.sh DIR [DIR ...]: the same benchmark run by several source trees on one
# machine, in one call: machines of one kind differ by up to ~5 %, so two commits are only
# compared on the same card. Each DIR is a source tree (e.g. `git archive REV | tar -x -C DIR`
# made before the call: the GPU machine gets no .git); DIR's tpinfer is built in DIR/build
# (all at once), then the trees take turns, AB_ROUNDS times (default 2), each running
# bench/gpu_decode.sh (BENCH_RUNS, default b128; no HF baseline, no op benchmarks) with that
# tree's tpinfer. A table last: tree, round, generated tok/s, ITL p50, the first step's time.
# Run from the repository root (the script, the checkpoints and the -dev packages are this
# tree's). AB_BACKEND=cpu builds --without-cuda (how to try the script without a GPU).
set -u
[ $# -ge 1 ] || { echo "usage: bench/ab_trees.sh DIR [DIR ...]"; exit 2; }
OUTDIR=${OUT:-/tmp/tpinfer-ab-trees}
mkdir -p "$OUTDIR"
root=$(pwd)
deps=$root/.gpu-deps/root
lib=$deps/usr/lib/x86_64-linux-gnu
cflags=()
if [ -d "$deps" ]; then
    export PKG_CONFIG_PATH=$lib/pkgconfig LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    cflags=(CPPFLAGS="-I$deps/usr/include" LDFLAGS="-L$lib")
fi
with=--with-cuda
[ "${AB_BACKEND:-cuda}" = cpu ] && with=--without-cuda
export NCCL_NVLS_ENABLE=0
jobs=$(( $(nproc) / $# ))
[ "$jobs" -ge 1 ] || jobs=1

# ---- build every tree at once
i=0
for d in "$@"; do
    i=$((i + 1))
    ( cd "$d" && autoreconf -fi >/dev/null 2>&1 && mkdir -p build && cd build &&
      ../configure -q "$with" "${cflags[@]}" >"$OUTDIR/configure-$i.log" 2>&1 &&
      make -j"$jobs" tpinfer >"$OUTDIR/build-$i.log" 2>&1 ) &
done
wait
for d in "$@"; do
    [ -x "$d/build/tpinfer" ] || { echo "$d: build failed"; tail -20 "$OUTDIR"/build-*.log; exit 1; }
done
echo "built in $SECONDS s"

# ---- the runs, the trees in turn
table="| tree | round | run | generated tok/s | ITL p50 ms | first step ms |"$'\n'"| --- | ---: | --- | ---: | ---: | ---: |"
for r in $(seq 1 "${AB_ROUNDS:-2}"); do
    i=0
    for d in "$@"; do
        i=$((i + 1))
        o=$OUTDIR/t$i-r$r
        mkdir -p "$o"
        OUT=$o BENCH_TPINFER=$(cd "$d" && pwd)/build/tpinfer BENCH_RUNS=${BENCH_RUNS:-b128} BENCH_HF=0 BENCH_OPS=0 \
            BENCH_SWEEP= BENCH_RUNS_OTHER= TPINFER_LOG=${TPINFER_LOG:-debug} \
            BENCH_BACKEND=${AB_BACKEND:-cuda} bash bench/gpu_decode.sh 1 1 1 >"$o/stdout.log" 2>&1
        for log in "$o"/*-b*.log "$o"/*-o*.log "$o"/*-s*.log; do
            [ -f "$log" ] || continue
            tps=$(grep -o '[0-9.]* generated tok/s' "$log" | tail -1 | awk '{print $1}')
            itl=$(grep -o 'inter-token latency [0-9.]*' "$log" | awk '{print $3}')
            first=$(grep -o 'step 0 at [^;]*; forward [0-9.]*' "$log" | awk '{print $NF}')
            table+=$'\n'"| $d | $r | $(basename "$log" .log) | ${tps:-?} | ${itl:-?} | ${first:-?} |"
        done
    done
done
echo "$table" | tee "$OUTDIR/ab-trees.md"
