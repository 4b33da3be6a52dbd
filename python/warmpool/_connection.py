"""The blocking client's connection: frames out and in over one socket, replies matched by
request_id, and what an interruption does to it.

A frame is a length and then that many bytes: a write cut short leaves the daemon reading the
next request as the rest of this one, and a reply read in part (or bytes read and lost to an
exception before they reached the decoder) leaves this client reading garbage. So a
KeyboardInterrupt, a timeout or any other exception that lands between the first byte of a
request and its reply *resets* the connection: the socket is closed (the daemon then drops what
it held for it, shared-memory region included), requests pipelined on it raise Unavailable at
wait(), and the next call connects again. An interruption before the first byte or after the
reply leaves the connection as it was. A connection the daemon ended stays ended.
"""

import collections
import socket as _socket

from ._errors import WarmpoolError, error_from_code, fresh, unavailable
from ._framing import PROTOCOL_VERSION, FrameDecoder, encode_frame
from ._replies import parse_envelope
from ._socket import connect_blocking, send_frame

_READ_CHUNK = 64 << 10
_MAX_READ = 16 << 20
# A timeout is the caller's interruption, not the daemon closing the connection.
_TIMEOUTS = (_socket.timeout, TimeoutError)


def _name(error):
    return type(error).__name__


def _is_chunk(envelope):
    """A generation's chunk: its request's final reply is still to come."""
    return envelope.HasField("generate_chunk")


