#!/bin/sh
# Every model of ../shared/models at every grid (tp, pp) in {(1,1), (2,1), (1,2), (2,2),
# (4,1)} that its shapes allow: prefill and greedy-step logits within 1e-3 of Hugging
# Face's, greedy ids exactly equal (the CPU backend, float32 math).
. "$top_srcdir/tests/lib.sh"
need_shared
cmp="$top_builddir/tests/compare_logits"
export OMP_NUM_THREADS=1
n=0
for dir in "$MODELS"/*/; do
    ref="$dir/reference/logits.safetensors"
    [ -f "$ref" ] || continue
    name=$(basename "$dir")
    "$cmp" --make-input "$ref" "$TMP/$name.jsonl" || fail "$name: reading the reference"
    for grid in "1 1" "2 1" "1 2" "2 2" "4 1"; do
        set -- $grid
        np=$(($1 * $2))
        # a grid the model's shapes do not allow is skipped, as the dry run says
        if ! mpi $np "$TPINFER" --model "$dir" --dry-run --tp "$1" --pp "$2" >/dev/null 2>"$TMP/why"; then
            echo "$name tp $1 pp $2: skipped: $(grep error "$TMP/why")"
            continue
        fi
        out="$TMP/$name-$1-$2"
        mpi $np "$TPINFER" --model "$dir" --tp "$1" --pp "$2" --backend cpu --input "$TMP/$name.jsonl" \
            --output "$out.jsonl" --dump-logits "$out" 2>"$TMP/err" ||
            { cat "$TMP/err"; fail "$name tp $1 pp $2: tpinfer exited non-zero"; }
        echo "== $name tp $1 pp $2"
        "$cmp" "$ref" "$out" || fail "$name tp $1 pp $2: logits or ids differ from Hugging Face"
        n=$((n + 1))
    done
done
[ $n -gt 0 ] || fail "no model with reference/logits.safetensors in $MODELS"
# weights uploaded in chunks of 1000 bytes through the two staging buffers (64 MiB on a GPU):
# every slice split across many chunks, rows longer than a chunk one at a time
for m in stories260K-hf-bf16-sharded tiny-qwen3; do
    dir="$MODELS/$m"
    out="$TMP/$m-chunked"
    TPINFER_LOAD_CHUNK=1000 mpi 2 "$TPINFER" --model "$dir" --tp 2 --backend cpu --input "$TMP/$m.jsonl" \
        --output "$out.jsonl" --dump-logits "$out" 2>"$TMP/err" || { cat "$TMP/err"; fail "$m chunked load"; }
    "$cmp" "$dir/reference/logits.safetensors" "$out" >/dev/null || fail "$m: chunked weight upload changed the logits"
    echo "== $m tp 2, weights in chunks of 1000 bytes: match"
done
echo "$n model x grid runs match"
exit 0
