#!/bin/sh
# --dry-run on one process over every shared model: the plan reads every tensor byte once
# at tp=1, pp=1, and reads no weight data (checked with strace when present).
. "$top_srcdir/tests/lib.sh"
need_shared

total_line() { sed -n 's/.*weights read by all ranks: .*(\([0-9]*\) bytes); the files hold.*/\1/p' "$1"; }
file_bytes() { "$PYTHON3" -c '
import json, struct, sys, os
d = sys.argv[1]
idx = os.path.join(d, "model.safetensors.index.json")
files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) else ["model.safetensors"]
total = 0
for f in files:
    with open(os.path.join(d, f), "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        h = json.loads(fh.read(n))
    total += sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in h.items() if k != "__metadata__")
print(total)' "$1"; }

for dir in "$MODELS"/*/; do
    [ -f "$dir/config.json" ] || continue
    "$TPINFER" --model "$dir" --dry-run >"$TMP/out" 2>"$TMP/err" || { cat "$TMP/err"; fail "dry-run of $dir"; }
    grep -q "^rank 0: dp 0/1  pp 0/1  tp 0/1" "$TMP/out" || fail "$dir: no rank line"
    got=$(total_line "$TMP/out")
    want=$(file_bytes "$dir")
    [ "$got" = "$want" ] || fail "$dir: dry run reads $got bytes at tp=1, the files hold $want"
done

# The KV line names the sequences the run would hold: the engine's default without a GPU
# (256; 1024 on GPUs of 70 GiB or more), else --max-num-seqs. tiny-llama3 (bfloat16) caches
# 1 KiB a token on the CPU backend, which keeps float32: what the run's --kv-cache-memory
# must hold (one sequence of 48 tokens, three blocks of 16: 48 KiB, and not 47).
"$TPINFER" --model "$MODELS/tiny-llama3" --dry-run --backend cpu >"$TMP/out" 2>&1 || fail "dry-run of tiny-llama3"
grep -q "KV cache per token per replica: 1 KiB; for --max-num-seqs 256 x --max-model-len 512: 128 MiB" "$TMP/out" ||
    fail "default sequences: $(grep 'KV cache per token per replica' "$TMP/out")"
grep -q "KV cache    1 KiB per token (float32)" "$TMP/out" || fail "KV dtype: $(grep 'KV cache  ' "$TMP/out")"
"$TPINFER" --model "$MODELS/tiny-llama3" --dry-run --backend cpu --max-num-seqs 8 --max-model-len 128 >"$TMP/out" 2>&1 ||
    fail "dry-run of tiny-llama3 with --max-num-seqs 8"
grep -q "for --max-num-seqs 8 x --max-model-len 128: 1 MiB" "$TMP/out" ||
    fail "--max-num-seqs 8: $(grep 'KV cache per token per replica' "$TMP/out")"
printf '%s\n' '{"prompt": "Once upon a time", "max_tokens": 4}' >"$TMP/kv.jsonl"
"$TPINFER" --model "$MODELS/tiny-llama3" --backend cpu --input "$TMP/kv.jsonl" --output "$TMP/kv.out" \
    --max-model-len 48 --kv-cache-memory 49152 >/dev/null 2>&1 || fail "48 KiB of KV cache, as the dry run says, did not run"
"$TPINFER" --model "$MODELS/tiny-llama3" --backend cpu --input "$TMP/kv.jsonl" --output "$TMP/kv2.out" \
    --max-model-len 48 --kv-cache-memory 48128 >/dev/null 2>&1 && fail "47 KiB of KV cache ran, the dry run says 48"

# No weight bytes are read: strace sees only the 8-byte length and header preads.
if command -v strace >/dev/null; then
    strace -f -e trace=pread64,read -o "$TMP/trace" "$TPINFER" --model "$MODELS/stories260K-hf" --dry-run >/dev/null 2>&1 ||
        fail "dry-run under strace"
    big=$(awk -F'= ' '/model.safetensors|pread64\(/ && $NF+0 > 65536 {print}' "$TMP/trace" | head -3)
    [ -z "$big" ] || fail "dry-run read more than headers: $big"
fi
exit 0
