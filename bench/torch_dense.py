#!/usr/bin/env python3
"""warmpool-bench --compute's PyTorch baseline: the dense model of a safetensors file, computed by
PyTorch in the file's dtype (its native bf16 path on CPUs is oneDNN), one call per request.

Usage: torch_dense.py MODEL.safetensors THREADS
Prints "ready IN_FEATURES" once the model is built; then for every line "ROWS" on stdin runs one
forward pass of ROWS rows and prints the milliseconds it took, timed here so that the pipe is not
counted. Exits at the end of stdin. The input values do not change the time; they are random.
"""
import json
import struct
import sys
import time

import numpy
import torch

DTYPES = {"BF16": (numpy.int16, torch.bfloat16), "F16": (numpy.float16, torch.float16),
          "F32": (numpy.float32, torch.float32)}


def read_layers(path):
    with open(path, "rb") as f:
        data = f.read()
    (header_bytes,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + header_bytes])
    metadata = header.pop("__metadata__", {})
    base = 8 + header_bytes

    def tensor(name):
        info = header[name]
        numpy_type, torch_type = DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        array = numpy.frombuffer(data, dtype=numpy_type, count=(end - begin) // numpy.dtype(numpy_type).itemsize,
                                 offset=base + begin).reshape(info["shape"]).copy()
        return torch.from_numpy(array).view(torch_type)

    indices = sorted(int(name.split(".")[0]) for name in header if name.endswith(".weight"))
    layers = [(tensor(f"{i}.weight"), tensor(f"{i}.bias") if f"{i}.bias" in header else None) for i in indices]
    return layers, metadata.get("activation", "relu")


def main():
    path, threads = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(threads)
    layers, activation = read_layers(path)
    act = {"relu": torch.relu, "gelu": torch.nn.functional.gelu, "tanh": torch.tanh, "none": lambda x: x}[activation]
    dtype = layers[0][0].dtype
    in_features = layers[0][0].shape[1]
    inputs = {}
    print(f"ready {in_features}", flush=True)
    with torch.no_grad():
        for line in sys.stdin:
            rows = int(line)
            if rows not in inputs:
                inputs[rows] = torch.rand(rows, in_features).to(dtype)
            x = inputs[rows]
            t0 = time.perf_counter()
            for i, (weight, bias) in enumerate(layers):
                x = torch.nn.functional.linear(x, weight, bias)
                if i + 1 < len(layers):
                    x = act(x)
            ms = (time.perf_counter() - t0) * 1e3
            print(f"{ms:.6f}", flush=True)


if __name__ == "__main__":
    main()
