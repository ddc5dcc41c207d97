#!/usr/bin/env python3
"""Hugging Face transformers generate() throughput on a model directory: the baseline that
bench/gpu_decode.sh compares tpinfer against.

usage: hf_baseline.py --model DIR [--prompts FILE] [--batches "1 128"] [--new-tokens 128]
                      [--device cuda] [--dtype bfloat16] [--attn sdpa|eager]

Loads DIR with transformers (transformers' default attention unless --attn), then for each
batch size B runs greedy generate() on the first B prompts of FILE (tpinfer JSONL lines with
prompt_token_ids, all of one length; without FILE, 128-token prompts made like the
benchmark's) with min_new_tokens = max_new_tokens, after a short warm-up at the same batch.
Prints one JSON object per line: {"event": "load", ...}, then per batch
{"batch", "prompt_len", "new_tokens", "seconds", "tok_s", "total_tok_s", "ms_per_step",
"prefill_seconds", "decode_tok_s"}; tok_s counts generated tokens over the whole generate()
call, prefill included, as tpinfer's generated tok/s does; prefill_seconds is a generate() of
one token on the same prompts, and decode_tok_s the tokens after the first over the rest of
the time (what tpinfer's batch / inter-token latency compares with). Each line is flushed as it is measured, so a run stopped by a time
limit keeps the batches it finished.
"""
import argparse
import json
import sys
import time


def emit(obj):
    print(json.dumps(obj), flush=True)


def load_prompts(path, prompt_len):
    if not path:
        return [[1 + (t * 31 + r * 17) % 250 for t in range(prompt_len)] for r in range(128)]
    rows = []
    with open(path) as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line)["prompt_token_ids"])
    if not rows or len({len(r) for r in rows}) != 1:
        sys.exit("%s: need prompts of one length (no padding here)" % path)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts")
    ap.add_argument("--prompt-len", type=int, default=128, help="without --prompts")
    ap.add_argument("--batches", default="1 128", help="batch sizes, spaces or commas")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--warmup-tokens", type=int, default=4)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--attn", help="attn_implementation (eager, sdpa); default: transformers'")
    a = ap.parse_args()
    batches = [int(b) for b in a.batches.replace(",", " ").split()]
    prompts = load_prompts(a.prompts, a.prompt_len)

    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, a.dtype)
    kw = {"attn_implementation": a.attn} if a.attn else {}
    t0 = time.perf_counter()
    model = None
    # straight onto the device where accelerate is installed (device_map needs it), else load
    # then move; torch_dtype for transformers before 4.56
    for extra in ({"dtype": dtype, "device_map": a.device}, {"dtype": dtype}, {"torch_dtype": dtype}):
        try:
            model = AutoModelForCausalLM.from_pretrained(a.model, **extra, **kw)
            break
        except (TypeError, ValueError, ImportError) as e:
            print("from_pretrained(%s): %s" % (", ".join(extra), e), file=sys.stderr)
    if model is None:
        sys.exit("cannot load %s with transformers %s" % (a.model, transformers.__version__))
    model.to(a.device).eval()
    cuda = a.device.startswith("cuda")

    def sync():
        if cuda:
            torch.cuda.synchronize()

    sync()
    emit({"event": "load", "seconds": round(time.perf_counter() - t0, 3), "transformers": transformers.__version__,
          "torch": torch.__version__, "device": torch.cuda.get_device_name() if cuda else a.device,
          "dtype": a.dtype, "attn": getattr(model.config, "_attn_implementation", None)})
    eos = model.generation_config.eos_token_id
    pad = eos[0] if isinstance(eos, list) else eos

    def generate(ids, n):
        return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                              max_new_tokens=n, min_new_tokens=n, pad_token_id=pad)

    with torch.inference_mode():
        for b in batches:
            rows = [prompts[r % len(prompts)] for r in range(b)]
            ids = torch.tensor(rows, dtype=torch.long, device=a.device)
            if a.warmup_tokens > 0:
                generate(ids, a.warmup_tokens)
            sync()
            t = time.perf_counter()
            out = generate(ids, a.new_tokens)
            sync()
            dt = time.perf_counter() - t
            new = out.shape[1] - ids.shape[1]
            t = time.perf_counter()
            generate(ids, 1)
            sync()
            pre = time.perf_counter() - t
            emit({"batch": b, "attn": getattr(model.config, "_attn_implementation", None),
                  "prompt_len": ids.shape[1], "new_tokens": new, "seconds": round(dt, 4),
                  "tok_s": b * new / dt, "total_tok_s": b * (ids.shape[1] + new) / dt,
                  "ms_per_step": 1e3 * dt / new, "prefill_seconds": round(pre, 4),
                  "decode_tok_s": b * (new - 1) / (dt - pre) if new > 1 and dt > pre else None})


if __name__ == "__main__":
    main()
