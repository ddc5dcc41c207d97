#!/bin/bash
# tests/gpu/run.sh [TP [PP [DP]]]: the CUDA backend's correctness on a GPU machine, in one call.
# Builds tpinfer there (with the -dev packages that machine lacks, gathered here by
# ../shared/tools/gpu-deps into .gpu-deps/), then:
#   1. every backend operation against the CPU backend (tests/check_backend_ops);
#   2. every model of shared/models at the grid: --dtype float32 greedy ids equal to
#      Hugging Face's; bfloat16 greedy ids equal up to the first step whose reference
#      margin is under 0.1 (GPU_BF16_MARGIN; Hugging Face's own bf16 run parts from its
#      float32 reference at margins of 0.05-0.29 on these prompts, hf-bf16.md); stories260K's 128-token story exact in float32 and its first
#      64 tokens exact in bfloat16;
#      the tensor-core attention kernels (head_dim 64 and 128, which no shared model has) on
#      generated bf16 models against the CPU backend's float32 run: prefill logits and the
#      greedy steps' (up to the first id that differs) within GPU_TC_BOUND, ids up to the first
#      step whose reference margin is under twice that;
#   3. compute-sanitizer memcheck and racecheck on a tiny-model run, and on the head_dim 128
#      model's prompts (the prefill and tensor-core decode kernels; racecheck on one prompt).
# Prints a pass/fail table last and leaves it in $OUT/gpu-results.md.
# Run from the repository root: the shared folder is ./shared or ../shared.
set -u
TP=${1:-1}
PP=${2:-1}
DP=${3:-1}
NP=$((TP * PP * DP))
G="tp$TP pp$PP dp$DP"
OUTDIR=${OUT:-/tmp/tpinfer-gpu-out}
W=${GPU_WORK:-/tmp/tpinfer-gpu-work} # outputs and logit dumps; $OUTDIR keeps logs and results
mkdir -p "$OUTDIR" "$W"
root=$(pwd)
. "$root/bench/tree_commit.sh"
commit=$(tree_commit "$root")
SHARED=${TPINFER_SHARED:-$( [ -d shared/models ] && echo "$root/shared" || echo "$root/../shared")}
MODELS=$SHARED/models
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
results=()
record() { results+=("| $1 | $2 | $3 |"); echo "== $1: $2 ($3)"; }

# ---- build
deps=$root/.gpu-deps/root
lib=$deps/usr/lib/x86_64-linux-gnu
export PKG_CONFIG_PATH=$lib/pkgconfig
export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
B=$root/build-gpu
if [ -n "${GPU_PREBUILT:-}" ]; then
    # a build made elsewhere with --with-cuda for this machine (tests/gpu/build.sh says how)
    B=$root/$GPU_PREBUILT
    for t in tpinfer tests/check_backend_ops tests/compare_logits; do
        [ -x "$B/$t" ] || { echo "GPU_PREBUILT=$GPU_PREBUILT has no $t"; exit 1; }
    done
else
mkdir -p build-gpu
( set -e
  autoreconf -fi >/dev/null 2>&1
  cd build-gpu
  ../configure -q --with-cuda CPPFLAGS="-I$deps/usr/include" LDFLAGS="-L$lib" >"$OUTDIR/configure.log" 2>&1
  make -j16 >"$OUTDIR/build.log" 2>&1
  make -j16 tests/check_backend_ops tests/compare_logits >>"$OUTDIR/build.log" 2>&1
) || { tail -30 "$OUTDIR/build.log" "$OUTDIR/configure.log" 2>/dev/null; echo "build failed"; exit 1; }
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUTDIR/gpu.txt"
[ "$NP" -gt 1 ] && nvidia-smi topo -m | tee "$OUTDIR/topo.txt"
launch() {
    if [ "$NP" -gt 1 ]; then
        local x=(-x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH) v
        for v in TPINFER_SAMPLE_ON_HOST TPINFER_LOG TPINFER_OVERLAP; do [ -n "${!v:-}" ] && x+=(-x "$v"); done
        mpirun --allow-run-as-root "${x[@]}" -np "$NP" "$@"
    else
        "$@"
    fi
}

