#!/bin/bash
# tests/gpu/rope_attention.sh: qk_rope_store and attention in one kernel for decode steps
# (TPINFER_ROPE_ATTENTION) on a GPU machine, in one call, from the repository root (the -dev
# packages in .gpu-deps/ as for tests/gpu/run.sh):
#   1. build tpinfer, tests/check_backend_ops; the attention group (qk_rope_attention against
#      the CPU and bit for bit the two ops it replaces) and the errors group;
#   2. every 16-bit shared model (stories260K, tiny-llama3, tiny-mistral, tiny-qwen2; tiny-qwen3's
#      q/k norms keep the two ops) in bfloat16: the same completions, byte for byte, with
#      TPINFER_ROPE_ATTENTION=0 and without (decode steps as graphs, padded to their batch sizes);
#   3. compute-sanitizer memcheck and racecheck on tiny-llama3 in bfloat16 (GPU_RA_SAN=0 skips);
#      tests/prune_last.sh on cuda (tp 2 and pp 2 where two GPUs are: the first sampled step of
#      a run without the warm-up runs eagerly on every rank, a074d86's fix);
#   4. unless GPU_RA_AB=0: bench/ab_decode.sh b128 and b1 with TPINFER_ROPE_ATTENTION=0 and the
#      default, GPU_RA_REPEAT times (default 2), interleaved.
# Prints a table last; logs in $OUT (default /tmp/tpinfer-ra-out).
set -u
OUTDIR=${OUT:-/tmp/tpinfer-ra-out}
mkdir -p "$OUTDIR"
. tests/gpu/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
gpu_build tpinfer tests/check_backend_ops
T=$B/tpinfer
ops_check attention "qk_rope_attention cases bit-identical to the two ops=qk_rope_attn.bits.*ok"
ops_check errors

SHARED=${TPINFER_SHARED:-$root/../shared}
W=$(mktemp -d)
printf '%s\n' '{"id": "a", "prompt": "Once upon a time", "max_tokens": 40}' \
    '{"id": "b", "prompt": "Lily and Ben went to the park", "max_tokens": 33}' \
    '{"id": "c", "prompt": "The cat sat", "max_tokens": 25, "logprobs": 2}' \
    '{"id": "d", "prompt": "One day, a little girl named Sue", "max_tokens": 40, "n": 2}' \
    '{"id": "e", "prompt": "Tom", "max_tokens": 30}' >"$W/in.jsonl"
for model in stories260K-hf tiny-llama3 tiny-mistral tiny-qwen2; do
    ok=1
    for v in 0 1; do
        TPINFER_ROPE_ATTENTION=$v timeout 120 "$T" --model "$SHARED/models/$model" --dtype bfloat16 --input "$W/in.jsonl" \
            --output "$W/$model-$v.jsonl" 2>"$OUTDIR/$model-$v.err" || ok=0
        sed 's/"created":[0-9]*,//' "$W/$model-$v.jsonl" 2>/dev/null | sort >"$W/$model-$v.sorted"
    done
    if [ $ok = 1 ] && [ -s "$W/$model-1.sorted" ] && cmp -s "$W/$model-0.sorted" "$W/$model-1.sorted"; then
        record "$model bfloat16: fused = two ops" "PASS ($(wc -l <"$W/$model-1.sorted") completions, the same bytes)"
    else
        record "$model bfloat16: fused = two ops" "FAIL ($(tail -1 "$OUTDIR/$model-1.err" | cut -c1-150); $(diff "$W/$model-0.sorted" "$W/$model-1.sorted" | head -2 | cut -c1-120 | tr '\n' ' '))"
    fi
done

# the fused kernel under compute-sanitizer (its shared tile buffer and the rows it stores)
if [ "${GPU_RA_SAN:-1}" = 1 ] && command -v compute-sanitizer >/dev/null; then
    for tool in memcheck racecheck; do
        if timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 "$T" --model "$SHARED/models/tiny-llama3" \
            --dtype bfloat16 --input "$W/in.jsonl" --output "$W/san-$tool.jsonl" >"$OUTDIR/san-$tool.log" 2>&1; then
            record "compute-sanitizer $tool, tiny-llama3 bfloat16" "PASS ($(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUTDIR/san-$tool.log"))"
        else
            record "compute-sanitizer $tool, tiny-llama3 bfloat16" "FAIL: $(grep -m2 -E 'Error|Race|SUMMARY' "$OUTDIR/san-$tool.log" | cut -c1-200 | tr '\n' ' ')"
        fi
    done
fi

ngpu=$(nvidia-smi -L 2>/dev/null | grep -c GPU)
mpirun=no
[ "$ngpu" -ge 2 ] && mpirun=$(command -v mpirun || echo no)
if top_srcdir=$root top_builddir=$B TPINFER_SHARED=$SHARED PRUNE_BACKEND=cuda MPIRUN=$mpirun \
    timeout 300 bash tests/prune_last.sh >"$OUTDIR/prune-last.log" 2>&1; then
    record "tests/prune_last.sh on cuda" "PASS ($([ "$mpirun" = no ] && echo tp1 || echo "tp1, tp2, pp2"))"
else
    record "tests/prune_last.sh on cuda" "FAIL: $(log_tail "$OUTDIR/prune-last.log")"
fi

if [ "${GPU_RA_AB:-1}" = 1 ]; then
    args=()
    for _ in $(seq "${GPU_RA_REPEAT:-2}"); do args+=("TPINFER_ROPE_ATTENTION=0" ""); done
    OUT=$OUTDIR/ab BENCH_RUNS=${BENCH_RUNS:-b128 b1} BENCH_TPINFER=$T timeout 400 bash bench/ab_decode.sh "${args[@]}" \
        >"$OUTDIR/ab.log" 2>&1
    ab_rows "ab" "$OUTDIR/ab.log"
fi
rm -rf "$W"
print_results
