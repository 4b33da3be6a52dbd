"""The blocking client: one connection to warmpoold, a method for every request of the protocol,
and pipelining (several requests in flight, replies matched by request_id).

Not thread-safe: use one Client per thread (or AsyncClient for concurrency on one connection).
A call interrupted mid-request (KeyboardInterrupt, a timeout, any exception) resets the
connection and the next call connects again: see warmpool._connection.
"""

import collections

from . import _generation, _replies, _requests, _typed
from ._connection import Connection
from ._errors import internal, unavailable
from ._framing import PROTOCOL_MAX_FRAME_BYTES
from ._region import SharedRegion, round_up
from ._socket import resolve_socket_path
from ._tensors import as_input_matrix, matrix_from_tensor

#: Inputs of this many bytes or more go through a shared-memory region by default.
DEFAULT_REGION_THRESHOLD = 1 << 20
#: The daemon's default [limits] max_requests_per_connection.
DEFAULT_PIPELINE_WINDOW = 256
#: Request bytes infer_many keeps in flight at most (the daemon's per-connection byte budget
#: defaults to 256 MiB and its bound on unread replies to 128 MiB).
DEFAULT_PIPELINE_WINDOW_BYTES = 64 << 20


class Client(Connection):
    """A connection to warmpoold.

    Args:
        socket: the daemon's socket path; None finds it as the CLI does: $WARMPOOL_SOCKET, else
            $XDG_RUNTIME_DIR/warmpool.sock or /tmp/warmpool-$UID.sock, else the system
            service's /run/warmpool/warmpool.sock (see warmpool.default_socket_path).
        max_frame_bytes: the largest reply frame accepted (default: the protocol's 4 GiB; the
            daemon bounds what it sends by its own [limits] max_frame_bytes).
        region_threshold: infer() sends inputs of this many bytes or more through a
            shared-memory region that the client keeps for itself (registered on first use,
            grown when needed), so the daemon never copies them; 0 sends every input in frames.

    Raises:
        Unavailable: no daemon listens on the socket (the message names the socket).

    A call interrupted between the first byte of its request and its reply (KeyboardInterrupt,
    a socket timeout, an exception raised by a signal handler) raises what interrupted it and
    resets the connection: requests pipelined on it raise Unavailable at wait(), the daemon
    drops what it held for it (this client's region included), and the next call connects
    again. An interruption before the first byte or after the reply changes nothing.
    """

    def __init__(self, socket=None, *, max_frame_bytes=PROTOCOL_MAX_FRAME_BYTES,
                 region_threshold=DEFAULT_REGION_THRESHOLD):
        super().__init__(resolve_socket_path(socket), max_frame_bytes)
        self.region_threshold = region_threshold
        self._region = None
        self._largest_output = 0

    # ---- connection ----

    def close(self):
        """Closes the connection; the daemon lets go of this connection's region and drops
        requests still unanswered."""
        self._close_socket()
        self._connection_reset()
        if self._broken is None:
            self._broken = unavailable("the client was closed")

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    # ---- pipelining ----

    def send_infer(self, model, data, deadline_ms=None, keep_alive=None):
        """Sends an inference request without waiting (always in a frame, never a region);
        returns its request_id for wait()."""
        matrix = as_input_matrix(data)
        return self.send(_requests.infer(model, matrix, deadline_ms, keep_alive))

    def wait(self, request_id):
        """The reply to one request as the matching method returns it (infer: a numpy array),
        stashing replies to other requests that arrive first. An error reply raises."""
        return _replies.decode(self.wait_envelope(request_id))

    def infer_many(self, model, inputs, deadline_ms=None, keep_alive=None, *,
                   window=DEFAULT_PIPELINE_WINDOW, window_bytes=DEFAULT_PIPELINE_WINDOW_BYTES,
                   return_exceptions=False):
        """Inference on many inputs pipelined over this connection; the outputs in input order.

        Every input is checked before anything is sent. Up to ``window`` requests (and
        ``window_bytes`` of input) are sent before the first reply is read, then one more per
        reply; the daemon answers each request (max_requests_per_connection, 256 by default)
        and lets the dynamic batcher merge those that meet at a worker. With
        ``return_exceptions`` a failed request's WarmpoolError takes its place in the list;
        otherwise the first failure is raised once every reply is in.
        """
        matrices = [as_input_matrix(data) for data in inputs]
        if window is not None and window < 1:
            raise ValueError("window must be at least 1 (or None for no bound)")
        ids = []
        results = [None] * len(matrices)
        in_flight = collections.deque()  # (index, bytes)
        in_flight_bytes = 0
        first_error = None

        def take_oldest():
            nonlocal in_flight_bytes, first_error
            index, size = in_flight.popleft()
            in_flight_bytes -= size
            try:
                results[index] = self.wait(ids[index])
            except Exception as error:  # noqa: BLE001 - a reply's error, kept for its slot
                if self._broken is not None or self._sock is None:  # the connection's end
                    raise
                results[index] = error
                if first_error is None:
                    first_error = error

        for index, matrix in enumerate(matrices):
            while in_flight and (
                (window is not None and len(in_flight) >= window)
                or in_flight_bytes + matrix.nbytes > window_bytes
            ):
                take_oldest()
            ids.append(self.send(_requests.infer(model, matrix, deadline_ms, keep_alive)))
            in_flight.append((index, matrix.nbytes))
            in_flight_bytes += matrix.nbytes
        while in_flight:
            take_oldest()
        if first_error is not None and not return_exceptions:
            raise first_error
        return results

    # ---- requests ----

    def models(self):
        """Every registered model: a list of ModelInfo."""
        return self._call(_requests.models(), "models_reply")

    def ps(self):
        """Models loaded, loading, parked or failed: a list of PsEntry."""
        return self._call(_requests.ps(), "ps_reply")

    def status(self):
        """The daemon, its devices and workers: a Status."""
        return self._call(_requests.status(), "status_reply")

    def load(self, model, replicas=None, keep_alive=None):
        """Loads a model and returns when it is ready (a LoadResult).

        replicas: workers serving it from one copy of its weights (None: as configured).
        keep_alive: how long it stays warm after its last request: seconds, a string such as
            "5m", "30s" or "250ms", 0 (release as soon as idle), -1 (until evicted), or None
            (the model's configured keep_alive).
        """
        return self._call(_requests.load(model, replicas, keep_alive), "load_reply")

    def unload(self, model, park=False):
        """Unloads a model once its requests have finished; park keeps a host copy (the
        daemon's park budget) so that the next load is a memory copy."""
        self._call(_requests.unload(model, park), "unload_reply")

    def unload_all(self):
        """Releases every loaded model, parking where the park budget allows; returns the
        daemon's summary ("N model(s), M parked")."""
        return self._call(_requests.unload_all(), "unload_reply")

    def pin(self, model):
        """Pins a model: never evicted or expired. Returns True (pinned)."""
        return self._call(_requests.pin(model, True), "pin_reply")

    def unpin(self, model):
        """Lets a pinned model be evicted again. Returns False (not pinned)."""
        return self._call(_requests.pin(model, False), "pin_reply")

    def register(self, model, path, engine=None):
        """Adds a model while the daemon runs (a RegisterResult). path is made absolute here;
        it must resolve to a file under one of the daemon's model roots. engine None: from the
        file's metadata, else dense."""
        return self._call(_requests.register(model, path, engine), "register_model_reply")

    def unregister(self, model):
        """Forgets a client-registered model once its work ends (a RegisterResult, removed)."""
        return self._call(_requests.unregister(model), "register_model_reply")

    def infer(self, model, data, deadline_ms=None, keep_alive=None):
        """Runs the model on data and returns its output, a float32 array (rows x out_features).

        data: one row (1-D) or rows x in_features (2-D), any real numeric dtype (converted to
            float32; see warmpool._tensors); bool, complex, strings and objects raise TypeError,
            other shapes ValueError.
        deadline_ms: give up after this many milliseconds (None: the daemon's default).
        keep_alive: as for load().
        """
        matrix = as_input_matrix(data)
        if self.region_threshold and matrix.nbytes >= self.region_threshold:
            return self._infer_through_region(model, matrix, deadline_ms, keep_alive)
        return self._call(_requests.infer(model, matrix, deadline_ms, keep_alive), "infer_reply")

    def generate(self, model, prompt=None, *, tokens=None, messages=None, stream=True, **options):
        """Text from a language model. ``prompt`` (str), ``tokens`` (ids) or ``messages`` (a
        conversation, [{"role": ..., "content": ...}], rendered by the model's chat template), one
        of them; options:
        max_tokens (0: until an end token or the end of the context), temperature, top_k, top_p,
        min_p, repetition_penalty, seed (each left out: the model's default), stop (a string or
        up to 16), deadline_ms, keep_alive, logprobs (each token's log-probability in its chunk, or
        the result when not streamed: TokenLogprob) and top_logprobs (the N most likely tokens' too,
        up to 20); with messages, tools (OpenAI's tool objects, for the chat template): the model's
        calls come as ToolCall in the chunks' or the result's ``tool_calls``, and the result's
        finish_reason is "tool_calls". A message may carry an assistant's ``tool_calls`` (ToolCall
        or OpenAI's dicts) or a tool's answer (``tool_call_id``, ``name``).

        With ``stream`` (the default) returns a Generation: iterate it for the chunks as they
        are generated; its ``result`` then holds the final GenerateResult. Without, waits and
        returns the GenerateResult, whose ``text`` holds all of it::

            for chunk in client.generate("tiny", "Once upon a time", max_tokens=32):
                print(chunk.text, end="", flush=True)
        """
        envelope = _generation.request(model, prompt, tokens, messages=messages, stream=stream, **options)
        if not stream:
            return _generation.result(self._exchange(envelope))
        return _generation.Generation(self, self.send(envelope))

    def embed(self, model, inputs, *, deadline_ms=None, keep_alive=None, dimensions=None):
        """Embeddings from a language model: ``inputs`` a string or a list of 1 to 256 of them;
        returns an EmbedResult (one unit-length vector per input, in order)::

            vectors = client.embed("tiny", ["free software", "a license"]).embeddings

        ``dimensions``: each vector's first values only, at unit length again (for a model trained
        for shorter embeddings, such as Qwen3-Embedding; None: all of them).
        """
        envelope = _generation.embed_request(model, inputs, deadline_ms=deadline_ms, keep_alive=keep_alive,
                                             dimensions=dimensions)
        return _generation.embed_result(self._exchange(envelope))

    def infer_tensors(self, model, inputs, *, deadline_ms=None, keep_alive=None):
        """Typed tensors in, typed tensors out (the model's engine names them), as numpy arrays::

            logits = client.infer_tensors("tiny", {"input_ids": np.array([1, 2, 3])})["logits"]

        What each value may be, and what comes back: the module warmpool._typed.
        """
        envelope = _typed.request(model, inputs, deadline_ms=deadline_ms, keep_alive=keep_alive)
        return _typed.outputs(_replies.body(self._exchange(envelope), "infer_reply"))

    def fault_arm(self, point, action, model=None, after=0, times=0):
        """Arms a fault in the workers (daemon started with --enable-fault-injection only;
        otherwise FailedPrecondition); returns the fault's id.

        point: e.g. "infer.mid"; action: kill | segv | abort | hang | exit:N | delay:MS;
        model: only while working for it (None: any); after: fire on the Nth matching hit in a
        worker (0 or 1: the first); times: disarm after firing this many times (0: 1).
        """
        return self._call(_requests.fault_arm(point, action, model, after, times),
                          "fault_arm_reply")

    def fault_clear(self):
        """Disarms every fault; returns how many were armed."""
        return self._call(_requests.fault_clear(), "fault_clear_reply")

    # ---- shared-memory region ----

    @property
    def region_bytes(self):
        """Size of the region infer() keeps for large inputs (0 before the first one)."""
        return self._region.size if self._region is not None else 0

    def _infer_through_region(self, model, matrix, deadline_ms, keep_alive):
        rows, cols = matrix.shape
        input_bytes = matrix.nbytes
        # The output goes right after the input: room for the largest output seen so far, or one
        # as large as the input (an output that does not fit comes in the reply, and the next
        # region is made large enough for it).
        output_offset = round_up(input_bytes, 4096)
        wanted = output_offset + max(input_bytes, self._largest_output)
        if self._region is None or self._region.size < wanted:
            self._replace_region(round_up(wanted, 1 << 20))
        region = self._region
        region.write_matrix(0, matrix)
        output_bytes = region.size - output_offset
        request = _requests.infer_in_region(model, rows, cols, region.id, 0, output_offset,
                                            output_bytes, deadline_ms, keep_alive)
        # Until its reply is in, the daemon's worker may still read the input and write the
        # output: _exchange resets the connection (and drops this region) if interrupted.
        reply = _replies.body(self._exchange(request), "infer_reply")
        if not reply.output_in_region:
            out = matrix_from_tensor(reply.output)
            self._largest_output = max(self._largest_output, out.nbytes)
            return out
        out_rows, out_cols = reply.output.rows, reply.output.cols
        if out_rows * out_cols * 4 > output_bytes:
            raise internal(
                f"the daemon says the output ({out_rows} x {out_cols}) is in a slice of "
                f"{output_bytes} bytes"
            )
        return region.read_matrix(output_offset, out_rows, out_cols)

    def _replace_region(self, size):
        if self._region is not None:
            old, self._region = self._region, None
            try:
                self._call(_requests.region_remove(old.id), "region_reply")
            finally:
                old.close()
        region = SharedRegion(size)
        try:
            reply = self._exchange(_requests.region(size), fds=[region.fd])
            region.id = _replies.expect(reply, "region_reply")
        except BaseException:
            region.close()
            raise
        self._region = region

    # ---- internals ----

    def _call(self, envelope, expected):
        return _replies.expect(self._exchange(envelope), expected)

    def _connection_reset(self):
        # The region goes with its connection: the daemon forgets it when the socket closes.
        region, self._region = self._region, None
        if region is not None:
            region.close()
