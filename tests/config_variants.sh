#!/bin/sh
# config.json settings no shared model uses, against Hugging Face: each reference in
# tests/data/variants (made by tests/gen_variant_reference.py) is a model of ../shared/models
# with settings added to its config.json (the overrides are in the reference's metadata):
# sliding-window attention (Mistral's on every layer, Qwen2's on some), YaRN rope scaling,
# Granite's multipliers (tied embeddings and not), Gemma 3, Gemma 2 with soft-capping and Gemma 1
# (tiny-qwen3 converted by tests/gemma_checkpoint.py: the reference's metadata says "convert"),
# and the text models of Gemma3ForConditionalGeneration and Mistral3ForConditionalGeneration
# checkpoints (both layouts: tests/multimodal_checkpoint.py).
# Prefill and greedy-step logits within 1e-3, greedy ids equal, at grids that put the sliding
# and full layers on different pipeline stages, with prefill in chunks (keys of earlier chunks,
# some out of the window) and with two prompts that share a prefix (the second reads the
# first's cached blocks); --dry-run names the sliding layers; and the model without the
# overrides must fail the same comparison.
. "$top_srcdir/tests/lib.sh"
need_shared
[ "${PYTHON3:-no}" != no ] || skip "python3 not found"
cmp="$top_builddir/tests/compare_logits"
export OMP_NUM_THREADS=1
n=0
for ref in "$top_srcdir"/tests/data/variants/*.safetensors; do
    name=$(basename "$ref" .safetensors)
    # the model directory: the base model's files, config.json with the overrides
    base=$("$PYTHON3" "$top_srcdir/tests/variant_model.py" "$ref" "$MODELS" "$TMP/$name") || fail "$name: making its model directory"
    dir="$TMP/$name"
    "$cmp" --make-input "$ref" "$TMP/$name.jsonl" || fail "$name: reading the reference"
    # --dry-run says which layers of each stage slide (one layer a stage)
    mpi 3 "$TPINFER" --model "$dir" --pp 3 --dry-run >"$TMP/dry" 2>&1 || { cat "$TMP/dry"; fail "$name: --dry-run"; }
    said=$(grep -o 'layers *\[[0-9], [0-9])[^(]*(1 of them a sliding window of [0-9]*)' "$TMP/dry" |
           sed 's/layers *\[\([0-9]\).*window of \([0-9]*\))/\1:\2 /' | tr -d '\n')
    want=$("$PYTHON3" -c 'import json, sys; c = json.load(open(sys.argv[1])); c = c.get("text_config", c); w = c.get("sliding_window")
gemma = c["model_type"] in ("gemma2", "gemma3_text")
on = w and w < c["max_position_embeddings"] and (c["model_type"] == "mistral" or c.get("use_sliding_window") or gemma)
first = 0 if c["model_type"] == "mistral" else c.get("max_window_layers", 28)
every = 2 if c["model_type"] == "gemma2" else c.get("sliding_window_pattern", 6)
types = c.get("layer_types") or ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(99)]
slides = lambda i: types[i] == "sliding_attention" if gemma else i >= first
print("".join("%d:%d " % (i, w) for i in range(c["num_hidden_layers"]) if on and slides(i)))' "$dir/config.json")
    [ "$said" = "$want" ] || { cat "$TMP/dry"; fail "$name: --dry-run names the sliding layers $said, want $want"; }
    # where some layers slide and some do not, its KV total says every layer keeps whole contexts
    layers=$("$PYTHON3" -c 'import json, sys; c = json.load(open(sys.argv[1])); print(c.get("text_config", c)["num_hidden_layers"])' "$dir/config.json")
    if [ -n "$want" ] && [ "$(echo $want | wc -w)" -lt "$layers" ]; then
        grep -q "(whole contexts in every layer: a sliding layer gives blocks back only where all do)" "$TMP/dry" ||
            { cat "$TMP/dry"; fail "$name: --dry-run's KV total does not say the sliding layers keep whole contexts"; }
    fi
    # and the model's description (the load's info line, the dry run's total) says what differs
    described=$("$PYTHON3" -c 'import json, sys; top = json.load(open(sys.argv[1])); c = top.get("text_config", top)
L = c["num_hidden_layers"]
w = c.get("sliding_window"); r = c.get("rope_scaling") or {}
every = 2 if c["model_type"] == "gemma2" else c.get("sliding_window_pattern", 6)
types = c.get("layer_types") or ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(L)]
on = [i for i in range(L) if w and w < c["max_position_embeddings"] and (c["model_type"] == "mistral" or
      (c.get("use_sliding_window") and i >= c.get("max_window_layers", 28)) or
      (c["model_type"] in ("gemma2", "gemma3_text") and types[i] == "sliding_attention"))]
d = "%s, %d layers" % (top["architectures"][0], L)
d += " (all with a sliding window of %d)" % w if len(on) == L else " (%d with a sliding window of %d)" % (len(on), w) if on else ""
if r.get("rope_type") == "yarn":
    d += ", yarn rope x%g over %d positions" % (r["factor"], r["original_max_position_embeddings"])
if r.get("rope_type") == "linear":
    d += ", linear rope x%g" % r["factor"] + (" on the full layers" if c["model_type"] == "gemma3_text" else "")
if c["model_type"] == "granite":
    d += ", multipliers: embedding %g, residual %g, attention %g, logits 1/%g" % tuple(c.get(k, 1.0) for k in
         ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling"))
if c["model_type"] == "gemma3_text":
    d += ", rope base %g (%g on the sliding layers), attention scale %g" % (
        c.get("rope_theta", 1e6), c.get("rope_local_base_freq", 1e4), c["query_pre_attn_scalar"] ** -0.5)
if c["model_type"] == "gemma2":
    d += ", attention scale %g, soft-capping: attention %g, logits %g" % (
        c["query_pre_attn_scalar"] ** -0.5, c["attn_logit_softcapping"], c["final_logit_softcapping"])
print(d)' "$dir/config.json")
    # a multimodal checkpoint's text model: the same in transformers >= 4.52's layout too
    # (model.language_model.X) at one grid
    layouts=
    if grep -q '"convert":"\(gemma3-mm\|mistral3\)"' "$ref"; then
        "$PYTHON3" "$top_srcdir/tests/variant_model.py" "$ref" "$MODELS" "$TMP/$name-new" new >/dev/null ||
            fail "$name: making its model directory in the newer layout"
        layouts="new:2:3"
    fi
    for run in "1 1" "1 3" "2 1" "2 3" "1 1 --max-num-batched-tokens 5" $layouts; do
        model=$dir
        case $run in new:*) model=$TMP/$name-new run=$(echo "${run#new:}" | tr : ' ') ;; esac
        set -- $run
        tp=$1 pp=$2; shift 2
        out="$TMP/$name-$tp-$pp-$#${model#"$dir"}"
        mpi $((tp * pp)) "$TPINFER" --model "$model" --tp "$tp" --pp "$pp" --backend cpu "$@" \
            --input "$TMP/$name.jsonl" --output "$out.jsonl" --dump-logits "$out" 2>"$TMP/err" ||
            { cat "$TMP/err"; fail "$name tp $tp pp $pp $*: tpinfer exited non-zero"; }
        echo "== $name tp $tp pp $pp $*${model#"$dir"}"
        grep -qF "of weights ($described)" "$TMP/err" ||
            { grep loaded "$TMP/err"; fail "$name: the load's info line does not say ($described)"; }
        "$cmp" "$ref" "$out" || fail "$name tp $tp pp $pp $*: logits or ids differ from Hugging Face"
        n=$((n + 1))
    done
    # the reference prompt after a prompt of its first 20 tokens: with --max-num-seqs 1 the
    # second runs after the first and takes its cached block (of 16; --dump-logits turns the
    # prefix cache off, so the greedy ids are compared with the first run's, Hugging Face's)
    "$PYTHON3" - "$TMP/$name.jsonl" >"$TMP/$name-two.jsonl" <<'PY'
import json, sys
line = json.loads(open(sys.argv[1]).readline())
print(json.dumps({"id": "first", "max_tokens": 1, "prompt_token_ids": line["prompt_token_ids"][:20]}))
print(json.dumps(line))
PY
    out="$TMP/$name-cached.jsonl"
    "$TPINFER" --model "$dir" --backend cpu --max-num-seqs 1 --kv-block-size 16 --input "$TMP/$name-two.jsonl" \
        --output "$out" 2>"$TMP/err" || { cat "$TMP/err"; fail "$name: two prompts"; }
    grep '"id":"p0"' "$out" | grep -q '"cached_tokens":16' || fail "$name: the second prompt took no cached block: $(cat "$out")"
    ids() { grep '"id":"p0"' "$1" | sed 's/.*"token_ids":\(\[[^]]*\]\).*/\1/'; }
    [ "$(ids "$out")" = "$(ids "$TMP/$name-1-1-0.jsonl")" ] ||
        fail "$name: after a cached prefix the greedy ids are $(ids "$out"), Hugging Face's $(ids "$TMP/$name-1-1-0.jsonl")"
    echo "== $name: after a cached block of its prompt: the same ids"
    # where every layer slides, sequences give back the blocks their windows passed: the prompt
    # (36 + 12 tokens) with two others at once, in a cache of 24 one-token blocks that holds
    # none of them whole (refused before), gives Hugging Face's logits and ids; the others
    # their ids alone in a cache that holds them whole. --dry-run counts the window's tokens.
    if [ "$(sed -n 's/.*"sliding_window": *\([0-9]*\).*/\1/p' "$dir/config.json")" = 8 ] && grep -q '"mistral"' "$dir/config.json"; then
        "$PYTHON3" - "$TMP/$name.jsonl" >"$TMP/$name-three.jsonl" <<'PY'
