#!/bin/sh
# Phi3ForCausalLM (Phi-3, Phi-4): a checkpoint made of tiny-mistral's weights with each layer's
# q|k|v and gate|up fused as Phi-3 stores them (tests/fuse_checkpoint.py; Hugging Face's Phi3
# gives tiny-mistral's reference logits on it to the bit) must give tiny-mistral's Hugging Face
# logits: within 1e-3, greedy ids equal, at tp 1, 2 and 8 (8 ranks: its 4 KV heads replicated,
# each rank reading its q, k and v rows out of the one tensor) and pp 3, the dry run counting
# the same bytes as for the unfused model; and a config that names the other layout is refused
# with the tensor it lacks, and one whose shapes disagree with the fused tensor with both shapes.
. "$top_srcdir/tests/lib.sh"
need_shared
[ "${PYTHON3:-no}" != no ] || skip "python3 not found"
cmp="$top_builddir/tests/compare_logits"
export OMP_NUM_THREADS=1
base="$MODELS/tiny-mistral"
ref="$base/reference/logits.safetensors"
dir="$TMP/phi3"
"$PYTHON3" "$top_srcdir/tests/fuse_checkpoint.py" "$base" "$dir" || fail "fuse_checkpoint.py failed"
"$cmp" --make-input "$ref" "$TMP/in.jsonl" || fail "reading the reference"
for grid in "1 1" "2 1" "8 1" "1 3"; do
    set -- $grid
    out="$TMP/out-$1-$2"
    mpi $(($1 * $2)) "$TPINFER" --model "$dir" --tp "$1" --pp "$2" --backend cpu --input "$TMP/in.jsonl" \
        --output "$out.jsonl" --dump-logits "$out" 2>"$TMP/err" || { cat "$TMP/err"; fail "tp $1 pp $2: tpinfer exited non-zero"; }
    echo "== Phi3ForCausalLM (tiny-mistral fused) tp $1 pp $2"
    "$cmp" "$ref" "$out" || fail "tp $1 pp $2: logits or ids differ from Hugging Face's"
done

# the dry run reads the same bytes at tp 2 as for the unfused model
bytes() { mpi 2 "$TPINFER" --model "$1" --tp 2 --dry-run 2>&1 | grep -o 'weights read by all ranks: [^(]*([0-9]* bytes)'; }
[ "$(bytes "$dir")" = "$(bytes "$base")" ] || fail "the dry run counts $(bytes "$dir") for Phi-3's layout, $(bytes "$base") for Mistral's"

# a config naming the other layout: refused, naming the tensor it lacks
mkdir "$TMP/wrong" "$TMP/wrong2"
for f in "$base"/*; do [ -f "$f" ] && ln -s "$f" "$TMP/wrong/"; done
rm "$TMP/wrong/config.json"
cp "$dir/config.json" "$TMP/wrong/config.json"
for f in "$dir"/*; do [ -f "$f" ] && ln -s "$(readlink -f "$f")" "$TMP/wrong2/"; done
rm "$TMP/wrong2/config.json"
cp "$base/config.json" "$TMP/wrong2/config.json"
# and a Phi-3 config whose shapes disagree with the fused tensor (2 KV heads for 4): refused with both shapes
mkdir "$TMP/kv2"
for f in "$dir"/*; do [ -f "$f" ] && ln -s "$(readlink -f "$f")" "$TMP/kv2/"; done
rm "$TMP/kv2/config.json"
sed 's/"num_key_value_heads": 4/"num_key_value_heads": 2/' "$dir/config.json" >"$TMP/kv2/config.json"
grep -q '"num_key_value_heads": 2' "$TMP/kv2/config.json" || fail "could not edit num_key_value_heads"
printf 'Hello\n' >"$TMP/p.txt"
for case in "wrong:model.layers.0.self_attn.qkv_proj.weight" "wrong2:model.layers.0.self_attn.q_proj.weight" \
    "kv2:qkv_proj.weight has 2-D shape 256 x 128 but config.json implies 2-D 192 x 128"; do
    d=${case%%:*} want=${case#*:}
    rc=0
    "$TPINFER" --model "$TMP/$d" --backend cpu --input "$TMP/p.txt" --output "$TMP/$d.jsonl" 2>"$TMP/$d.err" || rc=$?
    [ $rc -eq 1 ] || { cat "$TMP/$d.err"; fail "$d: exit status $rc, want 1"; }
    grep -q "$want" "$TMP/$d.err" || { cat "$TMP/$d.err"; fail "$d: the error does not name $want"; }
    [ ! -s "$TMP/$d.jsonl" ] || fail "$d: output written"
    echo "== $d: $(grep -m1 "$want" "$TMP/$d.err")"
done
exit 0
