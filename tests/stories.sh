#!/bin/sh
# stories260K (float32, and its bfloat16 two-shard copy) from the text "Once upon a time":
# the 128-token greedy story equals Hugging Face's text exactly at every grid, including
# mpirun -np 4 --tp 2 --pp 2, through the tokenizer both ways.
. "$top_srcdir/tests/lib.sh"
need_shared
[ "$PYTHON3" != no ] || skip "python3 not found"
export OMP_NUM_THREADS=1
printf 'Once upon a time\n' >"$TMP/prompt.txt"
for model in stories260K-hf stories260K-hf-bf16-sharded; do
    dir="$MODELS/$model"
    [ -d "$dir" ] || continue
    "$PYTHON3" -c 'import json,sys; g=json.load(open(sys.argv[1]))["greedy"][0]; print(json.dumps(g["new_text"]))' \
        "$dir/reference/tokens.json" >"$TMP/want"
    for grid in "1 1" "2 1" "1 2" "2 2" "4 1"; do
        set -- $grid
        mpi $(($1 * $2)) "$TPINFER" --model "$dir" --tp "$1" --pp "$2" --backend cpu --input "$TMP/prompt.txt" \
            --max-tokens 128 --output "$TMP/out.jsonl" --overwrite 2>"$TMP/err" || { cat "$TMP/err"; fail "$model tp $1 pp $2"; }
        "$PYTHON3" -c 'import json,sys; r=json.loads(open(sys.argv[1]).readline()); print(json.dumps(r["text"])); assert r["usage"]["completion_tokens"]==128 and r["finish_reason"]=="length"' \
            "$TMP/out.jsonl" >"$TMP/got" || fail "$model tp $1 pp $2: bad output line"
        cmp -s "$TMP/want" "$TMP/got" || { diff "$TMP/want" "$TMP/got"; fail "$model tp $1 pp $2: story differs"; }
        echo "$model tp $1 pp $2: story equal"
    done
done
exit 0
