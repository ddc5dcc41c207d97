#!/usr/bin/env python3
"""usage: variant_model.py REF MODELS OUT [new]

The model directory a config-variant reference (tests/data/variants/*.safetensors, made by
tests/gen_variant_reference.py) was computed on: OUT gets links to the files of its base model
in MODELS (the reference's metadata names it) and config.json with the reference's overrides;
where the metadata names a conversion ("gemma", "gemma2", "gemma3", "gemma3-mm":
tests/gemma_checkpoint.py; "mistral3": tests/multimodal_checkpoint.py), OUT is the base model
converted, then overridden (a multimodal config.json's text_config); "new": a multimodal
checkpoint in transformers >= 4.52's layout. Prints the base model's directory. gen_variant_reference.py
makes its directories with make_dir."""
import json
import os
import struct
import sys


def make_dir(src, overrides, out, convert=None, new_names=False):
    """OUT: links to SRC's files but config.json, which is SRC's updated with OVERRIDES; with
    CONVERT ("gemma", "gemma2", "gemma3", "gemma3-mm": gemma_checkpoint.py; "mistral3":
    multimodal_checkpoint.py), SRC converted, then its config.json updated"""
    if convert in ("gemma", "gemma2", "gemma3", "gemma3-mm"):
        from gemma_checkpoint import convert as to_gemma
        to_gemma(src, out, convert + ("5" if new_names and convert == "gemma3-mm" else ""))
        src = out
    elif convert == "mistral3":
        from multimodal_checkpoint import convert as to_multimodal
        to_multimodal(src, out, convert, new_names)
        src = out
    elif convert:
        sys.exit("variant_model.py: unknown conversion %r" % convert)
    else:
        os.makedirs(out)
        for name in os.listdir(src):
            if name != "config.json" and os.path.isfile(os.path.join(src, name)):
                os.symlink(os.path.join(src, name), os.path.join(out, name))
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    cfg.get("text_config", cfg).update(overrides)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f)


def main():
    ref, models, out = sys.argv[1:4]
    with open(ref, "rb") as f:
        meta = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))["__metadata__"]
    src = os.path.join(models, meta["model"])
    make_dir(src, json.loads(meta["config_overrides"]), out, meta.get("convert"), sys.argv[4:5] == ["new"])
    print(src)


if __name__ == "__main__":
    main()
