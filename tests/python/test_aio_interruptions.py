"""The asyncio client cancelled or interrupted at every step of a request: a cancelled request
keeps its in-flight slot until the daemon answers it (so the client never sends more than the
daemon accepts), a frame is never left half-written by a cancellation, and a connection an
interruption cut mid-frame is replaced on the next call."""

import asyncio

import numpy as np
import pytest

import warmpool
from conftest import random_input
from interrupting import InterruptingSocket


def run(coroutine, timeout=60):
    return asyncio.run(asyncio.wait_for(coroutine, timeout=timeout))


def slow_echo(daemon, ms):
    """Delays every echo inference by ms until cleared (a blocking client of its own, so that
    the fault is cleared whatever becomes of the client under test)."""
    with warmpool.Client(daemon.socket) as admin:
        admin.fault_arm("infer.mid", f"delay:{ms}", model="echo", times=1_000_000)


def fast_echo(daemon):
    with warmpool.Client(daemon.socket) as admin:
        admin.fault_clear()


async def until(condition, timeout=10):
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out waiting"
        await asyncio.sleep(0.002)


def test_cancelled_requests_keep_their_slots_until_the_daemon_answers(daemon):
    async def main():
        async with await warmpool.AsyncClient.connect(daemon.socket) as c:
            doomed = [asyncio.ensure_future(c.infer("echo", np.full((1, 4), i, np.float32)))
                      for i in range(300)]
            await until(lambda: c.pending == c.max_in_flight)  # the daemon holds 256
            for task in doomed:
                task.cancel()
            results = await asyncio.gather(*doomed, return_exceptions=True)
            assert all(isinstance(r, asyncio.CancelledError) for r in results)
            # The daemon still holds what was sent; so does the client, until each is answered.
            assert c.pending > 0
            inputs = [random_input(1 + i % 3, 4, seed=i) for i in range(300)]
            outputs = await asyncio.gather(*(c.infer("echo", x) for x in inputs))
            for x, y in zip(inputs, outputs):
                np.testing.assert_array_equal(x, y)
            await until(lambda: c.pending == 0)

    slow_echo(daemon, 5)
    try:
        run(main())
    finally:
        fast_echo(daemon)


def test_a_request_cancelled_while_waiting_for_a_slot(daemon):
    async def main():
        async with await warmpool.AsyncClient.connect(daemon.socket, max_in_flight=1) as c:
            first = asyncio.ensure_future(c.infer("echo", np.ones((1, 2))))
            queued = asyncio.ensure_future(c.infer("echo", np.zeros((1, 2))))
            await until(lambda: c.pending == 1)
            queued.cancel()
            np.testing.assert_array_equal(await first, np.ones((1, 2), np.float32))
            with pytest.raises(asyncio.CancelledError):
                await queued
            x = random_input(2, 3, seed=1)
            np.testing.assert_array_equal(await c.infer("echo", x), x)
            assert c.pending == 0

    slow_echo(daemon, 100)
    try:
        run(main())
    finally:
        fast_echo(daemon)


def test_a_request_cancelled_while_waiting_behind_a_write(daemon):
    big = random_input(1 << 20, 8, seed=2)  # 32 MiB: written over many loop iterations

    async def main():
        async with await warmpool.AsyncClient.connect(daemon.socket) as c:
            writing = asyncio.ensure_future(c.infer("echo", big))
            behind = asyncio.ensure_future(c.infer("echo", np.ones((1, 2))))
            await until(lambda: c.pending == 2)
            behind.cancel()
            with pytest.raises(asyncio.CancelledError):
                await behind
            np.testing.assert_array_equal(await writing, big)
            x = random_input(2, 3, seed=3)
            np.testing.assert_array_equal(await c.infer("echo", x), x)
            await until(lambda: c.pending == 0)

    run(main())


def test_a_request_cancelled_mid_write_finishes_its_frame(daemon):
    big = random_input(1 << 20, 8, seed=4)

    async def main():
        async with await warmpool.AsyncClient.connect(daemon.socket) as c:
            writing = asyncio.ensure_future(c.infer("echo", big))
            await until(lambda: c.pending == 1)
            await asyncio.sleep(0.001)  # part of the frame is out
            writing.cancel()
            with pytest.raises(asyncio.CancelledError):
                await writing
            assert c.pending == 1  # its slot stays taken until its reply comes
            xs = [random_input(2, 8, seed=5 + i) for i in range(3)]
            for x, y in zip(xs, await asyncio.gather(*(c.infer("echo", x) for x in xs))):
                np.testing.assert_array_equal(x, y)
            await until(lambda: c.pending == 0)

    run(main())


@pytest.mark.parametrize("answered", [False, True], ids=["before-reply", "after-reply"])
def test_a_request_cancelled_after_it_was_sent(daemon, answered):
    async def main():
        async with await warmpool.AsyncClient.connect(daemon.socket) as c:
            task = asyncio.ensure_future(c.infer("echo", np.ones((1, 2))))
            await until(lambda: c.pending == 1)
            if answered:
                await until(lambda: c.pending == 0)  # the reply is in; the caller has not run
            task.cancel()
            if not answered:
                await asyncio.sleep(0.02)
                assert c.pending == 1  # the daemon still holds it
            await asyncio.gather(task, return_exceptions=True)
            x = random_input(2, 3, seed=6)
            np.testing.assert_array_equal(await c.infer("echo", x), x)
            await until(lambda: c.pending == 0)

    slow_echo(daemon, 100)
    try:
        run(main())
    finally:
        fast_echo(daemon)


BIG = random_input(65536, 8, seed=7)  # 2 MiB


@pytest.mark.parametrize("where", [
    dict(send_after=BIG.nbytes // 2),
    dict(recv_after=BIG.nbytes // 2),
    dict(recv_after=BIG.nbytes // 2, lose=1000),
], ids=["mid-write", "mid-read", "mid-read-bytes-lost"])
def test_an_interruption_mid_frame_resets_the_connection(daemon, where):
    loop = asyncio.new_event_loop()
    try:
        c = loop.run_until_complete(warmpool.AsyncClient.connect(daemon.socket))
        c._conn.sock = InterruptingSocket(c._conn.sock, **where)
        task = loop.create_task(c.infer("echo", BIG))
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(task)
        # The interrupted request's outcome is the reset; the next call gets a new connection.
        with pytest.raises(warmpool.Unavailable, match="reset"):
            loop.run_until_complete(asyncio.wait_for(task, 10))

        async def next_requests():
            xs = [random_input(2, 8, seed=10 + i) for i in range(5)] + [BIG]
            for x, y in zip(xs, await asyncio.gather(*(c.infer("echo", x) for x in xs))):
                np.testing.assert_array_equal(x, y)
            assert c.pending == 0

        loop.run_until_complete(asyncio.wait_for(next_requests(), 10))
        loop.run_until_complete(c.close())
    finally:
        loop.close()
