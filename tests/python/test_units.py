"""What the client decides on its own, without a daemon: framing, option values, input
conversion, socket discovery, error types."""

import datetime
import os
import re
import struct

import numpy as np
import pytest

import warmpool
from warmpool import _framing, _tensors


# ---- framing ----

def frame(body):
    return struct.pack("<I", len(body)) + body


def test_decoder_reassembles_frames_fed_byte_by_byte():
    stream = frame(b"first") + frame(b"") + frame(b"x" * 70000)
    decoder = _framing.FrameDecoder()
    bodies = []
    for i in range(len(stream)):
        decoder.feed(stream[i:i + 1])
        while (body := decoder.next_frame()) is not None:
            bodies.append(body)
    assert bodies == [b"first", b"", b"x" * 70000]
    assert decoder.buffered == 0


def test_decoder_refuses_an_oversized_frame_before_its_body():
    decoder = _framing.FrameDecoder(max_frame_bytes=100)
    decoder.feed(frame(b"y" * 100))
    assert decoder.next_frame() == b"y" * 100
    with pytest.raises(warmpool.ResourceExhausted, match="frame of 101 bytes.*limit of 100"):
        decoder.feed(struct.pack("<I", 101))  # the prefix alone is enough
    with pytest.raises(warmpool.ResourceExhausted):  # and it stays refused
        decoder.next_frame()


def test_end_of_stream_says_where_the_frame_was_cut():
    decoder = _framing.FrameDecoder()
    assert "closed the connection" in str(decoder.end_of_stream_error())
    decoder.feed(b"\x0a\x00")
    assert "length prefix (2 of 4 bytes)" in str(decoder.end_of_stream_error())
    decoder.feed(b"\x00\x00abc")
    error = decoder.end_of_stream_error()
    assert isinstance(error, warmpool.Unavailable)
    assert "middle of a frame (3 of 10 bytes received)" in str(error)


def test_encode_frame_is_little_endian_length_then_body():
    assert _framing.encode_frame(b"abc") == b"\x03\x00\x00\x00abc"


# ---- keep_alive ----

@pytest.mark.parametrize("value, ms", [
    ("250ms", 250), ("30s", 30000), ("90", 90000), ("5m", 300000), ("1.5h", 5400000),
    ("0", 0), ("-1", -1), (-1, -1), (0, 0), (2.5, 2500), (30, 30000),
    (datetime.timedelta(minutes=2), 120000), (None, None),
])
def test_keep_alive_accepts_what_the_cli_accepts(value, ms):
    assert warmpool.keep_alive_ms(value) == ms


@pytest.mark.parametrize("value", ["", "m", "5 minutes", "1.2.3s", "-5s", "5d", "abc", -5, -0.5,
                                   float("inf"), float("nan")])
def test_keep_alive_refuses_what_is_not_a_duration(value):
    with pytest.raises(ValueError):
        warmpool.keep_alive_ms(value)


@pytest.mark.parametrize("value", [True, [5], object()])
def test_keep_alive_refuses_other_types(value):
    with pytest.raises(TypeError, match="keep_alive"):
        warmpool.keep_alive_ms(value)


# ---- inputs ----

def test_input_float32_2d_is_sent_as_is():
    x = np.ones((3, 4), np.float32)
    assert _tensors.as_input_matrix(x) is x


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32, np.uint8, np.int64])
def test_input_real_dtypes_become_float32(dtype):
    x = np.arange(12).reshape(3, 4).astype(dtype)
    m = _tensors.as_input_matrix(x)
    assert m.dtype == np.float32 and m.flags.c_contiguous and m.shape == (3, 4)
    np.testing.assert_array_equal(m, np.arange(12).reshape(3, 4))


def test_input_1d_is_one_row_and_non_contiguous_is_copied():
    assert _tensors.as_input_matrix(np.arange(5, dtype=np.float32)).shape == (1, 5)
    x = np.arange(20, dtype=np.float32).reshape(4, 5)[:, ::2]
    m = _tensors.as_input_matrix(x)
    assert m.flags.c_contiguous
    np.testing.assert_array_equal(m, x)
    assert _tensors.as_input_matrix([[1, 2], [3, 4]]).dtype == np.float32


