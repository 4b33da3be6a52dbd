"""The blocking client against a real warmpoold: every request, inference checked against an
independent numpy reference, typed errors."""

import dataclasses
import os
import shutil

import numpy as np
import pytest

import warmpool
from conftest import dense_reference, make_model, random_input


def test_models_lists_every_model_with_its_shape(client, daemon):
    models = {m.name: m for m in client.models()}
    assert set(models) == {"tiny", "wide", "narrow", "expand", "echo"}
    for name, path in daemon.model_paths.items():
        info = models[name]
        assert (info.in_features, info.out_features) == dense_reference.in_out_features(path)
        assert info.engine == "dense" and info.path == path and info.error is None
        assert info.bytes == os.path.getsize(path) - 8 - _header_len(path)
    assert models["echo"].engine == "echo"
    # The CLI's --json field names.
    assert list(dataclasses.asdict(models["tiny"])) == [
        "name", "engine", "path", "state", "bytes", "in_features", "out_features", "error",
        "retry_in_ms", "weight_bytes", "workspace_bytes", "total_bytes", "pinned", "file_broken", "tensors",
        "tool_call_format", "parallel", "embeds_only"]
    assert models["tiny"].weight_bytes == models["tiny"].bytes
    assert models["tiny"].total_bytes == models["tiny"].weight_bytes + models["tiny"].workspace_bytes


def _header_len(path):
    with open(path, "rb") as f:
        return int.from_bytes(f.read(8), "little")


def test_status_describes_the_daemon(client, daemon):
    status = client.status()
    assert status.backend == "host"
    assert status.version
    assert status.fault_injection is True
    assert len(status.workers) == 2
    assert all(w.pid > 0 and w.state in ("idle", "busy") for w in status.workers)
    assert status.devices[0].kind == "host" and status.devices[0].budget_bytes > 0


@pytest.mark.parametrize("name", ["tiny", "wide", "narrow", "expand"])
def test_infer_matches_the_numpy_reference(client, daemon, name):
    path = daemon.model_paths[name]
    in_features, out_features = dense_reference.in_out_features(path)
    x = random_input(5, in_features, seed=len(name))
    out = client.infer(name, x)
    assert out.shape == (5, out_features) and out.dtype == np.float32
    assert out.flags.writeable and out.flags.c_contiguous  # the caller's own array
    dense_reference.assert_matches(path, x, out)


def test_infer_one_row_and_converted_dtypes(client, daemon):
    path = daemon.model_paths["tiny"]
    row = np.linspace(-1, 1, 16)  # float64, 1-D: one row
    out = client.infer("tiny", row)
    assert out.shape == (1, 8)
    dense_reference.assert_matches(path, row.astype(np.float32)[None, :], out)
    ints = np.arange(32, dtype=np.int16).reshape(2, 16) - 16
    dense_reference.assert_matches(path, ints, client.infer("tiny", ints))
    dense_reference.assert_matches(path, [[0.5] * 16], client.infer("tiny", [[0.5] * 16]))
    transposed = np.asfortranarray(random_input(3, 16, seed=9))
    dense_reference.assert_matches(path, transposed, client.infer("tiny", transposed))


def test_infer_on_echo_returns_the_input(client):
    x = random_input(3, 7, seed=4)
    np.testing.assert_array_equal(client.infer("echo", x), x)


def test_infer_with_deadline_and_keep_alive(client, daemon):
    x = random_input(2, 16, seed=5)
    out = client.infer("tiny", x, deadline_ms=10000, keep_alive="5m")
    dense_reference.assert_matches(daemon.model_paths["tiny"], x, out)
    entry = next(e for e in client.ps() if e.name == "tiny")
    assert entry.state == "ready" and 0 < entry.expires_in <= 300
    client.infer("tiny", x, keep_alive=-1)
    assert next(e for e in client.ps() if e.name == "tiny").expires_in is None


