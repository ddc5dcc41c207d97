#!/usr/bin/env python3
"""tests/gpu/hf_bf16.py MODELS_DIR: how far Hugging Face transformers itself, run in bfloat16
on the GPU, departs from the float32 references of shared/models -- the yardstick for
tpinfer's own bfloat16 results (tests/gpu/run.sh applies the issue's rule: greedy ids equal
up to the first step whose reference margin is under 0.05).

For every model with reference/logits.safetensors and every prompt k: the prefill logits'
max |d| against logits_k, and where the reference has greedy_k (stories260K's has none for its
last prompt) greedy decoding of the reference's length compared with it: the first step that differs and the reference's margin (top-1 minus top-2 of
greedy_logits_k) there. Prints one markdown row per (model, prompt)."""
import os
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def main():
    models = sys.argv[1]
    print("| model | prompt | prefill max abs diff | greedy ids equal for | reference margin where they part |")
    print("| --- | --- | --- | --- | --- |")
    for name in sorted(os.listdir(models)):
        ref_path = os.path.join(models, name, "reference", "logits.safetensors")
        if not os.path.exists(ref_path):
            continue
        ref = load_file(ref_path)
        model = AutoModelForCausalLM.from_pretrained(os.path.join(models, name), dtype=torch.bfloat16).cuda().eval()
        k = 0
        while f"input_ids_{k}" in ref:
            ids = ref[f"input_ids_{k}"].long().cuda()[None]
            with torch.no_grad():
                pre = model(ids).logits[0].float().cpu()
            d = (pre - ref[f"logits_{k}"]).abs().max().item()
            if f"greedy_{k}" not in ref:  # stories260K's prompt 3: prefill logits only
                print(f"| {name} | {k} | {d:.3f} | (no greedy reference) | - |", flush=True)
                k += 1
                continue
            want = ref[f"greedy_{k}"].tolist()
            with torch.no_grad():
                out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=len(want),
                                     min_new_tokens=len(want), do_sample=False, pad_token_id=0)
            got = out[0, ids.shape[1]:].tolist()
            same = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), len(want))
            margin = "-"
            if same < len(want):
                top2 = torch.topk(ref[f"greedy_logits_{k}"][same], 2).values
                margin = "%.3f" % (top2[0] - top2[1]).item()
            print(f"| {name} | {k} | {d:.3f} | {same} of {len(want)} | {margin} |", flush=True)
            k += 1


if __name__ == "__main__":
    main()
