"""Typed tensors (InferRequest.inputs, engine ABI version 5): numpy arrays in and out, by name.

Inputs: a dict of name to value. A numpy array keeps its dtype, which must be float32, float16,
int32 or int64 (any byte order); ``BF16(array)`` sends bfloat16 (rounded to nearest even from
float32); a list of numbers becomes int64 when every value is an integer and float32 otherwise (a
finite value that float32 cannot hold is refused); a list (or array) of ``str``/``bytes`` becomes
BYTES, each string encoded as UTF-8. Other dtypes (float64 arrays, bool, complex, objects) raise
TypeError: convert them first (``array.astype(np.float32)``), so that nothing is narrowed unseen.

Outputs: a dict of name to numpy array of the tensor's shape: float32, float16, int32, int64; BF16
widened to float32 (exactly); BYTES as an object array of ``bytes``.
"""

import struct

import numpy as np

from ._errors import internal, invalid_argument
from ._proto import pb
from ._requests import keep_alive_ms

MAX_TENSORS = 64
MAX_NAME_BYTES = 64
MAX_RANK = 8

_NUMPY_TO_DTYPE = {
    np.dtype("<f4"): pb.DTYPE_F32,
    np.dtype("<f2"): pb.DTYPE_F16,
    np.dtype("<i4"): pb.DTYPE_I32,
    np.dtype("<i8"): pb.DTYPE_I64,
}
_DTYPE_TO_NUMPY = {dtype: numpy for numpy, dtype in _NUMPY_TO_DTYPE.items()}


class BF16:
    """Marks an array to be sent as bfloat16: ``{"x": warmpool.BF16(np.ones(4))}``."""

    def __init__(self, array):
        values = np.asarray(array)
        if values.dtype.kind not in "fiu":
            raise TypeError(f"BF16 takes real numbers, not {values.dtype}")
        with np.errstate(over="ignore"):
            self.array = values.astype(np.float32)
        # The largest float32 values round up past bfloat16's largest finite one.
        widened = (self.bits().astype(np.uint32) << 16).view(np.float32)
        if np.isinf(widened[np.isfinite(values)]).any():
            raise ValueError("a value is outside the range of bfloat16 (about +-3.39e38)")

    def bits(self):
        """The values' bfloat16 bits, rounded to nearest even (NaN kept a quiet NaN)."""
        u = self.array.view(np.uint32).astype(np.uint64)
        rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        nan = np.isnan(self.array)
        rounded[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
        return rounded.astype("<u2")


def _strings(values):
    out = []
    for v in values.reshape(-1):
        if isinstance(v, str):
            v = v.encode("utf-8")
        if not isinstance(v, (bytes, bytearray)):
            raise TypeError(f"a BYTES tensor holds str or bytes, not {type(v).__name__}")
        out.append(bytes(v))
    return b"".join(struct.pack("<I", len(v)) + v for v in out)


def _fill(tensor, name, value):
    tensor.name = name
    if isinstance(value, BF16):
        tensor.dtype = pb.DTYPE_BF16
        tensor.shape.extend(value.array.shape)
        tensor.data = value.bits().tobytes()
        return
    textual = value.dtype.kind in "OSU" if isinstance(value, np.ndarray) else _textual(value)
    array = value if isinstance(value, np.ndarray) else np.asarray(value, dtype=object if textual else None)
    if textual:
        tensor.dtype = pb.DTYPE_BYTES
        tensor.shape.extend(array.shape)
        tensor.data = _strings(array)
        return
    if not isinstance(value, np.ndarray):  # a list of numbers: int64, or float32 with a range check
        if array.dtype.kind == "O" or (array.dtype.kind == "u" and array.size and int(array.max()) > 2**63 - 1):
            raise ValueError(f"tensor {name!r}: a value is outside the range of int64 (or not a number)")
        if array.dtype.kind in "iu":
            array = array.astype("<i8")
        elif array.dtype.kind == "f":
            with np.errstate(over="ignore"):
                narrowed = array.astype("<f4")
            if (np.isinf(narrowed) & np.isfinite(array)).any():
                raise ValueError(f"tensor {name!r}: a value is outside the range of float32 (about +-3.4e38)")
            array = narrowed
    dtype = _NUMPY_TO_DTYPE.get(array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype)
    if dtype is None:
        raise TypeError(
            f"tensor {name!r} has dtype {array.dtype}: send float32, float16, int32, int64, BF16(...) or "
            "strings (convert it first, e.g. array.astype(np.float32))"
        )
    tensor.dtype = dtype
    tensor.shape.extend(array.shape)
    tensor.data = np.ascontiguousarray(array, dtype=_DTYPE_TO_NUMPY[dtype]).tobytes()


def _textual(value):
    return isinstance(value, (list, tuple)) and any(isinstance(v, (str, bytes, bytearray)) for v in _leaves(value))


def _leaves(value):
    for v in value:
        if isinstance(v, (list, tuple)):
            yield from _leaves(v)
        else:
            yield v


def request(model, inputs, deadline_ms=None, keep_alive=None):
    """The infer Envelope with typed inputs; names and counts checked here as the daemon will."""
    if not isinstance(inputs, dict) or not inputs:
        raise invalid_argument("inputs must be a non-empty dict of name to array")
    if len(inputs) > MAX_TENSORS:
        raise invalid_argument(f"{len(inputs)} input tensors: at most {MAX_TENSORS}")
    envelope = pb.Envelope()
    infer = envelope.infer
    infer.model = model
    for name, value in inputs.items():
        if not isinstance(name, str) or not 1 <= len(name.encode("utf-8")) <= MAX_NAME_BYTES or "\0" in name:
            raise invalid_argument(f"tensor name {name!r}: 1 to {MAX_NAME_BYTES} bytes of text, no NUL")
        tensor = infer.inputs.add()
        _fill(tensor, name, value)
        if len(tensor.shape) > MAX_RANK:
            raise invalid_argument(f"tensor {name!r} has {len(tensor.shape)} dimensions: at most {MAX_RANK}")
    infer.deadline_ms = 0 if deadline_ms is None else int(deadline_ms)
    ms = keep_alive_ms(keep_alive)
    if ms is not None:
        infer.keep_alive_ms = ms
    return envelope


def _array(tensor):
    shape = tuple(tensor.shape)
    if tensor.dtype == pb.DTYPE_BYTES:
        items, data, at = [], tensor.data, 0
        while at < len(data):
            (length,) = struct.unpack_from("<I", data, at)
            items.append(bytes(data[at + 4:at + 4 + length]))
            at += 4 + length
        out = np.empty(len(items), dtype=object)
        out[:] = items
        return out.reshape(shape)
    if tensor.dtype == pb.DTYPE_BF16:
        bits = np.frombuffer(tensor.data, dtype="<u2").astype(np.uint32) << 16
        return bits.view(np.float32).reshape(shape)
    numpy = _DTYPE_TO_NUMPY.get(tensor.dtype)
    if numpy is None:
        raise internal(f"output {tensor.name!r} has dtype {tensor.dtype}, which this client does not know")
    return np.frombuffer(tensor.data, dtype=numpy).reshape(shape).astype(numpy.newbyteorder("="), copy=True)


def outputs(reply):
    """The reply's outputs, by name, as arrays."""
    return {tensor.name: _array(tensor) for tensor in reply.outputs}
