#!/usr/bin/env python3
"""Independent safetensors reader/writer (json + struct + numpy) for kiln's tests.

  safetensors_ref.py read FILE OUT_JSON   -> {"metadata": {...}, "tensors": {name: {dtype, shape, values}}}
  safetensors_ref.py write FILE           -> writes the fixed tensors below, unpadded header, name order
"""
import json
import struct
import sys

import numpy as np

NP = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
      "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def read(path, out):
    data = open(path, "rb").read()
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + n])
    base = 8 + n
    res = {"metadata": header.pop("__metadata__", {}), "tensors": {}}
    for name, e in header.items():
        b, en = e["data_offsets"]
        arr = np.frombuffer(data[base + b:base + en], dtype=NP[e["dtype"]])
        res["tensors"][name] = {"dtype": e["dtype"], "shape": e["shape"],
                                "values": [float(x) for x in arr.reshape(-1)]}
    json.dump(res, open(out, "w"))


def write(path):
    tensors = {
        "a.weight": np.arange(6, dtype=np.float32).reshape(2, 3) * 0.5 - 1.0,
        "b.bias": np.array([1.5, -2.25, 3.0, 0.0], dtype=np.float16),
        "c.ids": np.array([-3, 0, 7, 1 << 40], dtype=np.int64),
        "d.mask": np.array([[1, 0], [0, 1], [1, 1]], dtype=np.uint8),
    }
    names = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
             np.dtype(np.int64): "I64", np.dtype(np.uint8): "U8"}
    header, blobs, off = {"__metadata__": {"format": "pt", "who": "python"}}, [], 0
    for name in sorted(tensors):
        t = tensors[name]
        raw = t.tobytes()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


if __name__ == "__main__":
    if sys.argv[1] == "read":
        read(sys.argv[2], sys.argv[3])
    else:
        write(sys.argv[2])
