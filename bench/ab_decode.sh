#!/bin/bash
# bench/ab_decode.sh "VARIANT" ["VARIANT" ...]: the same decode benchmark under several
# environment settings, in one call on the GPU machine. A VARIANT is a space-separated list
# of NAME=VALUE pairs (e.g. "TPINFER_PDL=0"; "" for the defaults) exported to tpinfer. Each
# runs bench/gpu_decode.sh (TP PP DP from AB_GRID, default "1 1 1"; BENCH_RUNS default
# "b1 b128"; no HF baseline, no op benchmarks) into $OUT/ab-N/, then one table compares
# them: ITL p50, generated tok/s over the run, and tpinfer's "host work per step" line.
# The logs are packed into $OUT/ab-logs.tar.gz (the device tool returns few files).
set -u
OUTDIR=${OUT:-/tmp/tpinfer-ab-out}
mkdir -p "$OUTDIR"
read -r TP PP DP <<<"${AB_GRID:-1 1 1}"
export NCCL_NVLS_ENABLE=0
export BENCH_RUNS=${BENCH_RUNS:-b1 b128} BENCH_SWEEP=${BENCH_SWEEP-} BENCH_HF=0 BENCH_OPS=${BENCH_OPS:-0}
export BENCH_SHAPES=${BENCH_SHAPES:-llama-3-8b:4096:32:32:8:14336:128256}
table="| variant | run | ITL p50 ms | generated tok/s | forward ms / host ms per step |"$'\n'"| --- | --- | ---: | ---: | --- |"
i=0
profiles=
for v in "$@"; do
    i=$((i + 1))
    d=$OUTDIR/ab-$i
    mkdir -p "$d"
    ( for kv in $v; do export "${kv?}"; done
      OUT=$d bash bench/gpu_decode.sh "$TP" "$PP" "$DP" >"$d/stdout.log" 2>&1 )
    for log in "$d"/llama-*-b*.log "$d"/llama-*-o*.log "$d"/llama-*-s*.log; do
        [ -f "$log" ] || continue
        run=$(basename "$log" .log)
        itl=$(grep -o 'inter-token latency [0-9.]*' "$log" | awk '{print $3}')
        tps=$(grep -o '[0-9.]* generated tok/s' "$log" | tail -1 | awk '{print $1}')
        host=$(grep -o 'forward steps ([0-9.]* ms each[^;]*; [0-9.]* ms of host' "$log" |
               sed 's/forward steps (\([0-9.]*\) ms each[^;]*; \([0-9.]*\) ms of host/\1 \/ \2/')
        table+=$'\n'"| ${v:-defaults} | ${run#llama-3-8b-} | ${itl:-?} | ${tps:-?} | ${host:-?} |"
        # TPINFER_PROFILE_OPS=1: the per-operation table, its 16 largest rows
        if grep -q "TPINFER_PROFILE_OPS: GPU time" "$log"; then
            profiles+=$'\n'"#### ${v} ${run#llama-3-8b-}"$'\n'"$(grep -A17 'TPINFER_PROFILE_OPS: GPU time' "$log" | sed 's/^.*info: //')"
        fi
    done
done
table+=${profiles:-}
tar -C "$OUTDIR" -czf "$OUTDIR/ab-logs.tar.gz" $(cd "$OUTDIR" && ls -d ab-*/ 2>/dev/null) 2>/dev/null &&
    rm -rf "$OUTDIR"/ab-*/
echo "$table" | tee "$OUTDIR/ab-results.md"
