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
import struct
import sys


def bf16_values(blob):
    """bfloat16 bytes -> floats (each the high half of a float32)"""
    n = len(blob) // 2
    return list(struct.unpack("<%df" % n, b"".join(b"\0\0" + blob[2 * i:2 * i + 2] for i in range(n))))


def bf16_bytes(values):
    """floats -> bfloat16 bytes, rounded to nearest even as torch rounds"""
    out = bytearray()
    for v in values:
        u = struct.unpack("<I", struct.pack("<f", v))[0]
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        out += struct.pack("<H", u)
    return bytes(out)


def convert(src, out, kind="gemma3"):
    assert kind in ("gemma", "gemma2", "gemma3", "gemma3-mm", "gemma3-mm5"), kind
    wrap = kind.startswith("gemma3-mm") and kind
    kind = "gemma3" if wrap else kind
    with open(os.path.join(src, "model.safetensors"), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)

    def raw(name):
        a, b = header[name]["data_offsets"]
        assert header[name]["dtype"] == "BF16", name
        return data[a:b]

    def less_one(name, reverse=False):
        v = bf16_values(raw(name))
        return bf16_bytes([x - 1.0 for x in (v[::-1] if reverse else v)])

    tensors = {}  # name -> (shape, bytes)
    for name in sorted(header, key=lambda k: header[k]["data_offsets"][0]):
        shape = header[name]["shape"]
        if name == "lm_head.weight":
            continue
        m = re.match(r"(model\.layers\.\d+\.)(.*)$", name)
        if name == "model.norm.weight":
            tensors[name] = (shape, less_one(name))
        elif not m:
            tensors[name] = (shape, raw(name))
        elif m.group(2) == "input_layernorm.weight":
            tensors[name] = (shape, less_one(name))
            if kind != "gemma":
                tensors[m.group(1) + "post_attention_layernorm.weight"] = (shape, less_one(name, True))
        elif m.group(2) == "post_attention_layernorm.weight" and kind == "gemma":  # the MLP's input norm
            tensors[name] = (shape, less_one(name))
        elif m.group(2) == "post_attention_layernorm.weight":
            tensors[m.group(1) + "pre_feedforward_layernorm.weight"] = (shape, less_one(name))
            tensors[m.group(1) + "post_feedforward_layernorm.weight"] = (shape, less_one(name, True))
        elif m.group(2) in ("self_attn.q_norm.weight", "self_attn.k_norm.weight"):
            if kind == "gemma3":  # Gemma 2 has none
                tensors[name] = (shape, less_one(name))
        else:
            tensors[name] = (shape, raw(name))

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
        tensors = {name: (shape, "BF16", blob) for name, (shape, blob) in tensors.items()}
        tensors, cfg = to_multimodal(tensors, cfg, "gemma3", wrap == "gemma3-mm5")
        tensors = {name: (shape, blob) for name, (shape, _, blob) in tensors.items()}

    os.makedirs(out)
    new_header, offset = {}, 0
    for name, (shape, blob) in tensors.items():
        new_header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
    head = json.dumps(new_header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for _, blob in tensors.values():
            f.write(blob)

    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    for name in os.listdir(src):
        if name not in ("config.json", "model.safetensors") and os.path.isfile(os.path.join(src, name)):
            os.symlink(os.path.join(src, name), os.path.join(out, name))


if __name__ == "__main__":
    convert(*sys.argv[1:4])
