"""swap_tensor_shape.py FILE TENSOR: reverse the shape of TENSOR in the header of the
.safetensors FILE, in place. The file stays valid (same byte count, same data); the shape no
longer fits the model, so only the ranks that load that tensor fail (tests/rank_failure.sh,
tests/gpu/rank_death.sh)."""
import json
import struct
import sys

path, name = sys.argv[1], sys.argv[2]
raw = open(path, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
header[name]["shape"] = header[name]["shape"][::-1]
text = json.dumps(header, separators=(",", ":")).encode()
text += b" " * (n - len(text))
assert len(text) == n
open(path, "wb").write(raw[:8] + text + raw[8 + n:])