def test_large_inputs_go_through_a_shared_memory_region(client, daemon):
    # 40000 x 16 f32 is 2.5 MiB: above the 1 MiB threshold, so a region carries it both ways.
    x = random_input(40000, 16, seed=6)
    out = client.infer("tiny", x)
    assert client.region_bytes >= x.nbytes
    dense_reference.assert_matches(daemon.model_paths["tiny"], x, out)
    # A larger input grows the region; an echo output as large as the input fits in it too.
    y = random_input(70000, 16, seed=7)
    np.testing.assert_array_equal(client.infer("echo", y), y)
    assert client.region_bytes >= 2 * y.nbytes
    # The same through frames.
    with warmpool.Client(daemon.socket, region_threshold=0) as frames:
        np.testing.assert_array_equal(frames.infer("tiny", x), out)
        assert frames.region_bytes == 0


def test_an_output_larger_than_the_regions_room_comes_in_the_reply(daemon):
    path = daemon.model_paths["expand"]
    x = random_input(20000, 16, seed=8)  # 1.2 MiB in, 4.9 MiB out
    with warmpool.Client(daemon.socket) as c:
        dense_reference.assert_matches(path, x, c.infer("expand", x))  # output in the reply
        first = c.region_bytes
        assert 0 < first < x.nbytes + 4 * x.nbytes
        dense_reference.assert_matches(path, x, c.infer("expand", x))  # output in the region
        assert c.region_bytes >= x.nbytes + 4 * x.nbytes


def test_load_ps_pin_unload_park(client):
    result = client.load("wide", replicas=1, keep_alive="10m")
    assert result.model == "wide" and result.bytes > 0
    assert result.replicas == 1 and result.replicas_capped is None
    again = client.load("wide")
    assert again.already_loaded and again.replicas_before == again.replicas == 1
    # One model, one set of sizes, under the same names in models(), ps() and load().
    info = next(m for m in client.models() if m.name == "wide")
    entry = next(e for e in client.ps() if e.name == "wide")
    for sizes in (info, entry, again):
        assert (sizes.weight_bytes, sizes.workspace_bytes, sizes.total_bytes) == (
            result.weight_bytes, result.workspace_bytes, result.total_bytes)
    assert result.total_bytes == result.weight_bytes + result.workspace_bytes == entry.bytes
    ps = {e.name: e for e in client.ps()}
    assert ps["wide"].state == "ready" and ps["wide"].replicas == 1
    assert ps["wide"].worker is not None and ps["wide"].weight_bytes > 0
    assert list(dataclasses.asdict(ps["wide"]))[:9] == [
        "name", "state", "device", "bytes", "inflight", "replicas", "last_used", "expires_in",
        "loaded_bytes"]

    assert client.pin("wide") is True
    assert next(e for e in client.ps() if e.name == "wide").pinned
    assert client.unpin("wide") is False
    assert not next(e for e in client.ps() if e.name == "wide").pinned

    assert client.unload("wide", park=True) is None
    assert next(e for e in client.ps() if e.name == "wide").state == "parked"
    client.load("wide")  # unparks
    assert next(e for e in client.ps() if e.name == "wide").state == "ready"
    client.unload("wide")
    assert "wide" not in {e.name for e in client.ps() if e.state == "ready"}


def test_unload_all_releases_every_model(client):
    client.load("tiny")
    client.load("echo")
    summary = client.unload_all()
    assert "model(s)" in summary
    assert not [e for e in client.ps() if e.state == "ready"]


def test_register_and_unregister(client, daemon, tmp_path):
    extra_dir = os.path.join(daemon.models_dir, "extra")
    os.makedirs(extra_dir, exist_ok=True)
    path = make_model(os.path.join(extra_dir, "late.safetensors"), "12,10,3", "none", "f32", 11)
    # A relative path is made absolute by the client, as the CLI does.
    relative = os.path.relpath(path)
    registered = client.register("late", relative)
    assert registered.model == "late" and registered.path == path and registered.weight_bytes > 0
    assert not registered.removed
    x = random_input(4, 12, seed=12)
    dense_reference.assert_matches(path, x, client.infer("late", x))
    removed = client.unregister("late")
    assert removed.removed
    with pytest.raises(warmpool.NotFound):
        client.infer("late", x)
    # A file outside every model root is refused.
    outside = shutil.copy(path, tmp_path / "outside.safetensors")
    with pytest.raises(warmpool.PermissionDenied, match="outside the model roots"):
        client.register("outside", outside)