# ---- 1. operations against the CPU backend
if [ "${GPU_OPS:-1}" != 1 ]; then
    : # GPU_OPS=0: the operations were checked by an earlier run of this call
elif CK_FORK=no "$B/tests/check_backend_ops" >"$OUTDIR/ops.log" 2>&1; then
    record "backend ops vs CPU (f32, bf16, f16)" PASS "$(grep -c . "$OUTDIR/ops.log") lines"
else
    record "backend ops vs CPU (f32, bf16, f16)" FAIL "see ops.log"; tail -20 "$OUTDIR/ops.log"
fi

# ---- 2. models against Hugging Face (GPU_MODELS=0 skips; GPU_MODELS=variants runs the last
# two kinds alone); then the config variants (tests/data/variants: shared models with sliding
# windows, YaRN, Granite's multipliers, Gemma's layouts, multimodal checkpoints' text models;
# tests/variant_model.py) and tiny-mistral in Phi-3's fused layout (tests/fuse_checkpoint.py)
for dir in "$MODELS"/*/ "$root"/tests/data/variants/*.safetensors phi3-of-tiny-mistral; do
    [ "${GPU_MODELS:-1}" != 0 ] || break
    [ "${GPU_MODELS:-1}" = variants ] && [ "${dir%/}" != "$dir" ] && continue
    ref=$dir/reference/logits.safetensors
    if [ "${dir%.safetensors}" != "$dir" ]; then
        ref=$dir
        dir=$W/$(basename "$ref" .safetensors)
        rm -rf "$dir"
        python3 "$root/tests/variant_model.py" "$ref" "$MODELS" "$dir" >/dev/null || continue
    elif [ "$dir" = phi3-of-tiny-mistral ]; then
        ref=$MODELS/tiny-mistral/reference/logits.safetensors
        dir=$W/$dir
        rm -rf "$dir"
        python3 "$root/tests/fuse_checkpoint.py" "$MODELS/tiny-mistral" "$dir" || continue
    fi
    [ -f "$ref" ] || continue
    name=$(basename "$dir")
    if ! launch "$B/tpinfer" --model "$dir" --dry-run --tp "$TP" --pp "$PP" >/dev/null 2>&1; then
        record "$name $G" SKIP "shapes do not split"; continue
    fi
    "$B/tests/compare_logits" --make-input "$ref" "$W/$name.jsonl"
    for dt in float32 bfloat16; do
        d=$W/$name-$dt
        rm -rf "$d" "$d.jsonl"
        if ! launch "$B/tpinfer" --model "$dir" --backend cuda --dtype $dt --tp "$TP" --pp "$PP" \
            --input "$W/$name.jsonl" --output "$d.jsonl" --dump-logits "$d" >"$d.log" 2>&1; then
            record "$name $dt $G" FAIL "tpinfer failed: $(grep -m1 error "$d.log")"; continue
        fi
        if [ $dt = float32 ]; then args="1e-2 1e-9"; else args="inf ${GPU_BF16_MARGIN:-0.1}"; fi # bf16: logits reported
        "$B/tests/compare_logits" "$ref" "$d" $args >"$d.cmp" 2>&1
        rc=$?
        cp "$d.cmp" "$OUTDIR/"
        if [ $rc -eq 0 ]; then
            record "$name $dt $G" PASS "$(awk -F'greedy steps max\\|d\\| ' '{split($2,a,","); if (a[1]+0>m) m=a[1]+0} END {print "step max|d| " m}' "$d.cmp")"
        else
            record "$name $dt $G" FAIL "$(grep -m1 FAIL "$d.cmp")"
        fi
    done
done

# the tensor-core attention kernels (prefill and decode; no shared model has the head_dim
# 64 or 128 they need) on generated bf16 models against the CPU backend (float32 math: its
# dumps as the reference): prompts of 16-200 tokens, whole and in prefill chunks of 64 (a
# chunk's earlier keys read from the paged cache); prefill logits and the greedy steps' (up
# to the first id that differs) within GPU_TC_BOUND (default 1; logits span about +-20, so a
# wrong attention shows; bf16 against float32 measured 0.2-0.4 at head_dim 64, 0.4-0.92 at
# 128, the wider hidden size), ids equal up to the first step whose CPU margin is under twice
# the bound: where every logit is within the bound, only a top two closer than that can swap
# (a margin of 0.05 failed on ids that parted at margins the bf16 error reaches).
# GPU_TC=0 skips (and the sanitizer runs on the head_dim 128 model below). "128 window 40": the
# head_dim 128 model as a Mistral with a sliding window of 40 keys (every layer; the prompts
# are longer, so prefill tiles, decode splits and chunks start inside the window). "128 gemma2":
# it converted to Gemma 2's layout (tests/gemma_checkpoint.py) with caps that bite (scores at
# 2, logits at 10) and its first layer sliding over 40 keys: the soft cap in every fast kernel.
tc_model=
for hd in 64 128 "128 window 40" "128 gemma2"; do
    [ "${GPU_TC:-1}" = 1 ] || break
    window=${hd#* window }; [ "$window" = "$hd" ] && window=
    gemma=; [ "${hd#* }" = gemma2 ] && gemma=1
    hd=${hd%% *}
    m=$W/tc-hd$hd${window:+-w$window}${gemma:+-gemma2}
    rm -rf "$m" "$m-src" "$m-cpu" "$m-cpu.jsonl"* "$m-ref.safetensors"
    gen=$m; [ -n "$gemma" ] && gen=$m-src # Gemma's: converted from it below
    if ! python3 "$root/tests/gen_tiny_model.py" "$gen" --dtype bfloat16 --hidden $((4 * hd)) \
        --heads 4 --kv-heads 2 --layers 2 --intermediate 1024 --prompts "$m.jsonl" >"$m-gen.log" 2>&1; then
        record "tensor-core attention, head_dim $hd $G" FAIL "gen_tiny_model.py: $(tail -1 "$m-gen.log")"; continue
    fi
    if [ -n "$window" ]; then
        python3 -c 'import json, sys; p = sys.argv[1]; c = json.load(open(p))
c.update(architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=int(sys.argv[2]))
json.dump(c, open(p, "w"))' "$m/config.json" "$window"
        hd="$hd, window $window"
    fi
    if [ -n "$gemma" ]; then
        if ! python3 -c 'import json, sys; p = sys.argv[1]; c = json.load(open(p))
c.setdefault("head_dim", c["hidden_size"] // c["num_attention_heads"])
json.dump(c, open(p, "w"))' "$m-src/config.json" ||
            ! python3 "$root/tests/gemma_checkpoint.py" "$m-src" "$m" gemma2 >>"$m-gen.log" 2>&1 ||
            ! python3 -c 'import json, sys; p = sys.argv[1]; c = json.load(open(p))
c.update(attn_logit_softcapping=2.0, final_logit_softcapping=10.0, sliding_window=40, layer_types=["sliding_attention", "full_attention"])
json.dump(c, open(p, "w"))' "$m/config.json"; then
            record "tensor-core attention, head_dim $hd, Gemma 2 $G" FAIL "gemma_checkpoint.py: $(tail -1 "$m-gen.log")"; continue
        fi
        hd="$hd, Gemma 2 caps and window"
    fi
    if ! launch "$B/tpinfer" --model "$m" --dry-run --tp "$TP" --pp "$PP" >/dev/null 2>&1; then
        record "tensor-core attention, head_dim $hd $G" SKIP "4 heads, 2 KV heads, 2 layers do not split"; continue
    fi
    "$B/tpinfer" --model "$m" --backend cpu --dtype float32 --input "$m.jsonl" --output "$m-cpu.jsonl" \
        --dump-logits "$m-cpu" >"$m-cpu.log" 2>&1 &&
        "$B/tests/compare_logits" --dump-ref "$m-cpu" "$m-ref.safetensors" ||
        { record "tensor-core attention, head_dim $hd $G" FAIL "the CPU reference run failed"; continue; }
    [ "$hd" = 128 ] && tc_model=$m
    for how in whole:"" chunks:"--max-num-batched-tokens 64"; do
        d=$m-${how%%:*}
        rm -rf "$d" "$d.jsonl"*
        # shellcheck disable=SC2086 # the chunk flags split on purpose
        if ! launch "$B/tpinfer" --model "$m" --backend cuda --dtype bfloat16 --tp "$TP" --pp "$PP" \
            --input "$m.jsonl" --output "$d.jsonl" --dump-logits "$d" ${how#*:} >"$d.log" 2>&1; then
            record "tensor-core attention, head_dim $hd, ${how%%:*} $G" FAIL "tpinfer failed: $(grep -m1 error "$d.log")"
            continue
        fi
        "$B/tests/compare_logits" "$m-ref.safetensors" "$d" "${GPU_TC_BOUND:-1}" \
            "$(awk -v b="${GPU_TC_BOUND:-1}" 'BEGIN {print 2 * b}')" >"$d.cmp" 2>&1
        rc=$?
        cp "$d.cmp" "$OUTDIR/"
        worst=$(awk -F'max\\|d\\| ' '{for (i = 2; i <= NF; i++) {split($i, a, ","); v = a[1] + 0; if (v > m) m = v}} END {print m + 0}' "$d.cmp")
        if [ $rc -eq 0 ]; then
            record "tensor-core attention, head_dim $hd, ${how%%:*} $G" PASS "logits max|d| $worst; ids as far as the margin"
        else
            record "tensor-core attention, head_dim $hd, ${how%%:*} $G" FAIL "bound ${GPU_TC_BOUND:-1}: $(grep -m1 FAIL "$d.cmp")"
        fi
    done
done

# stories260K: the story from the text, 128 tokens exact in f32, 64 in bf16
st=$MODELS/stories260K-hf
printf 'Once upon a time\n' >"$OUTDIR/story.txt"
want=$(python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["greedy"][0]["new_ids"]))' "$st/reference/tokens.json")
for dt in float32:128 bfloat16:64; do
    [ "${GPU_MODELS:-1}" = 1 ] || break
    t=${dt%%:*}; n=${dt##*:}
    rm -f "$OUTDIR/story-$t.jsonl"
    launch "$B/tpinfer" --model "$st" --backend cuda --dtype "$t" --tp "$TP" --pp "$PP" --input "$OUTDIR/story.txt" \
        --max-tokens 128 --output "$OUTDIR/story-$t.jsonl" >/dev/null 2>&1
    if python3 -c 'import json,sys; w=json.loads(sys.argv[2]); g=json.loads(open(sys.argv[1]).readline())["token_ids"]; n=int(sys.argv[3]); assert g[:n]==w[:n], (g[:n], w[:n])' \
        "$OUTDIR/story-$t.jsonl" "$want" "$n" 2>"$OUTDIR/story-$t.err"; then
        record "stories260K story $t $G" PASS "first $n tokens exact"
    else
        record "stories260K story $t $G" FAIL "$(tail -1 "$OUTDIR/story-$t.err" | cut -c1-120)"
    fi
done

# sampling on the device (the sample op) against the host sampler: the same completions and
# logprobs from the same logits (float32), in eager steps and in decode steps replayed as CUDA
# graphs (the same padded batch on both sides, so the same logits; none may fall back to eager).
# Each step waits for the one before (TPINFER_OVERLAP=0): steps enqueued ahead, which only
# the device's sampling allows, give other batches (an ended row's next step is enqueued
# already), whose logits differ in their last bits; tests/gpu/sample.sh compares those.
for mode in eager graphs; do
    [ "${GPU_MODELS:-1}" = 1 ] || break
    flag=(); [ $mode = eager ] && flag=(--enforce-eager)
    for h in 0 1; do
        rm -f "$W/sample-$mode-$h.jsonl"
        TPINFER_OVERLAP=0 TPINFER_SAMPLE_ON_HOST=$h TPINFER_LOG=debug launch "$B/tpinfer" --model "$st" --backend cuda --dtype float32 \
            --tp "$TP" --pp "$PP" "${flag[@]}" --input "$root/tests/sample_prompts.jsonl" \
            --output "$W/sample-$mode-$h.jsonl" >"$OUTDIR/sample-$mode-$h.log" 2>&1
        # at dp > 1 the replicas' records interleave in any order: compare them sorted
        sort "$W/sample-$mode-$h.jsonl" >"$W/sample-$mode-$h.sorted" 2>/dev/null
    done
    if [ -s "$W/sample-$mode-0.sorted" ] && cmp -s "$W/sample-$mode-0.sorted" "$W/sample-$mode-1.sorted" &&
        grep -q "[1-9][0-9]* by its sample op" "$OUTDIR/sample-$mode-0.log" &&
        ! grep -q "cannot record" "$OUTDIR/sample-$mode-0.log"; then
        record "sampling on the device = host sampler, $mode $G" PASS "$(grep -m1 -o 'tokens chosen.*' "$OUTDIR/sample-$mode-0.log")"
    else
        record "sampling on the device = host sampler, $mode $G" FAIL \
            "$( (grep -m1 'cannot record' "$OUTDIR/sample-$mode-0.log"; diff "$W/sample-$mode-0.sorted" "$W/sample-$mode-1.sorted") | head -2 | cut -c1-150)"
    fi
done

# the last layer pruned to the logit rows (TPINFER_PRUNE_LAST) gives the tokens every row
# gives, in float32; at tp 2 and pp 2 too on a machine of two GPUs (once, at grid 1 1 1)
if [ "$NP" -eq 1 ] && [ "${GPU_MODELS:-1}" = 1 ]; then
    ngpu=$(grep -c . "$OUTDIR/gpu.txt")
    mpi_for=no
    [ "$ngpu" -ge 2 ] && mpi_for=$(command -v mpirun || echo no)
    if top_srcdir=$root top_builddir=$B TPINFER_SHARED=$SHARED PRUNE_BACKEND=cuda MPIRUN=$mpi_for \
        timeout 300 bash "$root/tests/prune_last.sh" >"$OUTDIR/prune-last.log" 2>&1; then
        record "last layer pruned = every row (tokens, f32)" PASS "$([ "$mpi_for" = no ] && echo tp1 || echo "tp1, tp2, pp2")"
    else
        record "last layer pruned = every row (tokens, f32)" FAIL "$(tail -2 "$OUTDIR/prune-last.log" | tr '|\n' '/ ' | cut -c1-150)"
    fi
    # the o and down products added into the residual in cuBLASLt's epilogue (TPINFER_RESIDUAL_ADD)
    if top_srcdir=$root top_builddir=$B TPINFER_SHARED=$SHARED RESIDUAL_BACKEND=cuda MPIRUN=$mpi_for \
        timeout 300 bash "$root/tests/residual_add.sh" >"$OUTDIR/residual-add.log" 2>&1; then
        record "products added in place = through delta (tokens, f32)" PASS "$([ "$mpi_for" = no ] && echo tp1 || echo "tp1, pp2; tp2 off")"
    else
        record "products added in place = through delta (tokens, f32)" FAIL "$(tail -2 "$OUTDIR/residual-add.log" | tr '|\n' '/ ' | cut -c1-150)"
    fi
    # prefix caching on and off (tests/prefix_cache.sh)
    if top_srcdir=$root top_builddir=$B TPINFER_SHARED=$SHARED PREFIX_BACKEND=cuda MPIRUN=$mpi_for PYTHON3=python3 \
        timeout 300 bash "$root/tests/prefix_cache.sh" >"$OUTDIR/prefix-cache.log" 2>&1; then
        record "prefix cache on = off (tokens, f32)" PASS "$([ "$mpi_for" = no ] && echo tp1 || echo "tp1, tp2, pp2")"
    else
        record "prefix cache on = off (tokens, f32)" FAIL "$(tail -2 "$OUTDIR/prefix-cache.log" | tr '|\n' '/ ' | cut -c1-150)"
    fi
fi

# Hugging Face itself in bfloat16 on this GPU, against the same float32 references: the
# yardstick for the bfloat16 rows above (informational; recorded in tests/gpu/RESULTS.md)
if [ "$NP" -eq 1 ] && [ "${GPU_HF_BF16:-1}" = 1 ]; then
    timeout 300 python3 "$root/tests/gpu/hf_bf16.py" "$MODELS" >"$OUTDIR/hf-bf16.md" 2>"$OUTDIR/hf-bf16.err" ||
        tail -3 "$OUTDIR/hf-bf16.err"
fi

# ---- 3. compute-sanitizer on a tiny-model run (every rank under it; GPU_SANITIZER=0 skips)
if [ "${GPU_SANITIZER:-1}" = 1 ] && command -v compute-sanitizer >/dev/null; then
    printf '{"id": "a", "prompt": "Hello there", "max_tokens": 8}\n{"id": "b", "prompt": "Once upon a time in a land", "max_tokens": 8, "temperature": 0.8, "top_p": 0.9, "logprobs": 2}\n' >"$OUTDIR/san.jsonl"
    for tool in memcheck racecheck; do
        rm -f "$W/san-$tool.jsonl"
        # NCCL probes its kernels with cudaFuncGetAttributes and gets "no kernel image" for
        # some (harmless, its own): API errors are not ours to report at NP > 1
        api=(); [ "$NP" -gt 1 ] && [ $tool = memcheck ] && api=(--report-api-errors no)
        if launch compute-sanitizer --tool $tool "${api[@]}" --error-exitcode 99 "$B/tpinfer" --model "$MODELS/tiny-llama3" \
            --backend cuda --tp "$TP" --pp "$PP" \
            --input "$OUTDIR/san.jsonl" --output "$W/san-$tool.jsonl" --max-model-len 128 --max-num-seqs 4 \
            >"$OUTDIR/san-$tool.log" 2>&1; then
            record "compute-sanitizer $tool $G" PASS "$(grep -m1 'ERROR SUMMARY\|RACECHECK SUMMARY' "$OUTDIR/san-$tool.log")"
        else
            record "compute-sanitizer $tool $G" FAIL "$(grep -m1 'ERROR SUMMARY\|RACECHECK SUMMARY\|error' "$OUTDIR/san-$tool.log")"
        fi
        [ -n "$tc_model" ] || continue # GPU_TC=0, or its head_dim 128 model did not get that far
        rm -f "$W/san-tc-$tool.jsonl"*
        # in prefill chunks of 64: whole prompts' first chunks, and chunks after keys in the cache.
        # racecheck keeps ~4.5 GB of host memory a step here (the five prompts' ~30 steps ran a
        # 128 GiB host out of memory): for it the 200-token prompt alone, 2 tokens out (4
        # chunks, the last after three key tiles, and a decode step)
        san_in=$tc_model.jsonl
        if [ $tool = racecheck ]; then
            san_in=$W/san-tc-one.jsonl
            sed -n 3p "$tc_model.jsonl" | sed 's/"max_tokens": [0-9]*/"max_tokens": 2/' >"$san_in"
        fi
        if launch compute-sanitizer --tool $tool "${api[@]}" --error-exitcode 99 "$B/tpinfer" --model "$tc_model" \
            --backend cuda --dtype bfloat16 --tp "$TP" --pp "$PP" --input "$san_in" \
            --max-num-batched-tokens 64 --output "$W/san-tc-$tool.jsonl" >"$OUTDIR/san-tc-$tool.log" 2>&1; then
            record "compute-sanitizer $tool, tensor-core attention $G" PASS "$(grep -m1 'ERROR SUMMARY\|RACECHECK SUMMARY' "$OUTDIR/san-tc-$tool.log")"
        else
            record "compute-sanitizer $tool, tensor-core attention $G" FAIL "$(grep -m1 'ERROR SUMMARY\|RACECHECK SUMMARY\|error' "$OUTDIR/san-tc-$tool.log")"
        fi
    done
fi

{
    echo "### $(date -u +%Y-%m-%d) $(cat "$OUTDIR/gpu.txt" | head -1) x $(grep -c . "$OUTDIR/gpu.txt"), grid tp=$TP pp=$PP dp=$DP, commit $commit"
    echo
    echo "| check | result | detail |"
    echo "| --- | --- | --- |"
    printf '%s\n' "${results[@]}"
    if [ -s "$OUTDIR/hf-bf16.md" ]; then echo; echo "Hugging Face in bfloat16 on this GPU against the float32 references:"; echo; cat "$OUTDIR/hf-bf16.md"; fi
} | tee "$OUTDIR/gpu-results.md"
! printf '%s\n' "${results[@]}" | grep -q "| FAIL |"