class Connection:
    """Requests out, replies in, on one socket that an interruption may replace (see the
    module's docstring). Client builds every request on it."""

    def __init__(self, socket_path, max_frame_bytes):
        self.socket_path = socket_path
        self._decoder = FrameDecoder(max_frame_bytes)
        self._sock = connect_blocking(self.socket_path)
        self._next_id = 1
        self._sent_version = False
        self._pending = set()  # request ids sent and not yet received
        # Replies received while waiting for another, by request id: a generation's chunks
        # share their request's id, so each id has a queue.
        self._stash = {}
        self._lost = {}  # request id -> the reset that lost its reply (for wait())
        self._broken = None  # the error that ended the client (closed, or the daemon ended it)

    def _close_socket(self):
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __del__(self):
        sock = getattr(self, "_sock", None)
        if sock is not None:
            sock.close()

    def fileno(self):
        return self._sock.fileno() if self._sock is not None else -1

    def send(self, envelope, fds=()):
        """Sends a request Envelope without waiting; returns its request_id.

        The client sets request_id (and protocol_version on the first request). fds travel
        with the frame (SCM_RIGHTS), e.g. a region's memfd.
        """
        self._check_open()
        request_id = self._next_id
        envelope.request_id = request_id
        if not self._sent_version:
            envelope.protocol_version = PROTOCOL_VERSION
        frame = encode_frame(envelope.SerializeToString())
        self._next_id += 1
        # Pending before the first byte goes out: an interruption right after the last byte
        # must still find the request here (its reply is coming).
        self._pending.add(request_id)
        progress = [0]  # bytes of the frame written, whatever interrupts send_frame
        try:
            send_frame(self._sock, frame, fds, progress)
        except BaseException as error:
            if isinstance(error, OSError) and not isinstance(error, _TIMEOUTS):
                self._pending.discard(request_id)
                raise self._write_failed(error) from None
            if progress[0] == 0:  # nothing went out: the stream is still at a frame boundary
                self._pending.discard(request_id)
            else:
                self._reset(f"writing a request was interrupted ({_name(error)}) after "
                            f"{progress[0]} of its {len(frame)} bytes")
            raise
        self._sent_version = True
        return request_id

    def wait_envelope(self, request_id):
        """The raw reply Envelope to one request (an error reply is returned, not raised).

        Raises Unavailable when the connection the request went out on was reset before its
        reply came (see the module's docstring)."""
        if request_id in self._stash:
            return self._take_stashed(request_id)
        if request_id in self._lost:
            raise fresh(self._lost.pop(request_id))
        if request_id not in self._pending:
            raise ValueError(f"request {request_id} is not waiting for a reply on this connection")
        if self._broken is not None:
            raise fresh(self._broken)
        try:
            while True:
                envelope = self._read_envelope()
                if envelope.request_id == request_id:
                    if not _is_chunk(envelope):  # a chunk: the request waits on
                        self._pending.discard(request_id)
                    return envelope
                self._stash.setdefault(envelope.request_id, collections.deque()).append(envelope)
        except BaseException as error:
            # Not the daemon ending the connection (that is recorded in _broken): an
            # interruption, which may have cut a frame or lost a reply already read.
            if self._broken is None:
                self._reset(f"waiting for a reply was interrupted ({_name(error)})")
            raise

    def _take_stashed(self, request_id):
        queue = self._stash[request_id]
        envelope = queue.popleft()
        if not queue:
            del self._stash[request_id]
        if not _is_chunk(envelope):
            self._pending.discard(request_id)
        return envelope

    @property
    def pending(self):
        """Request ids sent whose replies have not been taken by wait() yet (those lost to a
        reset included: wait() raises Unavailable for them)."""
        return frozenset(self._pending | self._lost.keys())

    def _exchange(self, envelope, fds=()):
        """Sends a request and waits for its reply. A caller interrupted in between abandons
        its request: the connection is reset, so that its reply never lands in the stash for
        nobody, nor its output in a region the next request uses."""
        request_id = self._next_id  # the id send() gives it
        try:
            return self.wait_envelope(self.send(envelope, fds))
        except BaseException as error:
            if request_id in self._pending:
                self._reset(f"a call was interrupted before its reply ({_name(error)})")
            self._lost.pop(request_id, None)  # nobody else waits for it
            raise

    def _check_open(self):
        """Raises the client's end, or connects again after a reset."""
        if self._broken is not None:
            raise fresh(self._broken)
        if self._sock is None:
            self._sock = connect_blocking(self.socket_path)

    def _reset(self, why):
        """Drops a connection an interruption left unusable; the next call connects again.
        Closing the socket is what makes the daemon drop the requests it still holds for it
        and this connection's region, whose memfd is closed here too."""
        if self._broken is not None or self._sock is None:
            return
        sock, self._sock = self._sock, None
        sock.close()
        self._connection_reset()
        self._decoder = FrameDecoder(self._decoder.max_frame_bytes)
        self._sent_version = False
        lost = unavailable(f"the connection to warmpoold was reset before this request was "
                           f"answered: {why}; the next call connects again")
        # Replies already read stay good; only those still to come are lost (a stream's chunks
        # read stay good too, and its end is lost).
        answered = {request_id for request_id in self._pending
                    if any(not _is_chunk(e) for e in self._stash.get(request_id, ()))}
        for request_id in self._pending - answered:
            self._lost[request_id] = lost
        self._pending = answered

    def _connection_reset(self):
        """What else goes with a reset connection (Client: its region)."""

    def _fail(self, error):
        if self._broken is None:
            self._broken = error
        return self._broken

    def _read_envelope(self):
        """The next frame from the socket, as an Envelope. A connection-level error from the
        daemon (request_id 0) raises its typed exception."""
        while True:
            body = self._decoder.next_frame()  # an oversized prefix raises ResourceExhausted
            if body is not None:
                break
            try:
                data = self._sock.recv(max(_READ_CHUNK, min(self._decoder.missing(), _MAX_READ)))
            except _TIMEOUTS:
                raise  # not the daemon's doing: the caller's reset
            except OSError as error:
                raise self._fail(unavailable(
                    f"reading from warmpoold failed: {error.strerror or error}")) from None
            if not data:
                raise self._fail(self._decoder.end_of_stream_error())
            try:
                self._decoder.feed(data)
            except WarmpoolError as error:  # a length above max_frame_bytes
                raise self._fail(error) from None
        envelope = parse_envelope(body)
        if envelope.request_id == 0 and envelope.HasField("error"):
            # The daemon's word on the connection itself (e.g. a refused frame); it closes next.
            raise self._fail(error_from_code(envelope.error.code, envelope.error.message))
        return envelope

    def _write_failed(self, error):
        """The error for a write that failed: the daemon may have said why it closed the
        connection (too many connections, a refused frame) before closing; that beats
        "broken pipe". Replies that arrived before stay available to wait()."""
        farewell = None
        try:
            # After the peer closed, a read finds the bytes it left or end-of-file.
            self._sock.settimeout(1.0)
            while farewell is None:
                body = self._decoder.next_frame()
                if body is None:
                    data = self._sock.recv(_READ_CHUNK)
                    if not data:
                        break
                    self._decoder.feed(data)
                    continue
                envelope = parse_envelope(body)
                if envelope.request_id == 0 and envelope.HasField("error"):
                    farewell = error_from_code(envelope.error.code, envelope.error.message)
                else:
                    self._stash.setdefault(envelope.request_id, collections.deque()).append(envelope)
        except Exception:  # noqa: BLE001 - nothing more to learn from the connection
            pass
        except BaseException:
            self._fail(unavailable("warmpoold closed the connection"))
            raise
        return self._fail(farewell or unavailable(
            f"warmpoold closed the connection (writing failed: {error.strerror or error})"))
