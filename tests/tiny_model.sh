#!/bin/sh
# The model a fresh clone generates (float32 single file, bfloat16 in 3 shards) passes
# the dry run at every grid of 1, 2 and 4 ranks; a checkpoint mixing bfloat16 and float32
# shards of the same values generates what the bfloat16 one does; no ../shared needed.
. "$top_srcdir/tests/lib.sh"
[ "$PYTHON3" != no ] || skip "python3 not found"
"$PYTHON3" "$top_srcdir/tests/gen_tiny_model.py" "$TMP/f32" || fail "gen f32"
"$PYTHON3" "$top_srcdir/tests/gen_tiny_model.py" "$TMP/bf16" --dtype bfloat16 --shards 3 || fail "gen bf16"
cmp -s "$TMP/f32/tokenizer.json" "$TMP/bf16/tokenizer.json" || fail "generator not deterministic"
"$TPINFER" --model "$TMP/f32" --dry-run >"$TMP/a" || fail "dry-run f32"
"$TPINFER" --model "$TMP/bf16" --dry-run >"$TMP/b" || fail "dry-run bf16 shards"
grep -q "3 file(s)" "$TMP/b" || fail "sharded model not read through its index"
for grid in "1 1" "2 1" "1 2" "2 2" "4 1" "1 4"; do
    set -- $grid
    mpi $(($1 * $2)) "$TPINFER" --model "$TMP/bf16" --dry-run --tp "$1" --pp "$2" >"$TMP/g" 2>"$TMP/e" ||
        { cat "$TMP/e"; fail "dry-run tp $1 pp $2"; }
    grep -q "world $(($1 * $2)) = dp 1 x pp $2 x tp $1" "$TMP/g" || fail "grid tp $1 pp $2"
done
# a checkpoint whose shards differ in dtype (one of the bfloat16 shards rewritten as float32,
# exactly: bf16 -> f32 adds zero bits) loads and generates the same tokens as the bfloat16 one
mkdir -p "$TMP/mixed" && cp "$TMP/bf16"/* "$TMP/mixed/"
"$PYTHON3" - "$TMP/bf16/model-00002-of-00003.safetensors" "$TMP/mixed/model-00002-of-00003.safetensors" <<'PY' ||
import json, struct, sys
src = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", src[:8])[0]
header = json.loads(src[8:8 + n])
data = src[8 + n:]
out, body = {}, b""
for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0] if kv[0] != "__metadata__" else -1):
    if name == "__metadata__":
        out[name] = t
        continue
    assert t["dtype"] == "BF16"
    a, b = t["data_offsets"]
    raw = data[a:b]
    f32 = b"".join(b"\0\0" + raw[i:i + 2] for i in range(0, len(raw), 2))
    out[name] = {"dtype": "F32", "shape": t["shape"], "data_offsets": [len(body), len(body) + len(f32)]}
    body += f32
h = json.dumps(out).encode()
h += b" " * (-len(h) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(h)) + h + body)
PY
    fail "rewriting a shard as float32"
printf 'Once upon a time\n' >"$TMP/p.txt"
"$TPINFER" --model "$TMP/bf16" --input "$TMP/p.txt" --output "$TMP/bf16.jsonl" --max-tokens 8 --ignore-eos 2>"$TMP/e" ||
    { cat "$TMP/e"; fail "the bfloat16 model"; }
"$TPINFER" --model "$TMP/mixed" --input "$TMP/p.txt" --output "$TMP/mixed.jsonl" --max-tokens 8 --ignore-eos 2>"$TMP/e" ||
    { cat "$TMP/e"; fail "a checkpoint of bfloat16 and float32 shards"; }
cmp -s "$TMP/bf16.jsonl" "$TMP/mixed.jsonl" || fail "the mixed-dtype checkpoint generated other tokens: $(cat "$TMP/mixed.jsonl")"
exit 0