def test_fault_arm_and_clear(client, daemon):
    fault = client.fault_arm("infer.mid", "delay:1", model="echo", after=1, times=2)
    assert isinstance(fault, int) and fault > 0
    assert f"fault {fault} armed: delay:1 at infer.mid for model echo" in daemon.log_tail(100000)
    assert client.fault_clear() == 1
    assert client.fault_clear() == 0
    with pytest.raises(warmpool.InvalidArgument):
        client.fault_arm("no.such.point", "kill")


def test_fault_arm_without_fault_injection_is_failed_precondition(start_daemon):
    d = start_daemon()
    with warmpool.Client(d.socket) as c:
        assert c.status().fault_injection is False
        with pytest.raises(warmpool.FailedPrecondition) as caught:
            c.fault_arm("infer.mid", "kill")
        assert str(caught.value).startswith("FAILED_PRECONDITION: ")


def test_unknown_model_is_not_found(client):
    with pytest.raises(warmpool.NotFound) as caught:
        client.infer("no-such-model", np.ones((1, 4), np.float32))
    assert str(caught.value) == \
        "NOT_FOUND: model \"no-such-model\" is not registered (see 'warmpool models')"
    with pytest.raises(warmpool.NotFound):
        client.load("no-such-model")


def test_a_passed_deadline_is_deadline_exceeded(client):
    client.fault_arm("infer.mid", "delay:400", model="echo")  # the worker sleeps mid-request
    try:
        with pytest.raises(warmpool.DeadlineExceeded, match="before the deadline"):
            client.infer("echo", np.ones((1, 2)), deadline_ms=100)
    finally:
        client.fault_clear()


def test_wrong_width_is_invalid_argument(client):
    with pytest.raises(warmpool.InvalidArgument, match="16"):
        client.infer("tiny", np.ones((2, 15), np.float32))
    # The connection still serves.
    assert client.infer("tiny", np.ones((1, 16))).shape == (1, 8)


def test_bad_dtypes_and_shapes_fail_in_the_client(client):
    for bad in (np.ones((2, 16), np.complex64), np.ones((2, 16), bool), [["a"] * 16]):
        with pytest.raises(TypeError):
            client.infer("tiny", bad)
    for bad in (np.ones((2, 2, 4)), np.ones((0, 16)), 3.0):
        with pytest.raises(ValueError):
            client.infer("tiny", bad)
    with pytest.raises(ValueError, match="replicas"):
        client.load("tiny", replicas=0)
    with pytest.raises(ValueError, match="duration"):
        client.load("tiny", keep_alive="5 minutes")
    assert client.pending == frozenset()  # nothing was sent


def test_socket_found_through_warmpool_socket(daemon, monkeypatch):
    monkeypatch.setenv("WARMPOOL_SOCKET", daemon.socket)
    with warmpool.Client() as c:
        assert c.socket_path == daemon.socket
        assert {m.name for m in c.models()} >= {"tiny", "echo"}


def test_a_frame_above_the_daemons_limit_is_resource_exhausted(daemon):
    # 17 M floats = 68 MiB, in a frame: above [limits] max_frame_bytes (64 MiB). The daemon
    # refuses it from the length alone and closes; the client reports what it said.
    with warmpool.Client(daemon.socket, region_threshold=0) as c:
        big = np.zeros((17 * 1024, 1024), np.float32)
        with pytest.raises(warmpool.WarmpoolError) as caught:
            c.infer("echo", big)
        assert caught.value.code == "RESOURCE_EXHAUSTED", str(caught.value)
        with pytest.raises(warmpool.WarmpoolError):  # the connection is over
            c.status()
