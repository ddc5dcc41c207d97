#!/bin/bash
# bench/step_parts.sh [PART ...]: where a decode step's time goes as the step runs. Times
# the step with every part (bench/ab_decode.sh), then with each PART left out in turn
# (TPINFER_BENCH_SKIP: embedding, norm, qkv, attention, o, gate_up, down, lm_head,
# allreduce, or several joined by commas), and prints what each costs: the step's forward
# time less the time without it. Unlike a profiler's kernel times (bench/profile_decode.sh,
# kernels one at a time), this counts only what the neighbouring kernels' overlap does not
# hide. Default PARTs: each part of a tp-1 step, then all the non-products together.
# Two measures of the cost: the forward time a step (tpinfer's average over every step of the
# loop, the prefill's among them) and the decode steps' ITL p50 (printed to 0.01 ms); on an
# H100's 8B at b1 they agreed to 0.01 ms for every part.
# STEP_PARTS_ENV: settings for every run (e.g. "TPINFER_GEMV=one", so that the warm-up's
# choice of products is the same in all); BENCH_RUNS (default b1), BENCH_SHAPES, AB_GRID and
# OUT as bench/ab_decode.sh takes them. Results: $OUT/step-parts.md.
set -u
OUTDIR=${OUT:-/tmp/tpinfer-step-parts}
mkdir -p "$OUTDIR"
export BENCH_RUNS=${BENCH_RUNS:-b1}
[ $# -gt 0 ] || set -- norm qkv attention o gate_up down lm_head embedding,norm,attention
base=${STEP_PARTS_ENV:-}
variants=("$base")
for p in "$@"; do variants+=("$base TPINFER_BENCH_SKIP=$p"); done
OUT=$OUTDIR bash "$(dirname "$0")/ab_decode.sh" "${variants[@]}" >"$OUTDIR/ab.log" 2>&1
# ab-results.md rows: | variant | run | ITL p50 | tok/s | forward ms / host ms |
awk -F'|' -v base="$base" '
    function trim(s) { gsub(/^ +| +$/, "", s); return s }
    /^####/ { exit }  # the per-operation tables of TPINFER_PROFILE_OPS runs follow
    /^\|/ && !/^\| variant/ && !/^\| ---/ {
        v = trim($2); r = trim($3); itl = trim($4); split(trim($6), f, " / "); fwd = f[1]
        part = v; sub(/.*TPINFER_BENCH_SKIP=/, "", part)
        if (part == v) { full[r] = fwd; full_itl[r] = itl; next }
        n++; rows[n] = r; parts[n] = part; fwds[n] = fwd; itls[n] = itl
    }
    END {
        print "| run | left out | ITL p50 ms | forward ms a step | the part costs ms (forward) | share of the step | the part costs ms (ITL) |"
        print "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
        for (r in full) printf "| %s | nothing%s | %s | %s | | | |\n", r, base == "" ? "" : " (" base ")", full_itl[r], full[r]
        for (i = 1; i <= n; i++) {
            r = rows[i]
            di = (full_itl[r] ~ /^[0-9.]+$/ && itls[i] ~ /^[0-9.]+$/) ? sprintf("%.2f", full_itl[r] - itls[i]) : "?"
            if (!(r in full) || full[r] + 0 <= 0 || fwds[i] !~ /^[0-9.]+$/) {
                printf "| %s | %s | %s | %s | ? | ? | %s |\n", r, parts[i], itls[i], fwds[i], di; continue
            }
            d = full[r] - fwds[i]
            printf "| %s | %s | %s | %s | %.3f | %.1f %% | %s |\n", r, parts[i], itls[i], fwds[i], d, 100 * d / full[r], di
        }
    }' "$OUTDIR/ab-results.md" >"$OUTDIR/step-parts.md" 2>/dev/null ||
    { tail -5 "$OUTDIR/ab.log"; exit 1; }
cat "$OUTDIR/step-parts.md"