import json, sys
line = json.loads(open(sys.argv[1]).readline())
ids = line["prompt_token_ids"]
print(json.dumps(line))
print(json.dumps({"id": "reversed", "max_tokens": 20, "prompt_token_ids": ids[::-1]}))
print(json.dumps({"id": "shifted", "max_tokens": 16, "prompt_token_ids": ids[5:] + ids[:9]}))
PY
        per_token=$((3 * 2 * 4 * 16 * 4)) # layers x K,V x KV heads x head_dim x float32
        out="$TMP/$name-tight"
        "$TPINFER" --model "$dir" --backend cpu --kv-block-size 1 --kv-cache-memory $((24 * per_token)) \
            --input "$TMP/$name-three.jsonl" --output "$out.jsonl" --dump-logits "$out" 2>"$TMP/err" ||
            { cat "$TMP/err"; fail "$name: three prompts in a cache of 24 tokens"; }
        "$cmp" "$ref" "$out" || fail "$name: behind the window, in a cache of 24 tokens: logits or ids differ from Hugging Face"
        "$TPINFER" --model "$dir" --backend cpu --max-num-seqs 1 --input "$TMP/$name-three.jsonl" \
            --output "$TMP/$name-alone.jsonl" 2>"$TMP/err" || { cat "$TMP/err"; fail "$name: three prompts alone"; }
        for id in p0 reversed shifted; do
            a=$(grep "\"id\":\"$id\"" "$out.jsonl" | sed 's/.*"token_ids":\(\[[^]]*\]\).*/\1/')
            b=$(grep "\"id\":\"$id\"" "$TMP/$name-alone.jsonl" | sed 's/.*"token_ids":\(\[[^]]*\]\).*/\1/')
            [ -n "$a" ] && [ "$a" = "$b" ] || fail "$name: $id gave $a in the tight cache, $b alone"
        done
        # a window the cache cannot hold is refused, naming it
        ! "$TPINFER" --model "$dir" --backend cpu --kv-block-size 1 --kv-cache-memory $((6 * per_token)) \
            --input "$TMP/$name-three.jsonl" --output "$TMP/$name-none.jsonl" 2>"$TMP/err" ||
            fail "$name: a cache of 6 tokens under a window of 8 was taken"
        grep -q "behind its sliding window of 8" "$TMP/err" || { cat "$TMP/err"; fail "$name: the refusal does not name the window"; }
        "$TPINFER" --model "$dir" --max-model-len 512 --dry-run >"$TMP/dry" 2>&1 || { cat "$TMP/dry"; fail "$name: --dry-run"; }
        grep -q "x --max-model-len 512 (each holding about the 8 tokens of its sliding window): 3 MiB" "$TMP/dry" ||
            fail "$name: --dry-run's KV total: $(grep 'KV cache per token per replica' "$TMP/dry")"
        echo "== $name: three sequences of up to 48 tokens in a cache of 24: Hugging Face's logits, their ids alone"
    fi
    # without the overrides, the same comparison fails (they matter for these prompts)
    out="$TMP/$name-full"
    "$TPINFER" --model "$base" --backend cpu --input "$TMP/$name.jsonl" --output "$out.jsonl" \
        --dump-logits "$out" 2>"$TMP/err" || { cat "$TMP/err"; fail "$name: the model without its overrides"; }
    ! "$cmp" "$ref" "$out" >/dev/null || fail "$name: the model without the overrides matches too"
    echo "== $name: the model without its overrides differs, as it should"
done
[ $n -gt 0 ] || fail "no reference in $top_srcdir/tests/data/variants"
echo "$n runs match Hugging Face's logits"
exit 0
