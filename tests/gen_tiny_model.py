#!/usr/bin/env python3
"""Write a tiny Llama-shaped Hugging Face model directory with deterministic random
weights and a small byte-level BPE tokenizer: what a fresh clone runs on, and what the
tests use when ../shared is absent. Standard library only.

usage: gen_tiny_model.py DIR [--dtype float32|bfloat16] [--shards N] [--seed S]
                          [--hidden H --layers L --heads N --kv-heads K --intermediate I --vocab V]
                          [--attention-bias] [--mlp-bias]
                          [--prompts FILE [--prompt-lengths N,N,... --max-tokens N]]
--prompts also writes FILE: JSONL requests p0, p1, ... of random token ids of those lengths
(the same for any seed), greedy to max_tokens with ignore_eos: what a backend comparison runs.
--attention-bias gives q, k, v and o biases, --mlp-bias gate, up and down ones.
Larger shapes (the CPU benchmark's ~100M-parameter model) use numpy when it is there.
"""
import argparse
import json
import os
import random
import struct

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 8,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "bos_token_id": 256,
    "eos_token_id": 257,
}


def bytes_to_unicode():
    """GPT-2's map from bytes to printable characters (the ByteLevel alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def tokenizer(n_merges):
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    specials = ["<|begin_of_text|>", "<|end_of_text|>"]
    for i, s in enumerate(specials):
        vocab[s] = 256 + i
    # Merges of frequent English pairs, learned from nothing: a fixed list is enough
    # to exercise the BPE path deterministically.
    text = ("once upon a time there was a little girl who lived in the woods with her "
            "mother and the sun was shining on the water and the birds were singing")
    words = [[b2u[b] for b in (" " + w if i else w).encode()] for i, w in enumerate(text.split())]
    merges = []
    while len(merges) < n_merges:
        counts = {}
        for w in words:
            for a, b in zip(w, w[1:]):
                counts[(a, b)] = counts.get((a, b), 0) + 1
        if not counts:
            break
        best = max(sorted(counts), key=lambda p: counts[p])
        merges.append(best)
        vocab.setdefault(best[0] + best[1], len(vocab))
        for w in words:
            i = 0
            while i < len(w) - 1:
                if (w[i], w[i + 1]) == best:
                    w[i:i + 2] = [best[0] + best[1]]
                i += 1
    added = [{"id": 256 + i, "content": s, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True}
             for i, s in enumerate(specials)]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [256],
                                                     "tokens": ["<|begin_of_text|>"]}},
        },
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [a + " " + b for a, b in merges]},
    }


def weight_specs(c):
    h, i, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    q = c["num_attention_heads"] * c["head_dim"]
    kv = c["num_key_value_heads"] * c["head_dim"]
    specs = [("model.embed_tokens.weight", [v, h], 0.5)]
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        specs += [(p + "input_layernorm.weight", [h], None),
                  (p + "self_attn.q_proj.weight", [q, h], 0.1),
                  (p + "self_attn.k_proj.weight", [kv, h], 0.1),
                  (p + "self_attn.v_proj.weight", [kv, h], 0.1),
                  (p + "self_attn.o_proj.weight", [h, q], 0.1),
                  (p + "post_attention_layernorm.weight", [h], None),
                  (p + "mlp.gate_proj.weight", [i, h], 0.1),
                  (p + "mlp.up_proj.weight", [i, h], 0.1),
                  (p + "mlp.down_proj.weight", [h, i], 0.1)]
        if c["attention_bias"]:
            specs += [(p + "self_attn.q_proj.bias", [q], 0.1), (p + "self_attn.k_proj.bias", [kv], 0.1),
                      (p + "self_attn.v_proj.bias", [kv], 0.1), (p + "self_attn.o_proj.bias", [h], 0.1)]
        if c["mlp_bias"]:
            specs += [(p + "mlp.gate_proj.bias", [i], 0.1), (p + "mlp.up_proj.bias", [i], 0.1),
                      (p + "mlp.down_proj.bias", [h], 0.1)]
    specs += [("model.norm.weight", [h], None), ("lm_head.weight", [v, h], 0.25)]
    return specs


def random_tensor(rng, np_rng, n, std, dtype):
    """n values N(0, std), or 1 + N(0, 0.1) for a norm weight (std None), encoded."""
    if np_rng is not None:
        import numpy as np
        v = np_rng.standard_normal(n, dtype=np.float32) * np.float32(0.1 if std is None else std)
        if std is None:
            v += np.float32(1.0)
        if dtype == "float32":
            return v.astype("<f4").tobytes()
        u = v.view(np.uint32).astype(np.uint64)
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        return u.astype("<u2").tobytes()
    vals = [1.0 + rng.gauss(0, 0.1) if std is None else rng.gauss(0, std) for _ in range(n)]
    return encode(vals, dtype)


def encode(values, dtype):
    if dtype == "float32":
        return struct.pack("<%df" % len(values), *values)
    out = bytearray()
    for x in values:  # float32 -> bfloat16, round to nearest even
        u = struct.unpack("<I", struct.pack("<f", x))[0]
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        out += struct.pack("<H", u)
    return bytes(out)


def write_safetensors(path, tensors, dtype):
    header, blobs, off = {}, [], 0
    for name, shape, data in tensors:
        header[name] = {"dtype": "F32" if dtype == "float32" else "BF16", "shape": shape,
                        "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    header["__metadata__"] = {"format": "pt", "generator": "tpinfer tests/gen_tiny_model.py"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1234)
    for k in ("hidden", "layers", "heads", "kv-heads", "intermediate", "vocab"):
        ap.add_argument("--" + k, type=int)
    ap.add_argument("--attention-bias", action="store_true")
    ap.add_argument("--mlp-bias", action="store_true")
    ap.add_argument("--prompts")
    ap.add_argument("--prompt-lengths", default="70,130,200,16,96")
    ap.add_argument("--max-tokens", type=int, default=24)
    a = ap.parse_args()

    tok = tokenizer(48)
    cfg = dict(CONFIG, torch_dtype=a.dtype)
    cfg["vocab_size"] = (len(tok["model"]["vocab"]) + 15) // 16 * 16
    for arg, key in (("hidden", "hidden_size"), ("layers", "num_hidden_layers"),
                     ("heads", "num_attention_heads"), ("kv_heads", "num_key_value_heads"),
                     ("intermediate", "intermediate_size"), ("vocab", "vocab_size")):
        if getattr(a, arg) is not None:
            cfg[key] = getattr(a, arg)
    cfg["head_dim"] = cfg["hidden_size"] // cfg["num_attention_heads"]
    cfg["attention_bias"], cfg["mlp_bias"] = a.attention_bias, a.mlp_bias
    custom = any(getattr(a, k) is not None for k in ("hidden", "layers", "heads", "kv_heads",
                                                      "intermediate", "vocab"))
    np_rng = None
    if custom:  # the default tiny model stays pure Python, so it is the same everywhere
        try:
            import numpy
            np_rng = numpy.random.default_rng(a.seed)
        except ImportError:
            pass
    rng = random.Random(a.seed)
    tensors = []
    for name, shape, std in weight_specs(cfg):
        n = 1
        for d in shape:
            n *= d
        tensors.append((name, shape, random_tensor(rng, np_rng, n, std, a.dtype)))

    os.makedirs(a.dir, exist_ok=True)
    if a.shards <= 1:
        write_safetensors(os.path.join(a.dir, "model.safetensors"), tensors, a.dtype)
    else:
        per = (len(tensors) + a.shards - 1) // a.shards
        weight_map, total = {}, 0
        for s in range(a.shards):
            part = tensors[s * per:(s + 1) * per]
            fname = "model-%05d-of-%05d.safetensors" % (s + 1, a.shards)
            write_safetensors(os.path.join(a.dir, fname), part, a.dtype)
            for name, _, data in part:
                weight_map[name] = fname
                total += len(data)
        with open(os.path.join(a.dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(a.dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(a.dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 256, "eos_token_id": 257, "do_sample": False}, f, indent=2)
    with open(os.path.join(a.dir, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
    with open(os.path.join(a.dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
                   "eos_token": "<|end_of_text|>", "model_max_length": 256,
                   "add_bos_token": True}, f, indent=2)
    if a.prompts:
        prng = random.Random(7)
        with open(a.prompts, "w") as f:
            for k, n in enumerate(int(x) for x in a.prompt_lengths.split(",")):
                ids = [prng.randrange(3, cfg["vocab_size"] - 3) for _ in range(n)]
                f.write(json.dumps({"id": "p%d" % k, "prompt_token_ids": ids, "max_tokens": a.max_tokens,
                                    "ignore_eos": True}) + "\n")


if __name__ == "__main__":
    main()
