#!/usr/bin/env python3
"""usage: multimodal_checkpoint.py SRC OUT gemma3|mistral3 [new]

A text model (SRC: one model.safetensors, a Gemma3ForCausalLM or MistralForCausalLM directory)
as the text model of a multimodal checkpoint, as the Hub has them: Gemma3ForConditionalGeneration
or Mistral3ForConditionalGeneration with transformers < 4.52's names (language_model.model.X,
language_model.lm_head.weight) or, with "new", later ones' (model.language_model.X, lm_head);
config.json's text_config holds the text model's config (Gemma 3's giving only what differs
from Gemma3TextConfig's defaults), the dtype and token ids at the top level; beside it a few
tensors of a tiny vision tower and projector, of the shapes the class expects (it initialises
the rest). The tokenizer files are linked. Plain Python, so that tests rebuild it without
torch (checkpoint_io.py); gemma_checkpoint.py calls wrap(), variant_model.py convert()."""
import json
import os
import sys

from checkpoint_io import bf16_bytes, read, write

# a tiny vision tower each (two 14-pixel patches a side) and the names of some of its and its
# projector's tensors, with their shapes (v: the tower's width)
KINDS = {
    "gemma3": {
        "architecture": "Gemma3ForConditionalGeneration", "model_type": "gemma3", "text_model_type": "gemma3_text",
        "extra": {"mm_tokens_per_image": 4},
        "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 16, "intermediate_size": 32,
                          "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 28, "patch_size": 14,
                          "vision_use_head": False},
        "vision": {"vision_tower.vision_model.embeddings.patch_embedding.weight": ["v", 3, 14, 14],
                   "vision_tower.vision_model.embeddings.patch_embedding.bias": ["v"],
                   "vision_tower.vision_model.embeddings.position_embedding.weight": [4, "v"],
                   "vision_tower.vision_model.post_layernorm.weight": ["v"],
                   "vision_tower.vision_model.post_layernorm.bias": ["v"],
                   "multi_modal_projector.mm_input_projection_weight": ["v", "hidden"],
                   "multi_modal_projector.mm_soft_emb_norm.weight": ["v"]},
        # Gemma3TextConfig's defaults: the Hub's text_config leaves these values out
        "defaults": {"rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
                     "hidden_activation": "gelu_pytorch_tanh", "attention_bias": False, "rope_scaling": None},
    },
    "mistral3": {
        "architecture": "Mistral3ForConditionalGeneration", "model_type": "mistral3", "text_model_type": "mistral",
        "extra": {"spatial_merge_size": 2, "image_token_index": 10},
        "vision_config": {"model_type": "pixtral", "hidden_size": 16, "intermediate_size": 32,
                          "num_hidden_layers": 1, "num_attention_heads": 2, "head_dim": 8, "image_size": 28,
                          "patch_size": 14},
        "vision": {"vision_tower.ln_pre.weight": ["v"], "multi_modal_projector.norm.weight": ["v"]},
        "defaults": {},
    },
}


def vision_tensors(kind, hidden):
    k = KINDS[kind]
    out = {}
    for name, shape in k["vision"].items():
        shape = [k["vision_config"]["hidden_size"] if d == "v" else hidden if d == "hidden" else d for d in shape]
        n = 1
        for d in shape:
            n *= d
        out[name] = (shape, "BF16", bf16_bytes([((i * 37) % 17 - 8) / 64.0 for i in range(n)]))
    return out


def wrap(tensors, cfg, kind, new_names=False):
    """(tensors {name: (shape, dtype, bytes)}, config) of a text model -> the multimodal checkpoint's"""
    k = KINDS[kind]
    renamed = {}
    for name, t in tensors.items():
        if name == "lm_head.weight":
            renamed[name if new_names else "language_model.lm_head.weight"] = t
        else:
            assert name.startswith("model."), name
            renamed[("model.language_model." if new_names else "language_model.model.") + name[6:]] = t
    for name, t in vision_tensors(kind, cfg["hidden_size"]).items():
        renamed[("model." if new_names else "") + name] = t
    top = {"architectures": [k["architecture"]], "model_type": k["model_type"], **k["extra"],
           "vision_config": k["vision_config"]}
    text = dict(cfg)
    for key in ("torch_dtype", "bos_token_id", "eos_token_id"):
        if key in text:
            top[key] = text.pop(key)
    for key in ("architectures", "transformers_version"):
        text.pop(key, None)
    if kind == "gemma3":  # tied, as Gemma3Config is by default
        text.pop("tie_word_embeddings", None)
    for key, v in k["defaults"].items():
        if key in text and text[key] == v:
            del text[key]
    text["model_type"] = k["text_model_type"]
    top["text_config"] = text
    return renamed, top


def convert(src, out, kind, new_names=False):
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    tensors, top = wrap(read(os.path.join(src, "model.safetensors"))[0], cfg, kind, new_names)
    write(out, tensors, top, src)


if __name__ == "__main__":
    convert(sys.argv[1], sys.argv[2], sys.argv[3], len(sys.argv) > 4 and sys.argv[4] == "new")
