"""The asyncio client: the same requests as Client, as coroutines, with any number of them in
flight on one connection. A reader task reads every reply and resolves the waiting request's
future by request_id; frames are written whole, one at a time.

    client = await warmpool.AsyncClient.connect()
    outputs = await asyncio.gather(*(client.infer("tiny", x) for x in inputs))
    await client.close()

Tensors always travel in frames here (no shared-memory region), so an input must stay below the
daemon's [limits] max_frame_bytes (64 MiB by default); Client.infer sends large inputs through a
region instead.
"""

import asyncio
import socket as _socket

from . import _generation, _replies, _requests, _typed
from ._aio_stream import StreamSink, open_stream
from ._errors import WarmpoolError, error_from_code, fresh, internal, unavailable
from ._framing import PROTOCOL_MAX_FRAME_BYTES, PROTOCOL_VERSION, FrameDecoder, encode_frame
from ._replies import parse_envelope
from ._socket import check_socket_path, connect_error, resolve_socket_path
from ._tensors import as_input_matrix
from .client import DEFAULT_PIPELINE_WINDOW

_READ_CHUNK = 256 << 10


def _consume_outcome(future):
    if not future.cancelled():
        future.exception()


def _wake(waiter):
    if not waiter.done():
        waiter.set_result(None)


def _reset_error(why):
    return unavailable(f"the connection to warmpoold was reset before this request was answered: "
                       f"{why}; the next call connects again")


async def _open(path):
    check_socket_path(path)
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(sock, path)
    except OSError as error:
        sock.close()
        raise connect_error(path, error) from None
    except BaseException:
        sock.close()
        raise
    return sock


class _Connection:
    """One socket to warmpoold and the requests sent on it that wait for their replies."""

    def __init__(self, sock, max_frame_bytes):
        self.sock = sock
        self.fd = sock.fileno()
        self.decoder = FrameDecoder(max_frame_bytes)
        self.sent_version = False
        # request_id -> the future of its reply Envelope. Each entry holds one of the client's
        # max_in_flight slots until its reply comes or the connection is dropped, whether its
        # caller still waits or was cancelled: the daemon counts the request against its own
        # limit until it answers.
        self.waiting = {}
        self.write_lock = asyncio.Lock()  # frames go out whole, one at a time
        self.readiness = set()  # futures of the reader and writer waiting on the socket
        self.reader = None
        self.error = None  # why it was dropped; None while it serves


