"""Typed tensors from Python (Client.infer_tensors, AsyncClient.infer_tensors): every dtype through
the echo engine, a dense model's run equal to its inference, and what is refused before sending."""

import asyncio

import numpy as np
import pytest

import warmpool

from conftest import random_input


def test_every_dtype_comes_back_as_it_went(client):
    sent = {
        "f32": np.array([[1.5, np.nan], [np.inf, -0.0]], dtype=np.float32),
        "f16": np.array([0.333251953125, 65504], dtype=np.float16),
        "big_endian": np.array([1, -2], dtype=">i4"),
        "i64": np.array([2**62, -1], dtype=np.int64),
        "scalar": np.array(7, dtype=np.int32),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "words": ["héllo", b"\xff\x00", ""],
        "ids": [1, 2, 3],
        "floats": [0.5, 2],
    }
    got = client.infer_tensors("echo", sent, keep_alive="1m")
    assert set(got) == set(sent)
    np.testing.assert_array_equal(got["f32"], sent["f32"])
    assert got["f16"].dtype == np.float16 and got["f16"].tolist() == [0.333251953125, 65504]
    assert got["big_endian"].dtype == np.int32 and got["big_endian"].tolist() == [1, -2]
    assert got["i64"].tolist() == [2**62, -1]
    assert got["scalar"].shape == () and int(got["scalar"]) == 7
    assert got["empty"].shape == (0, 3)
    assert got["words"].tolist() == ["héllo".encode(), b"\xff\x00", b""]
    assert got["ids"].dtype == np.int64 and got["floats"].dtype == np.float32


def test_bf16_is_rounded_to_nearest_even_and_widened_exactly(client):
    # 1 + 2^-8 lies halfway between two bfloat16 values: it rounds to the even one, 1.
    values = np.array([1 + 2**-8, 1 + 3 * 2**-8, -2.5, np.nan], dtype=np.float32)
    got = client.infer_tensors("echo", {"x": warmpool.BF16(values)})["x"]
    assert got.dtype == np.float32
    assert got[:3].tolist() == [1.0, 1 + 2**-6, -2.5]
    assert np.isnan(got[3])
    with pytest.raises(ValueError, match="bfloat16"):
        warmpool.BF16(np.array([1e39]))


def test_a_dense_models_run_is_its_inference(client):
    x = random_input(5, 16, seed=3)
    got = client.infer_tensors("tiny", {"input": x})
    assert list(got) == ["output"]
    np.testing.assert_array_equal(got["output"], client.infer("tiny", x))

    async def run():
        async with await warmpool.AsyncClient.connect(client.socket_path) as aio:
            return await aio.infer_tensors("tiny", {"input": x})

    np.testing.assert_array_equal(asyncio.run(run())["output"], got["output"])


def test_models_say_what_a_loaded_model_takes(client):
    client.load("tiny")
    info = {m.name: m for m in client.models()}["tiny"]
    assert info.tensors == {"inputs": {"input": ("f32", (-1, 16))}, "outputs": {"output": ("f32", (-1, 8))}}


def test_bad_tensors_are_refused_with_typed_errors(client):
    with pytest.raises(warmpool.InvalidArgument, match=r"the model takes f32 \[-1, 16\]"):
        client.infer_tensors("tiny", {"input": np.zeros((2, 3), dtype=np.float32)})
    with pytest.raises(warmpool.InvalidArgument, match='no input tensor "input"'):
        client.infer_tensors("tiny", {"rows": np.zeros((2, 16), dtype=np.float32)})
    with pytest.raises(TypeError, match="float64"):
        client.infer_tensors("echo", {"x": np.zeros(2)})
    with pytest.raises(TypeError, match="bool"):
        client.infer_tensors("echo", {"x": np.zeros(2, dtype=bool)})
    with pytest.raises(ValueError, match="float32"):
        client.infer_tensors("echo", {"x": [1e39, 1.5]})
    with pytest.raises(ValueError, match="int64"):
        client.infer_tensors("echo", {"x": [2**63]})  # not wrapped to -2**63
    with pytest.raises(ValueError, match="int64"):
        client.infer_tensors("echo", {"x": [2**70, 1]})
    with pytest.raises(ValueError, match="bfloat16"):
        warmpool.BF16(np.array([3.4e38], dtype=np.float32))  # finite in float32, rounds past bfloat16's largest
    with pytest.raises(warmpool.InvalidArgument, match="non-empty dict"):
        client.infer_tensors("echo", {})
    with pytest.raises(warmpool.InvalidArgument, match="1 to 64 bytes"):
        client.infer_tensors("echo", {"n" * 65: [1]})
    with pytest.raises(warmpool.NotFound):
        client.infer_tensors("nope", {"x": [1]})
    assert client.infer_tensors("echo", {"x": [1]})["x"].tolist() == [1]
