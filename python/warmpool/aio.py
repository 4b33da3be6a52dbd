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

from . import _replies, _requests
from ._errors import WarmpoolError, error_from_code, fresh, internal, unavailable
from ._framing import PROTOCOL_MAX_FRAME_BYTES, PROTOCOL_VERSION, FrameDecoder, encode_frame
from ._replies import parse_envelope
from ._socket import check_socket_path, connect_error, resolve_socket_path
from ._tensors import as_input_matrix
from .client import DEFAULT_PIPELINE_WINDOW

_READ_CHUNK = 256 << 10


def _consume_outcome(task):
    if not task.cancelled():
        task.exception()


class AsyncClient:
    """A connection to warmpoold for asyncio. Make one with ``await AsyncClient.connect()``."""

    def __init__(self, sock, socket_path, max_frame_bytes, max_in_flight):
        """Use AsyncClient.connect()."""
        self.socket_path = socket_path
        self.max_in_flight = max_in_flight
        self._slots = asyncio.Semaphore(max_in_flight)
        self._sock = sock
        self._loop = asyncio.get_running_loop()
        self._decoder = FrameDecoder(max_frame_bytes)
        self._next_id = 1
        self._sent_version = False
        self._futures = {}  # request_id -> future of its reply Envelope
        self._write_lock = asyncio.Lock()
        self._broken = None  # the error that ended the connection
        self._reader = self._loop.create_task(self._read_replies())

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
        check_socket_path(path)
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(sock, path)
        except OSError as error:
            sock.close()
            raise connect_error(path, error) from None
        return cls(sock, path, max_frame_bytes, max_in_flight)

    async def close(self):
        """Closes the connection; requests still waiting fail with Unavailable."""
        if self._reader is not None:
            self._reader.cancel()
            try:
                await self._reader
            except asyncio.CancelledError:
                pass
            self._reader = None
        self._fail(unavailable("the client was closed before warmpoold answered"))
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc_info):
        await self.close()

    @property
    def pending(self):
        """How many requests were sent and wait for their replies (at most max_in_flight)."""
        return len(self._futures)

    # ---- the connection ----

    async def request(self, envelope):
        """Sends a request Envelope and returns its reply Envelope (an error reply is returned,
        not raised). The client sets request_id and protocol_version."""
        async with self._slots:
            if self._broken is not None:
                raise fresh(self._broken)
            request_id = self._next_id
            self._next_id += 1
            envelope.request_id = request_id
            if not self._sent_version:
                envelope.protocol_version = PROTOCOL_VERSION
                self._sent_version = True
            frame = encode_frame(envelope.SerializeToString())
            future = self._loop.create_future()
            self._futures[request_id] = future
            try:
                # Shielded: a caller cancelled mid-write must not leave half a frame on the
                # stream (and the write's outcome is then nobody's to retrieve but its own).
                write = asyncio.ensure_future(self._write(frame))
                write.add_done_callback(_consume_outcome)
                await asyncio.shield(write)
                return await future
            finally:
                self._futures.pop(request_id, None)

    async def _write(self, frame):
        async with self._write_lock:
            if self._broken is not None:
                raise fresh(self._broken)
            try:
                await self._loop.sock_sendall(self._sock, frame)
            except OSError as error:
                # The daemon may have said why it closed the connection (a refused frame, too
                # many connections) before closing it: the reader, which reads up to the end,
                # records that, and it beats "broken pipe".
                if self._reader is not None:
                    await asyncio.wait([self._reader], timeout=1.0)
                self._fail(unavailable(
                    f"warmpoold closed the connection (writing failed: {error.strerror or error})"))
                raise fresh(self._broken) from None

    async def _read_replies(self):
        error = None
        try:
            while error is None:
                data = await self._loop.sock_recv(self._sock, _READ_CHUNK)
                if not data:
                    error = self._decoder.end_of_stream_error()
                    break
                self._decoder.feed(data)
                while error is None:
                    body = self._decoder.next_frame()
                    if body is None:
                        break
                    envelope = parse_envelope(body)
                    if envelope.request_id == 0 and envelope.HasField("error"):
                        # The daemon's word on the connection itself; it closes next.
                        error = error_from_code(envelope.error.code, envelope.error.message)
                        break
                    future = self._futures.get(envelope.request_id)
                    if future is not None and not future.done():
                        future.set_result(envelope)
        except asyncio.CancelledError:
            raise
        except WarmpoolError as failure:  # an oversized or unparsable frame
            error = failure
        except OSError as failure:
            error = unavailable(f"reading from warmpoold failed: {failure.strerror or failure}")
        except Exception as failure:  # noqa: BLE001 - never leave a future waiting
            error = internal(f"the reply reader failed: {failure!r}")
        self._fail(error)

    def _fail(self, error):
        if self._broken is None:
            self._broken = error
        for future in self._futures.values():
            if not future.done():
                future.set_exception(fresh(self._broken))

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

    async def fault_arm(self, point, action, model=None, after=0, times=0):
        """Arms a fault in the workers (--enable-fault-injection only); returns its id."""
        return await self._call(_requests.fault_arm(point, action, model, after, times),
                                "fault_arm_reply")

    async def fault_clear(self):
        """Disarms every fault; returns how many were armed."""
        return await self._call(_requests.fault_clear(), "fault_clear_reply")
