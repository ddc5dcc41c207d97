#!/usr/bin/env python3
"""Hugging Face references for config.json settings no model in ../shared/models uses
(tests/config_variants.sh): sliding-window attention, YaRN rope scaling and Granite's
multipliers.

usage: gen_variant_reference.py SHARED_MODELS OUTDIR

Each variant is a shared model with settings added to its config.json (the weights and
tokenizer as they are, tests/variant_model.py builds the directory); this writes, per variant,
OUTDIR/<variant>.safetensors in reference/logits.safetensors's layout (tests/compare_logits
reads both): input_ids_0, logits_0 (the prompt's prefill logits, one forward pass without a
cache), greedy_0 and greedy_logits_0 (greedy steps through the KV cache, no stop at EOS).
The prompt is the first PROMPT_LEN ids of the model's reference prompt 2. Loading as the
shared references do: float32 on the CPU, attn_implementation "eager". The metadata records
the config overrides, the library versions and how far the logits are from the same model
without them (they must matter).
"""
import json
import os
import shutil
import sys
import tempfile

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from variant_model import make_dir  # noqa: E402

PROMPT_LEN = 36
GREEDY = 12
VARIANTS = {
    # every layer slides (MistralModel: sliding_window set)
    "mistral-window8": ("tiny-mistral", {"sliding_window": 8}),
    # Qwen2: with use_sliding_window, the layers from max_window_layers on (1 and 2 of 3)
    "qwen2-window8-layers12": ("tiny-qwen2", {"use_sliding_window": True, "sliding_window": 8,
                                              "max_window_layers": 1}),
    # YaRN as Qwen2.5's model cards set it (factor 4 over the pretraining length), here 256
    "qwen2-yarn4": ("tiny-qwen2", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                    "original_max_position_embeddings": 256}}),
    # every optional YaRN key: the attention factor from mscale / mscale_all_dim, other
    # correction rotations, the range not rounded (head_dim 16)
    "mistral-yarn8-mscale": ("tiny-mistral", {"rope_scaling": {
        "rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 128, "beta_fast": 16,
        "beta_slow": 2, "mscale": 1.0, "mscale_all_dim": 0.5, "truncate": False}}),
    # Granite: Llama's weights under GraniteForCausalLM's four multipliers; tied embeddings
    # (stories260K) and not (tiny-mistral)
    "granite-stories": ("stories260K-hf", {"architectures": ["GraniteForCausalLM"], "model_type": "granite",
                                           "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
                                           "attention_multiplier": 0.3, "logits_scaling": 8.0}),
    "granite-mistral": ("tiny-mistral", {"architectures": ["GraniteForCausalLM"], "model_type": "granite",
                                         "embedding_multiplier": 6.0, "residual_multiplier": 0.5,
                                         "attention_multiplier": 0.2, "logits_scaling": 4.0}),
    # Gemma 3 (tiny-qwen3 converted by tests/gemma_checkpoint.py): norms of 1 + weight around
    # each block, GeLU, the embedding times sqrt(hidden) and tied, a sliding layer each side of
    # a full one, each with its rope base, the scores scaled by query_pre_attn_scalar 24
    "gemma3-window8": ("tiny-qwen3", {"sliding_window": 8, "query_pre_attn_scalar": 24,
                                      "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]},
                       "gemma3"),
    # Gemma 2 (the same, without q/k norms): every other layer sliding, one rope base, the
    # scores soft-capped at 0.5 and the logits at 20 (both bite on these weights)
    "gemma2-window8-caps": ("tiny-qwen3", {"sliding_window": 8, "query_pre_attn_scalar": 24,
                                           "attn_logit_softcapping": 0.5, "final_logit_softcapping": 20.0},
                            "gemma2"),
    # Gemma 1 (the same, Llama's layout): norms of 1 + weight, GeLU by its legacy name "gelu"
    "gemma1": ("tiny-qwen3", {}, "gemma"),
    # gemma3-window8 as the text model of a Gemma3ForConditionalGeneration checkpoint (the Hub's
    # layout, a tiny vision tower beside it), run by that class on text alone, with the 4B-27B
    # models' linear rope scaling of 8 (the full layers' rope only)
    "gemma3-mm-window8-linear8": ("tiny-qwen3", {"sliding_window": 8, "query_pre_attn_scalar": 24,
                                                 "layer_types": ["sliding_attention", "full_attention",
                                                                 "sliding_attention"],
                                                 "rope_scaling": {"rope_type": "linear", "factor": 8.0}},
                                  "gemma3-mm"),
    # tiny-mistral as the text model of a Mistral3ForConditionalGeneration checkpoint (Mistral Small
    # 3.1's layout and its rope base of 1e9), run by that class on text alone
    "mistral3-theta1e9": ("tiny-mistral", {"rope_theta": 1000000000.0}, "mistral3"),
}


def load(d):
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    # a multimodal checkpoint by its own class (its text model on text alone)
    cls = getattr(transformers, cfg["architectures"][0]) if "text_config" in cfg else transformers.AutoModelForCausalLM
    m = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    return m.eval()


@torch.no_grad()
def run(model, ids):
    prefill = model(torch.tensor([ids])).logits[0]
    out, logits = [], []
    res = model(torch.tensor([ids]), use_cache=True)
    past, last = res.past_key_values, res.logits[0, -1]
    for _ in range(GREEDY):
        t = int(torch.argmax(last))
        out.append(t)
        logits.append(last.clone())
        res = model(torch.tensor([[t]]), past_key_values=past, use_cache=True)
        past, last = res.past_key_values, res.logits[0, -1]
    # the same ids without the cache
    full = model(torch.tensor([ids + out[:-1]])).logits[0, len(ids) - 1:]
    assert [int(x) for x in torch.argmax(full, -1)] == out, "greedy ids differ without the cache"
    return prefill, out, torch.stack(logits), float((full - torch.stack(logits)).abs().max())


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    shared, outdir = sys.argv[1:3]
    os.makedirs(outdir, exist_ok=True)
    for name, (base, overrides, *convert) in VARIANTS.items():
        convert = convert[0] if convert else None
        src = os.path.join(shared, base)
        with safe_open(os.path.join(src, "reference", "logits.safetensors"), "pt") as f:
            ids = [int(x) for x in f.get_tensor("input_ids_2")[:PROMPT_LEN]]
        tmp = tempfile.mkdtemp()
        try:
            d = os.path.join(tmp, base)
            make_dir(src, overrides, d, convert)
            prefill, out, glogits, cache_d = run(load(d), ids)
            plain, plain_out, _, _ = run(load(src), ids)
        finally:
            shutil.rmtree(tmp)
        meta = {
            "model": base, "config_overrides": json.dumps(overrides),
            **({"convert": convert} if convert else {}),
            "made_by": "tests/gen_variant_reference.py", "torch": torch.__version__,
            "transformers": transformers.__version__,
            "prompt": "the first %d ids of reference prompt 2" % PROMPT_LEN,
            "max_abs_diff_cache_vs_no_cache": "%.3g" % cache_d,
            "max_abs_diff_without_overrides": "%.3g" % float((prefill - plain).abs().max()),
            "greedy_differs_without_overrides": str(out != plain_out),
        }
        save_file({"input_ids_0": torch.tensor(ids, dtype=torch.int32), "logits_0": prefill.contiguous(),
                   "greedy_0": torch.tensor(out, dtype=torch.int32), "greedy_logits_0": glogits.contiguous()},
                  os.path.join(outdir, name + ".safetensors"), metadata=meta)
        print(name, json.dumps(meta))


if __name__ == "__main__":
    main()