@pytest.mark.parametrize("data", [
    np.ones((2, 2), np.complex64), np.ones((2, 2), bool), np.array([["a", "b"]]),
    np.array([[1, None]], dtype=object), np.array(["2020-01-01"], dtype="datetime64[D]"),
])
def test_input_dtypes_that_are_not_real_numbers_raise_type_error(data):
    with pytest.raises(TypeError, match=re.escape(f"input has dtype {data.dtype};")):
        _tensors.as_input_matrix(data)


@pytest.mark.parametrize("shape", [(), (2, 3, 4), (0, 4), (3, 0), (0,)])
def test_input_shapes_other_than_rows_by_columns_raise_value_error(shape):
    with pytest.raises(ValueError, match=r"has shape \("):
        _tensors.as_input_matrix(np.zeros(shape, np.float32))


def test_input_ragged_lists_and_float32_overflow_raise_value_error():
    with pytest.raises(ValueError, match="rectangular"):
        _tensors.as_input_matrix([[1, 2], [3]])
    with pytest.raises(ValueError, match="row 1 column 0 is 1e\\+39, outside the range of float32"):
        _tensors.as_input_matrix(np.array([[1.0], [1e39]]))


def test_output_size_mismatch_is_internal():
    with pytest.raises(warmpool.Internal, match="2 x 3 but holds 8 bytes"):
        _tensors.matrix_from_bytes(2, 3, b"\0" * 8)


# ---- errors ----

def test_errors_are_typed_and_print_like_the_cli():
    from warmpool._errors import error_from_code

    for number, cls in enumerate([warmpool.NotFound, warmpool.InvalidArgument,
                                  warmpool.ResourceExhausted, warmpool.Unavailable,
                                  warmpool.DeadlineExceeded, warmpool.FailedPrecondition,
                                  warmpool.PermissionDenied, warmpool.Internal], start=1):
        error = error_from_code(number, "why")
        assert type(error) is cls and isinstance(error, warmpool.WarmpoolError)
        assert str(error) == f"{error.code}: why"
    assert str(error_from_code(1, 'model "x" is not registered')) == \
        'NOT_FOUND: model "x" is not registered'
    assert type(error_from_code(99, "?")) is warmpool.Internal


# ---- socket discovery ----

def test_socket_discovery_order(tmp_path):
    system = str(tmp_path / "system.sock")
    runtime = tmp_path / "run"
    runtime.mkdir()
    env = {"XDG_RUNTIME_DIR": str(runtime)}
    own = str(runtime / "warmpool.sock")
    # Nothing anywhere: the user's own default.
    assert warmpool.default_socket_path(env, system) == own
    # Only the system service listens: its socket.
    open(system, "w").close()
    assert warmpool.default_socket_path(env, system) == system
    # A daemon of this user's own: it wins.
    open(own, "w").close()
    assert warmpool.default_socket_path(env, system) == own
    # WARMPOOL_SOCKET beats both; an empty one is ignored.
    assert warmpool.default_socket_path(dict(env, WARMPOOL_SOCKET="/x.sock"), system) == "/x.sock"
    assert warmpool.default_socket_path(dict(env, WARMPOOL_SOCKET=""), system) == own


def test_user_socket_without_absolute_runtime_dir_is_in_tmp():
    expected = f"/tmp/warmpool-{os.getuid()}.sock"
    assert warmpool.user_socket_path({}) == expected
    assert warmpool.user_socket_path({"XDG_RUNTIME_DIR": "relative"}) == expected
    assert warmpool.SYSTEM_SOCKET_PATH == "/run/warmpool/warmpool.sock"


def test_connecting_to_no_daemon_says_what_to_do(tmp_path):
    path = str(tmp_path / "nobody.sock")
    with pytest.raises(warmpool.Unavailable) as caught:
        warmpool.Client(path)
    message = str(caught.value)
    assert message.startswith(f"UNAVAILABLE: cannot connect to warmpoold at {path}: ")
    assert "is it running?" in message and "WARMPOOL_SOCKET" in message


def test_a_socket_path_too_long_is_invalid_argument(tmp_path):
    with pytest.raises(warmpool.InvalidArgument, match="too long"):
        warmpool.Client(str(tmp_path / ("x" * 120)))
