"""Plain-Python safetensors files for the tests' checkpoint converters (gemma_checkpoint.py,
multimodal_checkpoint.py, fuse_checkpoint.py), so that tests rebuild their models without
torch: a file is an 8-byte header length, a JSON header and the tensors' raw bytes."""
import json
import os
import struct


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


def read(path):
    """{name: (shape, dtype, bytes)} in the file's order, and its __metadata__ (or None)"""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", None)
    tensors = {name: (h["shape"], h["dtype"], data[h["data_offsets"][0]:h["data_offsets"][1]])
               for name, h in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])}
    return tensors, meta


def write(out, tensors, cfg, src, meta=None):
    """OUT (made): model.safetensors of TENSORS ({name: (shape, dtype, bytes)}, in that order),
    config.json of CFG, and links to SRC's other files (the tokenizer's)"""
    os.makedirs(out)
    header, offset = {}, 0
    for name, (shape, dtype, blob) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
    if meta is not None:
        header["__metadata__"] = meta
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for _, _, blob in tensors.values():
            f.write(blob)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    for name in os.listdir(src):
        if name not in ("config.json", "model.safetensors") and os.path.isfile(os.path.join(src, name)):
            os.symlink(os.path.join(src, name), os.path.join(out, name))
