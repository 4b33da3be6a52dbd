"""The blocking client interrupted at every step of a request (a KeyboardInterrupt, a socket
timeout, an exception raised by a signal handler), landed at an exact byte by a socket stand-in:
the same Client serves the next request right, requests pipelined on a connection the interruption
reset fail with Unavailable, and no shared-memory region outlives its connection."""

import os
import socket
import time

import numpy as np
import pytest

import warmpool
from conftest import random_input
from interrupting import InterruptingSocket, memfd_inodes
from warmpool import _region, _replies


class Alarm(Exception):
    """What a SIGALRM handler might raise."""


ERRORS = [KeyboardInterrupt, socket.timeout, Alarm]
BIG = random_input(65536, 8, seed=1)  # 2 MiB: many writes and reads per frame

# Where the interruption lands in `c.infer("echo", BIG)` sent in a frame.
FRAME_STEPS = {
    "before-send": dict(send_after=0),
    "mid-write": dict(send_after=BIG.nbytes // 2),
    "after-send": dict(recv_after=0),
    "mid-read": dict(recv_after=BIG.nbytes // 2),
    "mid-read-bytes-lost": dict(recv_after=BIG.nbytes // 2, lose=1000),
}


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: e.__name__)
@pytest.mark.parametrize("step", FRAME_STEPS)
def test_an_interrupted_infer_leaves_the_client_usable(daemon, step, error):
    with warmpool.Client(daemon.socket, region_threshold=0) as c:
        earlier_input = random_input(2, 8, seed=2)
        earlier = c.send_infer("echo", earlier_input)  # in flight when the interruption lands
        # The timeout makes a client left on a poisoned stream fail instead of hanging.
        c._sock = InterruptingSocket(c._sock, error=error, timeout=10, **FRAME_STEPS[step])
        with pytest.raises(error):
            c.infer("echo", BIG)
        x = random_input(3, 8, seed=3)
        np.testing.assert_array_equal(c.infer("echo", x), x)
        if step == "before-send":  # nothing of the frame went out: the connection stands
            np.testing.assert_array_equal(c.wait(earlier), earlier_input)
        elif step in ("mid-write", "after-send"):  # reset before its reply was read
            with pytest.raises(warmpool.Unavailable, match="reset"):
                c.wait(earlier)
        else:  # its reply may have come before the interruption, and stays good
            try:
                np.testing.assert_array_equal(c.wait(earlier), earlier_input)
            except warmpool.Unavailable as e:
                assert "reset" in str(e)
        assert c.pending == frozenset()  # nothing left waiting for a reply that never comes
        np.testing.assert_array_equal(c.infer("echo", BIG), BIG)
        pipelined = [random_input(1, 8, seed=10 + i) for i in range(20)]
        for x, y in zip(pipelined, c.infer_many("echo", pipelined)):
            np.testing.assert_array_equal(x, y)


def test_an_interruption_after_the_reply_keeps_the_connection(daemon, monkeypatch):
    real_expect = _replies.expect

    def expect_then_interrupt(envelope, field):
        real_expect(envelope, field)
        monkeypatch.setattr(_replies, "expect", real_expect)
        raise KeyboardInterrupt

    with warmpool.Client(daemon.socket, region_threshold=0) as c:
        earlier_input = random_input(2, 8, seed=4)
        earlier = c.send_infer("echo", earlier_input)
        monkeypatch.setattr(_replies, "expect", expect_then_interrupt)
        with pytest.raises(KeyboardInterrupt):
            c.infer("echo", BIG)
        np.testing.assert_array_equal(c.infer("echo", BIG[:5]), BIG[:5])
        np.testing.assert_array_equal(c.wait(earlier), earlier_input)  # not reset
        assert c.pending == frozenset()


def test_a_write_interrupted_before_a_connection_error_is_not_mistaken_for_one(daemon):
    # The next call after the reset reconnects even when the interruption was an OSError
    # subclass (a timeout), which is not the daemon closing the connection.
    with warmpool.Client(daemon.socket, region_threshold=0) as c:
        c._sock = InterruptingSocket(c._sock, send_after=100, error=socket.timeout)
        with pytest.raises(socket.timeout):
            c.infer("echo", BIG)
        assert c.status().workers


LARGE = random_input(40000, 16, seed=5)  # 2.5 MiB: through the region


def _region_steps():
    # (warm: a region was registered before the interruption, where the interruption lands)
    return {
        "register-mid-write": (False, dict(send_after=3)),
        "register-after-send": (False, dict(recv_after=0)),
        "infer-mid-write": (True, dict(send_after=3)),
        "infer-after-send": (True, dict(recv_after=0)),
        "infer-mid-read": (True, dict(recv_after=5)),
        "infer-mid-read-bytes-lost": (True, dict(recv_after=0, lose=5)),
    }


def _daemon_lets_go(daemon, inode, timeout=10):
    deadline = time.monotonic() + timeout
    while inode in memfd_inodes(daemon.process.pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


class RecordingSocket(InterruptingSocket):
    """Notes the inode of every descriptor sent (a region's memfd)."""

    sent_inodes = ()

    def sendmsg(self, buffers, ancillary=(), flags=0, *rest):
        for _level, _type, data in ancillary:
            fds = memoryview(data).cast("B").cast("i")
            self.sent_inodes = [*self.sent_inodes, *(os.fstat(fd).st_ino for fd in fds)]
        return super().sendmsg(buffers, ancillary, flags, *rest)


@pytest.mark.parametrize("step", _region_steps())
def test_an_interrupted_region_infer_leaks_no_region(daemon, step):
    warm, where = _region_steps()[step]
    with warmpool.Client(daemon.socket) as c:
        if warm:
            np.testing.assert_array_equal(c.infer("echo", LARGE), LARGE)
            old = os.fstat(c._region.fd).st_ino
            assert old in memfd_inodes(daemon.process.pid)
        c._sock = wrapper = RecordingSocket(c._sock, timeout=10, **where)
        with pytest.raises(KeyboardInterrupt):
            c.infer("echo", LARGE)
        if not warm:
            (old,) = wrapper.sent_inodes
        # The client let go of the region the interrupted connection knew, and so did the daemon.
        assert old not in memfd_inodes(os.getpid())
        assert _daemon_lets_go(daemon, old), "the daemon still holds the region"
        y = random_input(40000, 16, seed=6)
        np.testing.assert_array_equal(c.infer("echo", y), y)
        mine = memfd_inodes(os.getpid())
        assert mine == {os.fstat(c._region.fd).st_ino}
        assert mine <= memfd_inodes(daemon.process.pid)
        assert c.pending == frozenset()


def test_an_interruption_after_a_region_reply_keeps_the_region(daemon, monkeypatch):
    real_read = _region.SharedRegion.read_matrix

    def read_then_interrupt(self, *args):
        real_read(self, *args)
        monkeypatch.setattr(_region.SharedRegion, "read_matrix", real_read)
        raise KeyboardInterrupt

    with warmpool.Client(daemon.socket) as c:
        np.testing.assert_array_equal(c.infer("echo", LARGE), LARGE)
        region = os.fstat(c._region.fd).st_ino
        monkeypatch.setattr(_region.SharedRegion, "read_matrix", read_then_interrupt)
        with pytest.raises(KeyboardInterrupt):
            c.infer("echo", LARGE)
        y = random_input(40000, 16, seed=7)
        np.testing.assert_array_equal(c.infer("echo", y), y)
        assert os.fstat(c._region.fd).st_ino == region  # the same region, the same connection


def test_an_interrupted_region_creation_leaks_no_descriptor(monkeypatch):
    class Fcntl:
        F_ADD_SEALS = _region.fcntl.F_ADD_SEALS
        F_SEAL_SHRINK = _region.fcntl.F_SEAL_SHRINK
        F_SEAL_GROW = _region.fcntl.F_SEAL_GROW
        F_SEAL_SEAL = _region.fcntl.F_SEAL_SEAL

        @staticmethod
        def fcntl(*args):
            raise KeyboardInterrupt

    before = memfd_inodes(os.getpid())
    monkeypatch.setattr(_region, "fcntl", Fcntl)
    with pytest.raises(KeyboardInterrupt):
        _region.SharedRegion(1 << 20)
    assert memfd_inodes(os.getpid()) == before
