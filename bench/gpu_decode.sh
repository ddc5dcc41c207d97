#!/bin/bash
# bench/gpu_decode.sh [TP [PP]]: tpinfer's speed on the GPU machine, in one call. Builds
# tpinfer there (as tests/gpu/run.sh does), writes a random-weight bf16 checkpoint of
# Llama-3-8B's shape (and Llama-3.2-1B's), measures the copy bandwidth of the card, then:
#   batch-1 decode: one prompt of 128 tokens, 128 new tokens: ms/token and the fraction of
#     the HBM limit (weight bytes per token over the measured copy bandwidth);
#   offline throughput: 128 prompts of 128 tokens, 128 new tokens each (generated tok/s over
#     the whole run, and prompt + generated tok/s).
# Prints a table last and leaves it in $OUT/bench-results.md.
set -u
TP=${1:-1}
PP=${2:-1}
NP=$((TP * PP))
OUTDIR=${OUT:-/tmp/tpinfer-bench-out}
WORK=${BENCH_WORK:-/tmp/tpinfer-bench}
mkdir -p "$OUTDIR" "$WORK"
root=$(pwd)
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
deps=$root/.gpu-deps/root
lib=$deps/usr/lib/x86_64-linux-gnu
export PKG_CONFIG_PATH=$lib/pkgconfig LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if [ ! -x build-gpu/tpinfer ]; then
    ( set -e; autoreconf -fi >/dev/null 2>&1; mkdir -p build-gpu; cd build-gpu
      ../configure -q --with-cuda CPPFLAGS="-I$deps/usr/include" LDFLAGS="-L$lib" >"$OUTDIR/configure.log" 2>&1
      make -j16 >"$OUTDIR/build.log" 2>&1 ) || { tail -20 "$OUTDIR/build.log"; exit 1; }
fi
T=$root/build-gpu/tpinfer
launch() { if [ "$NP" -gt 1 ]; then mpirun --allow-run-as-root -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -np "$NP" "$@"; else "$@"; fi; }
rows=()

# copy bandwidth (bytes read + written per second), the ceiling of a decode step
bw=$(python3 - <<'PY'
import torch
x = torch.empty(4 << 30, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
torch.cuda.synchronize()
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(10): y.copy_(x)
e.record(); torch.cuda.synchronize()
print("%.0f" % (2 * x.numel() * 10 / (s.elapsed_time(e) / 1e3)))
PY
)
echo "copy bandwidth: $bw B/s"

for shape in ${BENCH_SHAPES:-llama-3-8b:4096:32:32:8:14336:128256 llama-3.2-1b:2048:16:32:8:8192:128256}; do
    IFS=: read -r name hidden layers heads kv inter vocab <<<"$shape"
    dir=$WORK/$name
    if [ ! -f "$dir/model.safetensors" ]; then
        python3 "$root/tests/gen_tiny_model.py" "$dir" --dtype bfloat16 --hidden "$hidden" --layers "$layers" \
            --heads "$heads" --kv-heads "$kv" --intermediate "$inter" --vocab "$vocab" >"$OUTDIR/gen-$name.log" 2>&1 ||
            { echo "generating $name failed"; tail -5 "$OUTDIR/gen-$name.log"; continue; }
    fi
    wbytes=$(stat -c %s "$dir/model.safetensors")
    python3 - "$WORK" <<'PY'
import json, sys
w = sys.argv[1]
ids = [1 + (i * 7919) % 250 for i in range(128)]
with open(w + "/one.jsonl", "w") as f:
    f.write(json.dumps({"id": "b1", "prompt_token_ids": ids, "max_tokens": 128, "ignore_eos": True}) + "\n")
with open(w + "/batch.jsonl", "w") as f:
    for r in range(128):
        f.write(json.dumps({"id": "r%d" % r, "prompt_token_ids": [1 + (i * 31 + r * 17) % 250 for i in range(128)],
                            "max_tokens": 128, "ignore_eos": True}) + "\n")
PY
    for kind in one batch; do
        rm -f "$WORK/out.jsonl"*
        launch "$T" --model "$dir" --tp "$TP" --pp "$PP" --input "$WORK/$kind.jsonl" --output "$WORK/out.jsonl" \
            --max-model-len 256 --max-num-seqs 128 >"$OUTDIR/$name-$kind.log" 2>&1
        gen=$(sed -n 's/.*generated tokens in \([0-9.]*\) s: \([0-9.]*\) generated tok\/s.*/\1 \2/p' "$OUTDIR/$name-$kind.log")
        secs=${gen%% *}; tps=${gen##* }
        if [ -z "$gen" ]; then rows+=("| $name | $kind | FAILED: $(grep -m1 error "$OUTDIR/$name-$kind.log" | cut -c1-100) | | |"); continue; fi
        if [ $kind = one ]; then
            ms=$(awk -v t="$tps" 'BEGIN { printf "%.2f", 1000 / t }')
            frac=$(awk -v t="$tps" -v w="$wbytes" -v bw="$bw" 'BEGIN { printf "%.0f%%", 100 * (w / bw) / (1 / t) }')
            rows+=("| $name | batch 1, 128 in / 128 out | $tps tok/s | $ms ms/token | $frac of the HBM limit |")
        else
            total=$(awk -v s="$secs" 'BEGIN { printf "%.0f", 128 * 256 / s }')
            rows+=("| $name | 128 x (128 in / 128 out) | $tps generated tok/s | $total total tok/s | $secs s |")
        fi
    done
done
{
    echo "### $(date -u +%Y-%m-%d) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), tp=$TP pp=$PP, commit $(git rev-parse --short HEAD 2>/dev/null || echo ?)"
    echo
    echo "copy bandwidth measured: $(awk -v b="$bw" 'BEGIN { printf "%.2f TB/s", b / 1e12 }')"
    echo
    echo "| model | run | throughput | per token / total | note |"
    echo "| --- | --- | --- | --- | --- |"
    printf '%s\n' "${rows[@]}"
} | tee "$OUTDIR/bench-results.md"
