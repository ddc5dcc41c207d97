#!/bin/bash
# tests/gpu/overlap.sh: steps enqueued ahead (the next decode step on the GPU before the host
# reads this one's tokens) on a GPU machine, in one call, from the repository root (the -dev
# packages in .gpu-deps/ as for tests/gpu/run.sh):
#   1. build tpinfer, tests/check_backend_ops; the elementwise group (take_ids and the two
#      download slots against the CPU), the argmax group (argmax_merge) and the errors group
#      (take_ids' fault, reported by download_wait) (GPU_OV_OPS=0: tpinfer alone, no groups);
#   2. tests/overlap.sh on the CUDA backend (TPINFER_OVERLAP=0 and the default give the same
#      completions: stop tokens, stop strings, lengths, n = 2, admissions, chunks, padding,
#      sampled requests; on a machine of 2 GPUs also tp 2, greedy equal to tp 1's, sampled
#      and under rules that read the output by both ranks' sample ops);
#   3. unless GPU_OV_AB=0: bench/ab_decode.sh b128 (and b1) with TPINFER_OVERLAP=0 and the
#      default, GPU_OV_REPEAT times (default 2), interleaved; then (GPU_OV_LONG=0 skips) b128
#      both ways at --max-model-len 8192 (long block tables);
#   4. unless GPU_OV_RULES=0: b128 both ways, GPU_OV_RULES_REPEAT times (default 1), with rules
#      that read the tokens not read yet, whose steps go ahead unsampled (the forward enqueued,
#      the sample op once the step before is read): a penalty (sampled) and guided JSON
#      (greedy, gpt2's 50k vocabulary from shared/tokenizers in a checkpoint of as many ids, a
#      schema of one free string).
# Prints a table last; logs in $OUT (default /tmp/tpinfer-ov-out).
set -u
OUTDIR=${OUT:-/tmp/tpinfer-ov-out}
mkdir -p "$OUTDIR"
. tests/gpu/build.sh
if [ "${GPU_OV_OPS:-1}" = 1 ]; then
    gpu_build tpinfer tests/check_backend_ops
    for group in elementwise argmax errors; do ops_check $group 300; done
else
    gpu_build tpinfer
fi
SHARED=${TPINFER_SHARED:-$root/../shared}
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c GPU)
tp2=0 mpirun=no
[ "$ngpu" -ge 2 ] && tp2=1 mpirun=$(command -v mpirun || echo no)
if top_srcdir=$root top_builddir=$B TPINFER_SHARED=$SHARED OVERLAP_BACKEND=cuda OVERLAP_TP2=$tp2 MPIRUN=$mpirun \
    timeout 300 bash tests/overlap.sh >"$OUTDIR/overlap.log" 2>&1; then
    record "tests/overlap.sh on cuda ($([ $tp2 = 1 ] && echo "tp 1 and tp 2" || echo "tp 1"))" PASS
else
    record "tests/overlap.sh on cuda" "FAIL rc $?: $(tail -3 "$OUTDIR/overlap.log" | tr '|\n' '/ ' | cut -c1-300)"
fi
if [ "${GPU_OV_AB:-1}" = 1 ]; then
    args=()
    for _ in $(seq "${GPU_OV_REPEAT:-2}"); do args+=("TPINFER_OVERLAP=0" ""); done
    OUT=$OUTDIR/ab BENCH_RUNS=${BENCH_RUNS:-b128 b1} BENCH_TPINFER=$B/tpinfer timeout 500 bash bench/ab_decode.sh "${args[@]}" \
        >"$OUTDIR/ab.log" 2>&1
    ab_rows "ab" "$OUTDIR/ab.log"
    # and b128 at --max-model-len 8192 (the block table of 512 columns a sequence: 256 KiB of
    # a step's upload at batch 128, which waited for the stream before the upload buffers grew)
    if [ "${GPU_OV_LONG:-1}" = 1 ]; then
        OUT=$OUTDIR/ab-long BENCH_RUNS=b128 BENCH_ARGS="--max-model-len 8192" BENCH_TPINFER=$B/tpinfer timeout 300 \
            bash bench/ab_decode.sh "TPINFER_OVERLAP=0" "" >"$OUTDIR/ab-long.log" 2>&1
        ab_rows "ab, --max-model-len 8192" "$OUTDIR/ab-long.log"
    fi
fi
if [ "${GPU_OV_RULES:-1}" = 1 ]; then
    ab_rules() { # ab_rules NAME: bench/ab_decode.sh b128 both ways under the exported BENCH_REQUEST
        local args=()
        for _ in $(seq "${GPU_OV_RULES_REPEAT:-1}"); do args+=("TPINFER_OVERLAP=0" ""); done
        OUT=$OUTDIR/ab-$1 BENCH_RUNS=b128 BENCH_TPINFER=$B/tpinfer timeout 400 bash bench/ab_decode.sh "${args[@]}" \
            >"$OUTDIR/ab-$1.log" 2>&1
        ab_rows "ab, $1" "$OUTDIR/ab-$1.log"
    }
    BENCH_REQUEST='{"temperature": 0.8, "seed": 1, "repetition_penalty": 1.1, "frequency_penalty": 0.2}' ab_rules penalty
    # the checkpoint's vocabulary gpt2's: with more ids than the tokenizer has (the default
    # 128,256), every guided row's allowed list would hold its ~50k ids every step
    BENCH_SHAPES=llama-3-8b:4096:32:32:8:14336:50257 BENCH_TOKENIZER=$SHARED/tokenizers/gpt2 \
        BENCH_REQUEST='{"ignore_eos": false, "guided_json": {"type": "object",
        "properties": {"text": {"type": "string"}}, "required": ["text"]}}' ab_rules json
fi
print_results
