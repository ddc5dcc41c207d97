#!/usr/bin/env python3
"""usage: gemma_checkpoint.py SRC OUT [gemma3|gemma2|gemma|gemma3-mm|gemma3-mm5]

A Gemma3ForCausalLM (or Gemma2ForCausalLM: no q/k norms; or GemmaForCausalLM, Gemma 1: neither
q/k norms nor norms around the blocks' outputs, Llama's layout) checkpoint in OUT made of the
Qwen3 model in SRC (one model.safetensors
in bfloat16, q/k norms, untied): Gemma's RMSNorms scale by 1 + weight, so each norm's weight
is stored less one (bfloat16 rounded: 1 + it is then SRC's norm again, up to that rounding);
Qwen's post_attention_layernorm (the MLP's input norm) becomes pre_feedforward_layernorm, and
the two norms Gemma adds around each block's output (post_attention_layernorm,
post_feedforward_layernorm) are the layer's input and MLP norms reversed; the LM head is
dropped (tied to the embedding, Gemma's default). config.json: Gemma's keys over SRC's shape
(tests/gen_variant_reference.py's overrides then set the windows, rope bases and caps). The
tokenizer files are linked. gemma3-mm: the Gemma 3 model as the text model of a
Gemma3ForConditionalGeneration checkpoint as the Hub has them (multimodal_checkpoint.py);
gemma3-mm5: under transformers >= 4.52's names. Plain Python, so that tests rebuild it without
torch."""
import json
import os
import re
import sys

from checkpoint_io import bf16_bytes, bf16_values, read, write


def convert(src, out, kind="gemma3"):
    assert kind in ("gemma", "gemma2", "gemma3", "gemma3-mm", "gemma3-mm5"), kind
    wrap = kind.startswith("gemma3-mm") and kind
    kind = "gemma3" if wrap else kind
    header, _ = read(os.path.join(src, "model.safetensors"))

    def raw(name):
        shape, dtype, blob = header[name]
        assert dtype == "BF16", name
        return blob

    def less_one(name, reverse=False):
        v = bf16_values(raw(name))
        return bf16_bytes([x - 1.0 for x in (v[::-1] if reverse else v)])

    tensors = {}  # name -> (shape, dtype, bytes)
    for name, (shape, _, _) in header.items():
        if name == "lm_head.weight":
            continue
        m = re.match(r"(model\.layers\.\d+\.)(.*)$", name)
        if name == "model.norm.weight":
            tensors[name] = (shape, "BF16", less_one(name))
        elif not m:
            tensors[name] = (shape, "BF16", raw(name))
        elif m.group(2) == "input_layernorm.weight":
            tensors[name] = (shape, "BF16", less_one(name))
            if kind != "gemma":
                tensors[m.group(1) + "post_attention_layernorm.weight"] = (shape, "BF16", less_one(name, True))
        elif m.group(2) == "post_attention_layernorm.weight" and kind == "gemma":  # the MLP's input norm
            tensors[name] = (shape, "BF16", less_one(name))
        elif m.group(2) == "post_attention_layernorm.weight":
            tensors[m.group(1) + "pre_feedforward_layernorm.weight"] = (shape, "BF16", less_one(name))
            tensors[m.group(1) + "post_feedforward_layernorm.weight"] = (shape, "BF16", less_one(name, True))
        elif m.group(2) in ("self_attn.q_norm.weight", "self_attn.k_norm.weight"):
            if kind == "gemma3":  # Gemma 2 has none
                tensors[name] = (shape, "BF16", less_one(name))
        else:
            tensors[name] = (shape, "BF16", raw(name))

    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    for k in ("hidden_act", "use_sliding_window", "max_window_layers", "sliding_window", "rope_scaling"):
        cfg.pop(k, None)
    cfg["tie_word_embeddings"] = True
    if kind == "gemma":  # "gelu": the legacy name GemmaConfig maps to the tanh form
        cfg.update({"architectures": ["GemmaForCausalLM"], "model_type": "gemma", "hidden_act": "gelu"})
    else:
        cfg.update({"hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": cfg["head_dim"],
                    "attn_logit_softcapping": None, "final_logit_softcapping": None})
    if kind == "gemma3":
        cfg.update({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
                    "rope_local_base_freq": 10000.0})
    elif kind == "gemma2":
        cfg.update({"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2"})
    if wrap:
        from multimodal_checkpoint import wrap as to_multimodal
        tensors, cfg = to_multimodal(tensors, cfg, "gemma3", wrap == "gemma3-mm5")
    write(out, tensors, cfg, src)


if __name__ == "__main__":
    convert(*sys.argv[1:4])
