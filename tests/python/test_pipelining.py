"""Many requests in flight on one connection: replies matched by request_id, out of order,
frames in pieces, and the ways a connection ends."""

import threading

import numpy as np
import pytest

import warmpool
from conftest import dense_reference, random_input
from fake_daemon import FakeDaemon, echo_reply, error_reply
from warmpool import warmpool_pb2 as pb


def test_infer_many_sends_every_request_before_reading_a_reply():
    count = 200

    def script(conn):
        # Not one reply until all 200 requests are in: a client that waited for a reply before
        # sending the rest would never get here (the read times out and the test fails).
        requests = [conn.read_request() for _ in range(count)]
        for i, request in enumerate(reversed(requests)):
            frame = conn.frame(echo_reply(request))
            if i % 10 == 0:  # some replies arrive a byte at a time
                for b in range(len(frame)):
                    conn.send_raw(frame[b:b + 1])
            else:
                conn.send_raw(frame)

    inputs = [np.full((1 + i % 3, 4), i, np.float32) for i in range(count)]
    with FakeDaemon(script) as fake:
        with warmpool.Client(fake.path) as c:
            outputs = c.infer_many("echo", inputs)
        fake.join()
    for x, y in zip(inputs, outputs):
        np.testing.assert_array_equal(x, y)
    ids = [r.request_id for r in fake.received]
    assert ids == list(range(1, count + 1))
    assert fake.received[0].protocol_version == warmpool.PROTOCOL_VERSION
    assert all(r.protocol_version == 0 for r in fake.received[1:])


def test_infer_many_keeps_at_most_window_requests_in_flight():
    most = []

    def script(conn):
        outstanding = []
        answered = 0
        while answered < 10:
            outstanding.append(conn.read_request())
            if len(outstanding) == 3 or answered + len(outstanding) == 10:
                most.append(len(outstanding))
                for r in outstanding:
                    conn.send(echo_reply(r))
                answered += len(outstanding)
                outstanding = []

    with FakeDaemon(script) as fake:
        with warmpool.Client(fake.path) as c:
            outputs = c.infer_many("echo", [np.full((1, 2), i) for i in range(10)], window=3)
        fake.join()
    assert [int(o[0, 0]) for o in outputs] == list(range(10))
    assert max(most) <= 3


def test_wait_in_any_order_stashes_other_replies():
    def script(conn):
        for _ in range(3):
            conn.send(echo_reply(conn.read_request()))

    with FakeDaemon(script) as fake:
        with warmpool.Client(fake.path) as c:
            ids = [c.send_infer("echo", np.full((1, 2), i)) for i in range(3)]
            assert c.pending == frozenset(ids)
            assert [int(c.wait(i)[0, 0]) for i in reversed(ids)] == [2, 1, 0]
            assert c.pending == frozenset()
            with pytest.raises(ValueError, match="not waiting for a reply"):
                c.wait(ids[0])
        fake.join()


def test_end_of_stream_in_the_middle_of_a_frame_is_unavailable():
    def script(conn):
        request = conn.read_request()
        conn.send_raw(conn.frame(echo_reply(request))[:-3])  # then close

    with FakeDaemon(script) as fake:
        with warmpool.Client(fake.path) as c:
            with pytest.raises(warmpool.Unavailable, match="in the middle of a frame"):
                c.infer("echo", np.ones((2, 2)))
            with pytest.raises(warmpool.Unavailable):  # and stays so
                c.models()
        fake.join()


def test_a_reply_above_the_clients_frame_limit_is_refused_from_its_length():
    def script(conn):
        conn.read_request()
        conn.send_raw((5000).to_bytes(4, "little"))  # the body never comes
        conn.at_eof()

    with FakeDaemon(script) as fake:
        with warmpool.Client(fake.path, max_frame_bytes=4096) as c:
            with pytest.raises(warmpool.ResourceExhausted, match="frame of 5000 bytes"):
                c.status()
        fake.join()


def test_the_daemons_word_on_the_connection_is_raised():
    def script(conn):
        conn.read_request()
        conn.send(error_reply(0, pb.RESOURCE_EXHAUSTED, "too many connections (1024)"))

    with FakeDaemon(script) as fake:
        with warmpool.Client(fake.path) as c:
            with pytest.raises(warmpool.ResourceExhausted, match="too many connections"):
                c.ps()
        fake.join()


def test_a_reply_that_is_not_an_envelope_is_internal():
    def script(conn):
        conn.read_request()
        conn.send_raw(b"\x03\x00\x00\x00\xff\xff\xff")

    with FakeDaemon(script) as fake:
        with warmpool.Client(fake.path) as c:
            with pytest.raises(warmpool.Internal, match="not a valid warmpool.v1.Envelope"):
                c.status()
        fake.join()


def test_two_hundred_pipelined_requests_on_the_real_daemon(client, daemon):
    path = daemon.model_paths["tiny"]
    inputs = [random_input(1 + i % 4, 16, seed=100 + i) for i in range(200)]
    outputs = client.infer_many("tiny", inputs)
    assert len(outputs) == 200
    for x, y in zip(inputs, outputs):
        dense_reference.assert_matches(path, x, y)


def test_pipelined_errors_stay_with_their_requests(client, daemon):
    good = random_input(2, 16, seed=1)
    first = client.send_infer("tiny", good)
    missing = client.send_infer("no-such-model", good)
    narrow = client.send_infer("tiny", random_input(2, 15, seed=2))
    last = client.send_infer("tiny", good)
    with pytest.raises(warmpool.InvalidArgument):
        client.wait(narrow)
    with pytest.raises(warmpool.NotFound):
        client.wait(missing)
    np.testing.assert_array_equal(client.wait(first), client.wait(last))
    results = client.infer_many("tiny", [good, np.ones((1, 3)), good], return_exceptions=True)
    assert isinstance(results[1], warmpool.InvalidArgument)
    dense_reference.assert_matches(daemon.model_paths["tiny"], good, results[0])
    with pytest.raises(warmpool.InvalidArgument):
        client.infer_many("tiny", [good, np.ones((1, 3)), good])


def test_one_client_per_thread(daemon):
    path = daemon.model_paths["wide"]
    failures = []

    def run(seed):
        try:
            with warmpool.Client(daemon.socket) as c:
                xs = [random_input(2, 24, seed=seed * 100 + i) for i in range(30)]
                for x, y in zip(xs, c.infer_many("wide", xs)):
                    dense_reference.assert_matches(path, x, y)
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=run, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not failures, failures
