#!/usr/bin/env python3
"""usage: fuse_checkpoint.py SRC OUT

A Phi3ForCausalLM checkpoint in OUT made of the Llama-layout model in SRC (one
model.safetensors, no biases, no rope scaling): each layer's q_proj, k_proj and v_proj
weights concatenated by rows into self_attn.qkv_proj.weight, gate_proj and up_proj into
mlp.gate_up_proj.weight (Phi-3's layout, what Hugging Face's Phi3Attention and Phi3MLP split
again), every other tensor as it is; config.json with Phi-3's architecture, the tokenizer
files linked. The two models compute the same function, so the Phi-3 one must give SRC's
Hugging Face reference logits (tests/fused_weights.sh). Plain Python: the safetensors layout
is an 8-byte header length, a JSON header and the raw bytes, so rows concatenate as bytes."""
import json
import os
import re
import sys

from checkpoint_io import read, write

src, out = sys.argv[1:3]
header, meta = read(os.path.join(src, "model.safetensors"))

tensors = {}  # name -> (shape, dtype, bytes), in the order written
for name, t in header.items():
    m = re.match(r"model\.layers\.(\d+)\.(self_attn|mlp)\.(q|k|v|gate|up)_proj\.weight$", name)
    if not m:
        tensors[name] = t
        continue
    layer, block, which = m.groups()
    fused, parts = (("self_attn.qkv_proj.weight", "qkv") if block == "self_attn"
                    else ("mlp.gate_up_proj.weight", ("gate", "up")))
    if which != parts[0]:
        continue  # written with the first part
    names = ["model.layers.%s.%s.%s_proj.weight" % (layer, block, p) for p in parts]
    shapes = [header[x][0] for x in names]
    assert len({header[x][1] for x in names}) == 1 and len({s[1] for s in shapes}) == 1
    tensors["model.layers.%s.%s" % (layer, fused)] = (
        [sum(s[0] for s in shapes), shapes[0][1]], header[names[0]][1], b"".join(header[x][2] for x in names))

with open(os.path.join(src, "config.json")) as f:
    cfg = json.load(f)
assert not cfg.get("rope_scaling") and not cfg.get("attention_bias") and not cfg.get("mlp_bias")
cfg.update(architectures=["Phi3ForCausalLM"], model_type="phi3", pad_token_id=None)
cfg.pop("sliding_window", None)
write(out, tensors, cfg, src, meta)
