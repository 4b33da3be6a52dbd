"""A scripted stand-in for warmpoold on a Unix socket, for what a real daemon will not do on
demand: hold every reply until all requests are in, answer out of order, send a frame in pieces,
close in the middle of a frame, send an oversized length.

The script is a function run on a thread with the accepted connection: script(conn) and the
helpers below read and write frames with the real protocol module.
"""

import os
import socket
import struct
import tempfile
import threading

from warmpool import warmpool_pb2 as pb


class FakeDaemon:
    def __init__(self, script):
        self._dir = tempfile.mkdtemp(prefix="warmpool-fake-")
        self.path = os.path.join(self._dir, "fake.sock")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(1)
        self.error = None
        self.received = []  # every request Envelope, in arrival order
        self._script = script
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        try:
            conn, _ = self._listener.accept()
            with conn:
                conn.settimeout(5)  # a client that stops sending fails the test in 5 s
                self._script(Connection(conn, self.received))
        except BaseException as error:  # reported by join()
            self.error = error

    def join(self, timeout=20):
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the fake daemon's script did not finish"
        if self.error is not None:
            raise self.error

    def close(self):
        self._listener.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        os.rmdir(self._dir)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


class Connection:
    def __init__(self, sock, received):
        self.sock = sock
        self._received = received
        self._buffer = b""

    def _read_exactly(self, n):
        while len(self._buffer) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError(f"the client closed the connection ({len(self._buffer)} of {n} bytes)")
            self._buffer += chunk
        data, self._buffer = self._buffer[:n], self._buffer[n:]
        return data

    def read_request(self):
        (length,) = struct.unpack("<I", self._read_exactly(4))
        envelope = pb.Envelope.FromString(self._read_exactly(length))
        self._received.append(envelope)
        return envelope

    def at_eof(self):
        """Whether the client closed its end (no more bytes)."""
        if self._buffer:
            return False
        return self.sock.recv(1) == b""

    @staticmethod
    def frame(envelope):
        body = envelope.SerializeToString()
        return struct.pack("<I", len(body)) + body

    def send(self, envelope):
        self.sock.sendall(self.frame(envelope))

    def send_raw(self, data):
        self.sock.sendall(data)


def echo_reply(request):
    """The reply an echo model gives to an infer request."""
    reply = pb.Envelope(request_id=request.request_id)
    reply.infer_reply.output.CopyFrom(request.infer.input)
    reply.infer_reply.batch_rows = request.infer.input.rows
    return reply


def error_reply(request_id, code, message):
    reply = pb.Envelope(request_id=request_id)
    reply.error.code = code
    reply.error.message = message
    return reply
