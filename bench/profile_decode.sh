#!/bin/bash
# bench/profile_decode.sh TPINFER MODEL PROMPTS SKIP COUNT [tpinfer options...]: where a
# decode step's GPU time goes. Runs tpinfer under Nsight Compute (ncu, --clock-control none:
# the card's clocks are left alone) timing COUNT kernels after the first SKIP (skip the
# prefill), then sums each kernel's time per decode step (a step has one argmax) and prints a
# table, largest first. Kernels run one at a time under ncu, so the sum is the GPU time of a
# step without the launch gaps; compare with the step time of an unprofiled run.
# PROFILE_FIRST_STEP=1: only the kernels up to the first argmax (with TPINFER_WARMUP=0 and
# SKIP 0, the first step: the prefill), and the first 40 of them in order (a layer's sequence).
# PROFILE_NCU_ARGS: more ncu options (e.g. "--cache-control none": caches as the step leaves them).
# PROFILE_STEPS=A:B: ncu captures only steps A to B of the run (TPINFER_PROFILE_STEPS, from 0:
# with b128 the prefill is step 0), SKIP and COUNT counting within them; ncu follows every
# launch of a run, so a run of many steps under ncu without it can take minutes before the
# first kernel it times (the tenth session lost a call that way).
set -u
T=$1 MODEL=$2 PROMPTS=$3 SKIP=$4 COUNT=$5
shift 5
OUTDIR=${OUT:-/tmp/tpinfer-profile}
mkdir -p "$OUTDIR"
csv=$OUTDIR/ncu-$(basename "$PROMPTS" .jsonl).csv
rm -f "$OUTDIR/profile-out.jsonl"*
range=()
[ -n "${PROFILE_STEPS:-}" ] && range=(--profile-from-start off) && export TPINFER_PROFILE_STEPS=$PROFILE_STEPS
ncu --clock-control none "${range[@]}" ${PROFILE_NCU_ARGS:-} --metrics gpu__time_duration.sum --csv --launch-skip "$SKIP" \
    --launch-count "$COUNT" "$T" --model "$MODEL" --input "$PROMPTS" --output "$OUTDIR/profile-out.jsonl" "$@" >"$csv" 2>"$csv.err" ||
    { tail -5 "$csv.err"; exit 1; }
python3 - "$csv" "${PROFILE_FIRST_STEP:-0}" <<'PY'
import csv, re, sys
from collections import defaultdict
rows = [l for l in open(sys.argv[1]) if l.startswith('"')]
first_step = sys.argv[2] == "1"
total, count = defaultdict(float), defaultdict(int)
seq = []
for r in csv.DictReader(rows):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    name = r["Kernel Name"]
    name = re.sub(r"^(void )?", "", name)
    name = re.split(r"[<(]", name)[0]
    v = float(r["Metric Value"].replace(",", ""))
    unit = r.get("Metric Unit", "ns")
    v *= {"ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}.get(unit, 1e-3)
    total[name] += v
    count[name] += 1
    seq.append((name, v))
    if first_step and name == "argmax_kernel":
        break
if first_step:
    print("the first %d kernels in order (us):" % min(40, len(seq)))
    for name, v in seq[:40]:
        print("  %9.1f  %s" % (v, name[:90]))
steps = max(1, count.get("argmax_kernel", 1))
all_us = sum(total.values())
print("%s profiled: %d (argmax kernels); GPU time per step: %.1f us" %
      ("steps (the first)" if first_step else "decode steps", steps, all_us / steps))
print("| kernel | launches per step | us per step | share |")
print("| --- | ---: | ---: | ---: |")
for k in sorted(total, key=total.get, reverse=True):
    print("| %s | %.1f | %.1f | %.1f%% |" % (k[:60], count[k] / steps, total[k] / steps, 100 * total[k] / all_us))
PY
