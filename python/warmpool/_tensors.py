"""numpy arrays in and out of warmpool.v1.Tensor (row-major little-endian f32).

Inputs: a 1-D array (one row) or a 2-D array (rows x in_features), or anything ``numpy.asarray``
turns into one (nested lists). Any real numeric dtype is accepted (floats of any width, signed and
unsigned integers) and converted to float32 with numpy's rounding; a finite value that float32
cannot hold (beyond about +-3.4e38) is refused rather than sent as inf. NaN and inf already in a
float input are sent as they are. bool, complex, strings, objects, dates and structured dtypes
raise TypeError; shapes other than 1-D or 2-D, and empty inputs, raise ValueError.
"""

import numpy as np

from ._errors import internal

_F32 = np.dtype("<f4")
_MAX_DIM = 0xFFFFFFFF  # rows and cols are uint32 on the wire


def as_input_matrix(data):
    """data as a C-contiguous little-endian float32 array of shape (rows, cols)."""
    if isinstance(data, np.ndarray):
        array = data
    else:
        try:
            array = np.asarray(data)
        except ValueError as error:  # ragged nested lists
            raise ValueError(f"input is not a rectangular array of numbers: {error}") from None
    kind = array.dtype.kind
    if kind not in "fiu":
        raise TypeError(
            f"input has dtype {array.dtype}; warmpool models take real numbers (float32, or any "
            "float or integer dtype, converted to float32)"
        )
    if array.ndim == 1:
        array = array.reshape(1, -1)
    elif array.ndim != 2:
        raise ValueError(
            f"input has shape {tuple(array.shape)}; give one row (1-D) or rows x in_features (2-D)"
        )
    rows, cols = array.shape
    if rows == 0 or cols == 0:
        raise ValueError(f"input has shape {tuple(array.shape)}; it needs at least one row and column")
    if rows > _MAX_DIM or cols > _MAX_DIM:
        raise ValueError(f"input has shape {tuple(array.shape)}; rows and columns must fit in 32 bits")
    if array.dtype == _F32 and array.flags.c_contiguous:
        return array
    with np.errstate(over="ignore", invalid="ignore"):
        converted = np.ascontiguousarray(array, dtype=_F32)
    if kind == "f" and array.dtype.itemsize > 4:
        overflow = np.isinf(converted) & np.isfinite(array)
        if overflow.any():
            row, col = (int(i) for i in np.argwhere(overflow)[0])
            raise ValueError(
                f"input row {row} column {col} is {array[row, col]!r}, outside the range of "
                "float32 (about +-3.4e38)"
            )
    return converted


def fill_tensor(tensor, matrix):
    """Sets a warmpool.v1.Tensor from a matrix made by as_input_matrix."""
    tensor.rows, tensor.cols = matrix.shape
    tensor.data = matrix.tobytes()


def matrix_from_bytes(rows, cols, data):
    """A writable float32 array (rows, cols) from the bytes of a reply."""
    expected = rows * cols * 4
    if len(data) != expected:
        raise internal(
            f"the daemon's output is {rows} x {cols} but holds {len(data)} bytes, not {expected}"
        )
    return np.frombuffer(data, dtype=_F32).reshape(rows, cols).astype(np.float32, copy=True)


def matrix_from_tensor(tensor):
    return matrix_from_bytes(tensor.rows, tensor.cols, tensor.data)
