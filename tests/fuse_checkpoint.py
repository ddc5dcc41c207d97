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
import struct
import sys

src, out = sys.argv[1:3]
with open(os.path.join(src, "model.safetensors"), "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    data = f.read()
meta = header.pop("__metadata__", None)


def raw(name):
    a, b = header[name]["data_offsets"]
    return data[a:b]


tensors = {}  # name -> (dtype, shape, bytes), in the order written
for name in sorted(header, key=lambda k: header[k]["data_offsets"][0]):
    m = re.match(r"model\.layers\.(\d+)\.(self_attn|mlp)\.(q|k|v|gate|up)_proj\.weight$", name)
    if not m:
        tensors[name] = (header[name]["dtype"], header[name]["shape"], raw(name))
        continue
    layer, block, which = m.groups()
    fused, parts = (("self_attn.qkv_proj.weight", "qkv") if block == "self_attn"
                    else ("mlp.gate_up_proj.weight", ("gate", "up")))
    if which != parts[0]:
        continue  # written with the first part
    names = ["model.layers.%s.%s.%s_proj.weight" % (layer, block, p) for p in parts]
    shapes = [header[x]["shape"] for x in names]
    assert len({header[x]["dtype"] for x in names}) == 1 and len({s[1] for s in shapes}) == 1
    tensors["model.layers.%s.%s" % (layer, fused)] = (
        header[names[0]]["dtype"], [sum(s[0] for s in shapes), shapes[0][1]], b"".join(raw(x) for x in names))

os.makedirs(out)
new_header, offset = {}, 0
for name, (dtype, shape, blob) in tensors.items():
    new_header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
    offset += len(blob)
if meta is not None:
    new_header["__metadata__"] = meta
text = json.dumps(new_header).encode()
text += b" " * (-len(text) % 8)
with open(os.path.join(out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(text)))
    f.write(text)
    for _, _, blob in tensors.values():
        f.write(blob)

with open(os.path.join(src, "config.json")) as f:
    cfg = json.load(f)
assert not cfg.get("rope_scaling") and not cfg.get("attention_bias") and not cfg.get("mlp_bias")
cfg.update(architectures=["Phi3ForCausalLM"], model_type="phi3", pad_token_id=None)
cfg.pop("sliding_window", None)
with open(os.path.join(out, "config.json"), "w") as f:
    json.dump(cfg, f, indent=1)
for name in os.listdir(src):
    if name not in ("config.json", "model.safetensors") and os.path.isfile(os.path.join(src, name)):
        os.symlink(os.path.join(src, name), os.path.join(out, name))