class AsyncClient:
    """A connection to warmpoold for asyncio. Make one with ``await AsyncClient.connect()``.

    Cancelling a request (``task.cancel()``, ``asyncio.wait_for``, a TaskGroup) never cuts its
    frame: a write under way finishes, one not begun is skipped. A request that went out keeps
    its place among the ``max_in_flight`` until the daemon answers it (the reply is then
    dropped), as the daemon counts it against its own limit until then.

    An interruption that does cut a frame (KeyboardInterrupt or another exception raised in the
    middle of a write or a read, the loop cancelling the client's tasks) *resets* the connection:
    the requests in flight on it raise Unavailable ("... was reset ..."), and the next call
    connects again. A client closed, or whose connection the daemon ended, stays so.
    """

    def __init__(self, sock, socket_path, max_frame_bytes, max_in_flight):
        """Use AsyncClient.connect()."""
        self.socket_path = socket_path
        self.max_in_flight = max_in_flight
        self._max_frame_bytes = max_frame_bytes
        self._loop = asyncio.get_running_loop()
        self._slots = asyncio.BoundedSemaphore(max_in_flight)
        self._next_id = 1
        self._broken = None  # closed, or ended by the daemon: every later call raises it
        self._connecting = asyncio.Lock()
        self._conn = self._start(sock)

    @classmethod
    async def connect(cls, socket=None, *, max_frame_bytes=PROTOCOL_MAX_FRAME_BYTES,
                      max_in_flight=DEFAULT_PIPELINE_WINDOW):
        """Connects to warmpoold; socket as for Client (None: found as the CLI finds it).

        max_in_flight: requests sent and not yet answered at most; more wait in the client
            for a reply to come (the daemon's [limits] max_requests_per_connection, 256 by
            default, answers the excess RESOURCE_EXHAUSTED).

        Raises Unavailable (naming the socket) when no daemon listens there.
        """
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        path = resolve_socket_path(socket)
        return cls(await _open(path), path, max_frame_bytes, max_in_flight)

    async def close(self):
        """Closes the connection; requests still waiting fail with Unavailable."""
        if self._broken is None:
            self._broken = unavailable("the client was closed before warmpoold answered")
        conn, self._conn = self._conn, None
        if conn is not None:
            self._drop(conn, self._broken)
            await asyncio.wait([conn.reader])

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc_info):
        await self.close()

    @property
    def pending(self):
        """Requests sent (or being written) and not answered yet, those whose callers were
        cancelled included (at most max_in_flight)."""
        return len(self._conn.waiting) if self._conn is not None else 0

    # ---- the connection ----

    async def request(self, envelope):
        """Sends a request Envelope and returns its reply Envelope (an error reply is returned,
        not raised). The client sets request_id and protocol_version."""
        future = self._loop.create_future()
        future.add_done_callback(_consume_outcome)  # its caller may be gone when it fails
        await self._send(envelope, future)
        return await future

    async def _send(self, envelope, waiter):
        """Sends a request whose reply `waiter` takes (a future; a generation's StreamSink), in
        one of the max_in_flight slots; returns the connection it went out on."""
        await self._slots.acquire()
        try:
            conn = await self._connection()
        except BaseException:
            self._slots.release()
            raise
        request_id = self._next_id
        self._next_id += 1
        envelope.request_id = request_id
        conn.waiting[request_id] = waiter  # the slot is the connection's to give back now
        write = self._loop.create_task(self._write(conn, request_id, envelope, waiter))
        write.add_done_callback(_consume_outcome)
        try:
            await asyncio.shield(write)
        except asyncio.CancelledError:
            # The caller is gone; the frame is not cut: a write under way finishes (the reply
            # is dropped when it comes), one not begun sees the cancelled waiter and skips.
            waiter.cancel()
            raise
        except (KeyboardInterrupt, SystemExit):
            # Raised in the write task, which stopped the loop with it once already; this
            # request's outcome is the reset it caused.
            if conn.error is None:
                raise
            raise fresh(conn.error) from None
        return conn

    async def _connection(self):
        """The connection to send on, connected again after a reset."""
        while True:
            if self._broken is not None:
                raise fresh(self._broken)
            if self._conn is not None:
                return self._conn
            async with self._connecting:
                if self._broken is None and self._conn is None:
                    sock = await _open(self.socket_path)
                    if self._broken is not None:  # closed meanwhile
                        sock.close()
                    else:
                        self._conn = self._start(sock)

    def _start(self, sock):
        conn = _Connection(sock, self._max_frame_bytes)
        conn.reader = self._loop.create_task(self._read_replies(conn))
        conn.reader.add_done_callback(_consume_outcome)  # its interruption was raised once
        return conn

    async def _write(self, conn, request_id, envelope, future):
        async with conn.write_lock:
            if conn.error is not None:
                raise fresh(conn.error)  # dropped while this waited (its entry with it)
            if future.done():  # its caller was cancelled before a byte went out
                self._settle(conn, request_id)
                return
            sent = 0
            try:
                if not conn.sent_version:
                    envelope.protocol_version = PROTOCOL_VERSION
                frame = memoryview(encode_frame(envelope.SerializeToString()))
                while sent < len(frame):
                    try:
                        sent += conn.sock.send(frame[sent:], _socket.MSG_NOSIGNAL)
                    except (BlockingIOError, InterruptedError):
                        await self._ready(conn, writable=True)
            except BaseException as error:
                if conn.error is not None:  # dropped meanwhile: its error says why
                    raise fresh(conn.error) from None
                if isinstance(error, OSError):
                    await self._write_failed(conn, error)
                if sent == 0:  # nothing went out: the stream is still at a frame boundary
                    self._settle(conn, request_id)
                    raise
                # Part of a frame is out: the daemon would read the next one as its rest.
                self._drop(conn, _reset_error(
                    f"writing a request was interrupted ({type(error).__name__}) after {sent} "
                    f"of its {len(frame)} bytes"))
                raise
            conn.sent_version = True

    async def _write_failed(self, conn, error):
        # The daemon may have said why it closed the connection (a refused frame, too many
        # connections) before closing it: the reader, which reads up to the end, records that,
        # and it beats "broken pipe".
        await asyncio.wait([conn.reader], timeout=1.0)
        self._drop(conn, unavailable(
            f"warmpoold closed the connection (writing failed: {error.strerror or error})"),
            final=True)
        raise fresh(conn.error) from None

    async def _ready(self, conn, writable):
        """Until the socket is writable (or readable); cancelled when conn is dropped."""
        waiter = self._loop.create_future()
        conn.readiness.add(waiter)
        (self._loop.add_writer if writable else self._loop.add_reader)(conn.fd, _wake, waiter)
        try:
            await waiter
        finally:
            conn.readiness.discard(waiter)
            if conn.error is None:  # once dropped, the descriptor's number may be another's
                (self._loop.remove_writer if writable else self._loop.remove_reader)(conn.fd)

    async def _read_replies(self, conn):
        error = None
        try:
            while error is None:
                try:
                    data = conn.sock.recv(_READ_CHUNK)
                except (BlockingIOError, InterruptedError):
                    await self._ready(conn, writable=False)
                    continue
                if not data:
                    error = conn.decoder.end_of_stream_error()
                    break
                conn.decoder.feed(data)
                while error is None:
                    body = conn.decoder.next_frame()
                    if body is None:
                        break
                    envelope = parse_envelope(body)
                    if envelope.request_id == 0 and envelope.HasField("error"):
                        # The daemon's word on the connection itself; it closes next.
                        error = error_from_code(envelope.error.code, envelope.error.message)
                        break
                    future = conn.waiting.get(envelope.request_id)
                    if future is not None and envelope.HasField("generate_chunk"):
                        if isinstance(future, StreamSink):  # a generation's: more to come
                            future.put_chunk(envelope)
                    elif future is not None:
                        self._settle(conn, envelope.request_id)
                        if not future.done():  # else its caller was cancelled: dropped
                            future.set_result(envelope)
        except WarmpoolError as failure:  # an oversized or unparsable frame
            error = failure
        except OSError as failure:
            error = unavailable(f"reading from warmpoold failed: {failure.strerror or failure}")
        except Exception as failure:  # noqa: BLE001 - never leave a future waiting
            error = internal(f"the reply reader failed: {failure!r}")
        except BaseException as failure:
            # Cancelled by close() or a drop (conn.error says why), or interrupted, maybe with
            # bytes read that never reached the decoder: nothing read later can be trusted.
            if conn.error is None:
                self._drop(conn, _reset_error(
                    f"reading replies was interrupted ({type(failure).__name__})"))
            raise
        self._drop(conn, error, final=True)

    def _settle(self, conn, request_id):
        """request_id was answered (or never went out): its slot comes back."""
        if conn.waiting.pop(request_id, None) is not None:
            self._slots.release()

    def _drop(self, conn, error, final=False):
        """Discards conn: what waits on it fails with error and gives its slot back, and its
        socket is closed (the daemon then drops what it still holds for it). final (the
        daemon ended it, or the client was closed): every later call raises error; otherwise
        the next call connects again."""
        if final and self._broken is None:
            self._broken = error
        if self._conn is conn:
            self._conn = None
        if conn.error is not None:
            return
        conn.error = error
        waiting, conn.waiting = conn.waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(fresh(error))
            self._slots.release()
        # Nothing may stay registered on the descriptor: the next socket may get its number.
        self._loop.remove_reader(conn.fd)
        self._loop.remove_writer(conn.fd)
        for waiter in list(conn.readiness):
            waiter.cancel()
        if conn.reader is not None and conn.reader is not asyncio.current_task():
            conn.reader.cancel()
        conn.sock.close()

    async def _call(self, envelope, expected):
        return _replies.expect(await self.request(envelope), expected)

    # ---- requests (see Client for what each takes and returns) ----

    async def models(self):
        """Every registered model: a list of ModelInfo."""
        return await self._call(_requests.models(), "models_reply")

    async def ps(self):
        """Models loaded, loading, parked or failed: a list of PsEntry."""
        return await self._call(_requests.ps(), "ps_reply")

    async def status(self):
        """The daemon, its devices and workers: a Status."""
        return await self._call(_requests.status(), "status_reply")

    async def load(self, model, replicas=None, keep_alive=None):
        """Loads a model; returns a LoadResult once it is ready."""
        return await self._call(_requests.load(model, replicas, keep_alive), "load_reply")

    async def unload(self, model, park=False):
        """Unloads (or parks) a model once its requests have finished."""
        await self._call(_requests.unload(model, park), "unload_reply")

    async def unload_all(self):
        """Releases every loaded model; returns the daemon's summary."""
        return await self._call(_requests.unload_all(), "unload_reply")

    async def pin(self, model):
        """Pins a model (never evicted or expired); returns True."""
        return await self._call(_requests.pin(model, True), "pin_reply")

    async def unpin(self, model):
        """Unpins a model; returns False."""
        return await self._call(_requests.pin(model, False), "pin_reply")

    async def register(self, model, path, engine=None):
        """Adds a model while the daemon runs (a RegisterResult)."""
        return await self._call(_requests.register(model, path, engine), "register_model_reply")

    async def unregister(self, model):
        """Forgets a client-registered model once its work ends (a RegisterResult)."""
        return await self._call(_requests.unregister(model), "register_model_reply")

    async def infer(self, model, data, deadline_ms=None, keep_alive=None):
        """The model's output on data, a float32 array (rows x out_features)."""
        matrix = as_input_matrix(data)
        return await self._call(_requests.infer(model, matrix, deadline_ms, keep_alive),
                                "infer_reply")

    async def infer_many(self, model, inputs, deadline_ms=None, keep_alive=None, *,
                         window=None, return_exceptions=False):
        """Inference on many inputs, concurrently; outputs in input order. At most ``window``
        of them are in flight at once (None: as many as max_in_flight lets through). Every
        input is checked before anything is sent."""
        matrices = [as_input_matrix(data) for data in inputs]
        limit = asyncio.Semaphore(window if window is not None else len(matrices) or 1)

        async def one(matrix):
            async with limit:
                return await self._call(_requests.infer(model, matrix, deadline_ms, keep_alive),
                                        "infer_reply")

        return await asyncio.gather(*(one(m) for m in matrices),
                                    return_exceptions=return_exceptions)

    async def generate(self, model, prompt=None, *, tokens=None, messages=None, stream=True, **options):
        """Text from a language model, as Client.generate: with ``stream`` an AsyncGeneration
        (``async for chunk in ...``; then its ``result``), else the GenerateResult."""
        envelope = _generation.request(model, prompt, tokens, messages=messages, stream=stream, **options)
        if not stream:
            return _generation.result(await self.request(envelope))
        return await open_stream(self, envelope)

    async def embed(self, model, inputs, *, deadline_ms=None, keep_alive=None, dimensions=None):
        """Embeddings from a language model, as Client.embed: an EmbedResult."""
        envelope = _generation.embed_request(model, inputs, deadline_ms=deadline_ms, keep_alive=keep_alive,
                                             dimensions=dimensions)
        return _generation.embed_result(await self.request(envelope))

    async def infer_tensors(self, model, inputs, *, deadline_ms=None, keep_alive=None):
        """Typed tensors, as Client.infer_tensors: a dict of name to array."""
        envelope = _typed.request(model, inputs, deadline_ms=deadline_ms, keep_alive=keep_alive)
        return _typed.outputs(_replies.body(await self.request(envelope), "infer_reply"))

    async def fault_arm(self, point, action, model=None, after=0, times=0):
        """Arms a fault in the workers (--enable-fault-injection only); returns its id."""
        return await self._call(_requests.fault_arm(point, action, model, after, times),
                                "fault_arm_reply")

    async def fault_clear(self):
        """Disarms every fault; returns how many were armed."""
        return await self._call(_requests.fault_clear(), "fault_clear_reply")
