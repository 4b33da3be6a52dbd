"""The asyncio client: every request as a coroutine, many concurrent requests on one connection,
and pending requests failing when the connection ends."""

import asyncio
import os

import numpy as np
import pytest

import warmpool
from conftest import dense_reference, make_model, random_input
from fake_daemon import FakeDaemon, echo_reply, error_reply
from warmpool import warmpool_pb2 as pb


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, timeout=30))


def test_many_concurrent_requests_on_one_connection(daemon):
    jobs = []
    for i in range(500):  # more than the daemon's 256 per connection: the client holds the rest
        name = ("tiny", "wide", "narrow", "echo")[i % 4]
        width = 9 if name == "echo" else dense_reference.in_out_features(daemon.model_paths[name])[0]
        jobs.append((name, random_input(1 + i % 5, width, seed=1000 + i)))

    async def main():
        async with await warmpool.AsyncClient.connect(daemon.socket) as c:
            tasks = [asyncio.ensure_future(c.infer(name, x)) for name, x in jobs]
            await asyncio.sleep(0)
            in_flight = c.pending
            outputs = await asyncio.gather(*tasks)
            return in_flight, outputs, c.pending

    in_flight, outputs, after = run(main())
    assert 1 < in_flight <= 256  # in flight together, within the daemon's limit
    assert after == 0
    for (name, x), y in zip(jobs, outputs):
        if name == "echo":
            np.testing.assert_array_equal(x, y)
        else:
            dense_reference.assert_matches(daemon.model_paths[name], x, y)


def test_every_request_as_a_coroutine(daemon):
    path = make_model(os.path.join(daemon.models_dir, "async.safetensors"), "8,6,2", "relu",
                      "f32", 21)

    async def main():
        c = await warmpool.AsyncClient.connect(daemon.socket)
        try:
            assert {m.name for m in await c.models()} >= {"tiny", "echo"}
            assert (await c.status()).backend == "host"
            assert (await c.register("async-late", path)).path == path
            loaded = await c.load("async-late", keep_alive=30)
            assert loaded.model == "async-late"
            assert await c.pin("async-late") is True
            assert await c.unpin("async-late") is False
            entry = next(e for e in await c.ps() if e.name == "async-late")
            assert entry.state == "ready" and 0 < entry.expires_in <= 30
            x = random_input(3, 8, seed=22)
            dense_reference.assert_matches(path, x, await c.infer("async-late", x, deadline_ms=5000))
            outs = await c.infer_many("async-late", [x, x[:1]], window=1)
            dense_reference.assert_matches(path, x[:1], outs[1])
            assert await c.unload("async-late", park=True) is None
            assert (await c.unregister("async-late")).removed
            fault = await c.fault_arm("infer.mid", "delay:1", model="echo")
            assert fault > 0 and await c.fault_clear() == 1
            assert "model(s)" in await c.unload_all()
            with pytest.raises(warmpool.NotFound):
                await c.infer("no-such-model", x)
            with pytest.raises(warmpool.InvalidArgument):
                await c.infer("tiny", np.ones((1, 3)))
            with pytest.raises(TypeError):
                await c.infer("tiny", np.ones((1, 16), complex))
            results = await c.infer_many("tiny", [np.ones((1, 16)), np.ones((1, 2))],
                                         return_exceptions=True)
            assert results[0].shape == (1, 8) and isinstance(results[1], warmpool.InvalidArgument)
        finally:
            await c.close()

    run(main())


def test_socket_found_through_warmpool_socket(daemon, monkeypatch):
    monkeypatch.setenv("WARMPOOL_SOCKET", daemon.socket)

    async def main():
        async with await warmpool.AsyncClient.connect() as c:
            return c.socket_path, await c.status()

    path, status = run(main())
    assert path == daemon.socket and status.workers


def test_connecting_to_no_daemon_is_unavailable(tmp_path):
    with pytest.raises(warmpool.Unavailable, match="cannot connect to warmpoold at .*is it running"):
        run(warmpool.AsyncClient.connect(str(tmp_path / "none.sock")))


def test_close_fails_the_pending_requests_with_unavailable():
    def script(conn):
        for _ in range(5):
            conn.read_request()  # and never answer
        conn.at_eof()  # until the client closes

    async def main(path):
        c = await warmpool.AsyncClient.connect(path)
        tasks = [asyncio.ensure_future(c.infer("echo", np.ones((1, 2)))) for _ in range(5)]
        while len(fake.received) < 5:
            await asyncio.sleep(0.01)
        assert c.pending == 5
        await c.close()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        with pytest.raises(warmpool.Unavailable):
            await c.status()
        return results

    with FakeDaemon(script) as fake:
        results = run(main(fake.path))
        fake.join()
    assert all(isinstance(r, warmpool.Unavailable) for r in results), results
    assert all("closed before warmpoold answered" in str(r) for r in results)


def test_the_end_of_the_connection_fails_every_pending_request():
    def script(conn):
        requests = [conn.read_request() for _ in range(3)]
        conn.send(echo_reply(requests[1]))
        conn.send_raw(conn.frame(echo_reply(requests[0]))[:7])  # and close mid-frame

    async def main(path):
        async with await warmpool.AsyncClient.connect(path) as c:
            results = await asyncio.gather(
                *(c.infer("echo", np.full((1, 2), i)) for i in range(3)), return_exceptions=True)
            with pytest.raises(warmpool.Unavailable):
                await c.models()
            return results

    with FakeDaemon(script) as fake:
        results = run(main(fake.path))
        fake.join()
    np.testing.assert_array_equal(results[1], np.full((1, 2), 1, np.float32))
    for r in (results[0], results[2]):
        assert isinstance(r, warmpool.Unavailable) and "middle of a frame" in str(r)


def test_the_daemons_word_on_the_connection_fails_pending_requests():
    def script(conn):
        conn.read_request()
        conn.read_request()
        conn.send(error_reply(0, pb.RESOURCE_EXHAUSTED, "too many unread replies"))

    async def main(path):
        async with await warmpool.AsyncClient.connect(path) as c:
            return await asyncio.gather(c.ps(), c.status(), return_exceptions=True)

    with FakeDaemon(script) as fake:
        results = run(main(fake.path))
        fake.join()
    assert all(isinstance(r, warmpool.ResourceExhausted) for r in results), results


def test_a_cancelled_request_leaves_the_connection_usable(daemon):
    async def main():
        async with await warmpool.AsyncClient.connect(daemon.socket) as c:
            await c.fault_arm("infer.mid", "delay:300", model="echo")
            slow = asyncio.ensure_future(c.infer("echo", np.ones((1, 2))))
            await asyncio.sleep(0.05)
            slow.cancel()
            with pytest.raises(asyncio.CancelledError):
                await slow
            out = await c.infer("tiny", np.ones((1, 16)))
            await c.fault_clear()
            return out

    assert run(main()).shape == (1, 8)
