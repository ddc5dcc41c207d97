#!/bin/sh
# The grids of the four- and eight-GPU runs, on the CPU backend (ranks oversubscribed):
# dp 2 x tp 2 (-np 4), tp 8 and tp 4 x pp 2 (-np 8), on tiny-llama3 (8 query heads, 2 KV
# heads: replicated 4 times at tp 8) and tiny-qwen3 (head_dim 32, q/k norms). Logits
# within 1e-3 of Hugging Face's and greedy ids equal, as at the small grids.
. "$top_srcdir/tests/lib.sh"
need_shared
cmp="$top_builddir/tests/compare_logits"
export OMP_NUM_THREADS=1
for name in tiny-llama3 tiny-qwen3; do
    dir="$MODELS/$name"
    ref="$dir/reference/logits.safetensors"
    "$cmp" --make-input "$ref" "$TMP/$name.jsonl" || fail "$name: reading the reference"
    for grid in "2 1 4" "8 1 8" "4 2 8"; do
        set -- $grid
        out="$TMP/$name-$1-$2-$3"
        mpi "$3" "$TPINFER" --model "$dir" --backend cpu --tp "$1" --pp "$2" --input "$TMP/$name.jsonl" \
            --output "$out.jsonl" --dump-logits "$out" 2>"$TMP/err" || { cat "$TMP/err"; fail "$name tp $1 pp $2 np $3"; }
        echo "== $name tp $1 pp $2 dp $(($3 / ($1 * $2)))"
        "$cmp" "$ref" "$out" || fail "$name tp $1 pp $2 np $3: logits or ids differ from Hugging Face"
    done
done
exit 0
