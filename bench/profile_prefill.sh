#!/bin/bash
# bench/profile_prefill.sh: what bounds the prefill attention kernel, under Nsight Compute, in
# one call on the GPU machine, from the repository root (the -dev packages in .gpu-deps/ as for
# tests/gpu/run.sh). Builds bench/gpu_attention, runs its prefill table once (1 timed run a
# shape) with ncu's full set on every attention_prefill_kernel launch, and leaves in $OUT
# (default /tmp/tpinfer-pp-out): prefill.ncu-rep, details.txt (ncu's details page: its rules
# say what stalls), stalls.csv (the stall reasons, cycles per issued instruction) and
# source.csv (SASS with its stall samples, where this ncu prints it). Prints a table last:
# per launch the kernel's shape, time, tensor pipe, issue slots, occupancy and top stalls.
# PP_FILTER: ncu's kernel filter (default regex:attention_prefill_kernel); PP_NCU_ARGS: more ncu
# options (e.g. "--launch-skip 44 --launch-count 1": the 1 x 8192 prompt's first launch, after
# 32 launches of the decode table and 4 of each earlier prefill shape).
set -u
OUTDIR=${OUT:-/tmp/tpinfer-pp-out}
mkdir -p "$OUTDIR"
. tests/gpu/build.sh
gpu_build bench/gpu_attention
rep=$OUTDIR/prefill
ncu --set full --import-source yes -k "${PP_FILTER:-regex:attention_prefill_kernel}" ${PP_NCU_ARGS:-} -f -o "$rep" \
    "$B/bench/gpu_attention" 1 >"$OUTDIR/ncu.log" 2>&1 || { tail -20 "$OUTDIR/ncu.log"; exit 1; }
ncu -i "$rep.ncu-rep" --page details --print-units base >"$OUTDIR/details.txt" 2>&1
stalls=barrier,long_scoreboard,short_scoreboard,mio_throttle,math_pipe_throttle,wait,not_selected,selected,dispatch_stall,lg_throttle,no_instruction,branch_resolving,drain,membar,imc_miss,misc,sleeping,tex_throttle
metrics=launch__grid_size,launch__registers_per_thread,gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active
metrics+=,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active
metrics+=,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum
for s in ${stalls//,/ }; do metrics+=,smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio; done
ncu -i "$rep.ncu-rep" --page raw --csv --print-units base --metrics "$metrics" >"$OUTDIR/stalls.csv" 2>"$OUTDIR/stalls.err"
ncu -i "$rep.ncu-rep" --page source --csv --print-source sass -c 1 >"$OUTDIR/source.csv" 2>/dev/null || true
python3 - "$OUTDIR/stalls.csv" <<'EOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
rows = [r for r in rows if r.get("ID", "").isdigit()]
def num(r, k):
    try: return float(r[k].replace(",", ""))
    except (KeyError, ValueError): return float("nan")
print("\n| launch | kernel | grid | regs | us | tensor % | issue % | warps % | smem conflicts / wavefronts | top stalls (cycles per issue) |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |")
for r in rows:
    name = r["Kernel Name"]
    rw = name.split(",")[-2:] if "," in name else [name]
    st = {k.split("stalled_")[1].split("_per")[0]: num(r, k) for k in r if "issue_stalled_" in k}
    top = ", ".join(f"{k} {v:.2f}" for k, v in sorted(st.items(), key=lambda kv: -kv[1])[:5])
    print(f"| {r['ID']} | <..{','.join(rw).strip()} | {r['launch__grid_size']} | {r['launch__registers_per_thread']} "
          f"| {num(r, 'gpu__time_duration.sum') / 1e3:.1f} "
          f"| {num(r, 'sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active'):.1f} "
          f"| {num(r, 'smsp__issue_active.avg.pct_of_peak_sustained_active'):.1f} "
          f"| {num(r, 'sm__warps_active.avg.pct_of_peak_sustained_active'):.1f} "
          f"| {r['l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum']} / {r['l1tex__data_pipe_lsu_wavefronts_mem_shared.sum']} | {top} |")
EOF
