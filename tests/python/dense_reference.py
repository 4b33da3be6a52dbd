"""An independent numpy reference for the dense engine: reads a safetensors model file (8-byte
little-endian header length, JSON header, data area) and computes the MLP's forward pass in
float64, the way tests/unit/dense_reference.h does (activation between layers, none after the
last; inputs of a bf16 layer narrowed to bf16 as the CPU engine does)."""

import json
import math
import struct

import numpy as np

_ACTIVATIONS = {
    "relu": lambda x: np.maximum(x, 0.0),
    "gelu": lambda x: 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0))),
    "tanh": np.tanh,
    "none": lambda x: x,
}


def _bf16_to_float(raw):
    return (raw.astype(np.uint32) << 16).view(np.float32)


def _float_to_bf16_float(x):
    """x rounded to bf16 (nearest even) and back, as engines/half.h FloatToBF16 does."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((bits + (0x7FFF + ((bits >> 16) & 1))) >> 16).astype(np.uint16)
    return _bf16_to_float(rounded).astype(np.float64)


def read_safetensors(path):
    """{name: (dtype name, float64 array)}, metadata dict."""
    with open(path, "rb") as f:
        data = f.read()
    (header_len,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + header_len])
    base = 8 + header_len
    metadata = header.pop("__metadata__", {})
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        raw = data[base + begin:base + end]
        dtype = info["dtype"]
        if dtype == "F32":
            values = np.frombuffer(raw, dtype="<f4")
        elif dtype == "F16":
            values = np.frombuffer(raw, dtype="<f2")
        elif dtype == "BF16":
            values = _bf16_to_float(np.frombuffer(raw, dtype="<u2"))
        else:
            raise ValueError(f"{path}: tensor {name} has dtype {dtype}, not F32, F16 or BF16")
        tensors[name] = (dtype, values.astype(np.float64).reshape(info["shape"]))
    return tensors, metadata


def in_out_features(path):
    layers, _ = _layers(path)
    return layers[0][1].shape[1], layers[-1][1].shape[0]


def _layers(path):
    tensors, metadata = read_safetensors(path)
    indices = sorted({int(name.split(".")[0]) for name in tensors})
    layers = []
    for index in indices:
        dtype, weight = tensors[f"{index}.weight"]
        bias = tensors.get(f"{index}.bias", (None, None))[1]
        layers.append((dtype, weight, bias))
    return layers, metadata.get("activation", "relu")


def forward(path, x):
    """The model's output on x (rows x in_features), float64."""
    layers, activation = _layers(path)
    x = np.asarray(x, dtype=np.float64)
    for i, (dtype, weight, bias) in enumerate(layers):
        if dtype == "BF16":
            x = _float_to_bf16_float(x)
        y = x @ weight.T
        if bias is not None:
            y = y + bias
        x = _ACTIVATIONS[activation](y) if i + 1 < len(layers) else y
    return x


def has_bf16(path):
    layers, _ = _layers(path)
    return any(dtype == "BF16" for dtype, _, _ in layers)


def assert_matches(path, x, got):
    """got is the engine's output on x, within the CPU engine's tolerance
    (tests/unit/dense_reference.h CpuTolerance)."""
    want = forward(path, x)
    assert got.dtype == np.float32
    assert got.shape == want.shape, f"output shape {got.shape}, expected {want.shape}"
    relative, absolute = (1e-3, 2e-3) if has_bf16(path) else (1e-4, 1e-5)
    np.testing.assert_allclose(got, want, rtol=relative, atol=absolute)
