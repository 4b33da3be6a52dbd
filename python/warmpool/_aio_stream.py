"""Streamed generations on the asyncio client: the chunks of a request queue up where its reply
future would wait (in the connection's table of requests awaiting replies) until the final reply.

Stopping before the end (``aclose()``, leaving ``async with``, breaking out of ``async for``)
resets the connection, as an interruption does: the daemon then cancels the generation on its
worker within a step, requests in flight on the same connection raise Unavailable, and the next
call connects again.
"""

import asyncio

from . import _generation
from ._errors import unavailable


class StreamSink:
    """A generation's entry in _Connection.waiting: answers to what the reader and _drop ask of a
    reply future (done, set_result, set_exception, cancel), and queues chunks besides."""

    def __init__(self):
        self._queue = asyncio.Queue()
        self._done = False

    def done(self):
        return self._done

    def put_chunk(self, envelope):
        self._queue.put_nowait(envelope)

    def set_result(self, envelope):
        self._done = True
        self._queue.put_nowait(envelope)

    def set_exception(self, error):
        self._done = True
        self._queue.put_nowait(error)

    def cancel(self):
        self._done = True

    async def get(self):
        item = await self._queue.get()
        if isinstance(item, BaseException):
            raise item
        return item


class AsyncGeneration:
    """``async for chunk in generation``: the chunks (GenerateChunk) as they come; then
    ``result`` holds the final GenerateResult and ``text`` all the chunks' text. An error reply
    raises from the iteration."""

    def __init__(self, client, conn, sink):
        self._client = client
        self._conn = conn
        self._sink = sink
        self.text = ""
        self.result = None
        self._ended = False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self._ended:
            raise StopAsyncIteration
        try:
            envelope = await self._sink.get()
        except BaseException:
            self._ended = True
            raise
        if envelope.HasField("generate_chunk"):
            chunk = _generation.chunk(envelope.generate_chunk)
            self.text += chunk.text
            return chunk
        self._ended = True
        self.result = _generation.result(envelope)
        raise StopAsyncIteration

    async def aclose(self):
        """Stops reading; before the end, the connection is reset (the daemon cancels it)."""
        if not self._ended:
            self._ended = True
            self._client._drop(self._conn, unavailable(
                "the connection to warmpoold was reset: a generation was closed before its end; "
                "the next call connects again"))

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc_info):
        await self.aclose()


async def open_stream(client, envelope):
    """Sends a streamed generation on the client's connection; returns its AsyncGeneration once
    the request is out. It holds one of the client's max_in_flight slots until its final reply."""
    sink = StreamSink()
    conn = await client._send(envelope, sink)
    return AsyncGeneration(client, conn, sink)
