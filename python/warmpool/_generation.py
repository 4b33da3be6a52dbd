"""Generations: the request, and a streamed one read chunk by chunk on the blocking connection.

A streamed generation answers with chunks (same request_id) and then one final reply. Stopping
before the end (``close()``, leaving a ``with`` block, an exception in the loop) resets the
connection: that is how the daemon learns nobody reads any more, and it cancels the generation
on its worker within a step. The next call connects again.
"""

import json
import operator

from . import results
from ._errors import invalid_argument
from ._proto import pb
from ._replies import raise_if_error
from ._requests import keep_alive_ms


def _optional(request, name, value, kind):
    if value is None:
        return
    try:
        setattr(request, name, kind(value))
    except (TypeError, ValueError) as error:
        raise invalid_argument(f"{name} {value!r}: {error}") from None


def request(model, prompt=None, tokens=None, *, messages=None, max_tokens=0, temperature=None, top_k=None, top_p=None,
            min_p=None, repetition_penalty=None, seed=None, stop=(), stream=True, deadline_ms=None,
            keep_alive=None, logprobs=False, top_logprobs=0, tools=None):
    """The generate Envelope; the daemon checks the values' ranges (typed errors)."""
    if (prompt is not None) + (tokens is not None) + (messages is not None) != 1:
        raise invalid_argument("generate needs a prompt, token ids or messages (one of them, not both)")
    envelope = pb.Envelope()
    g = envelope.generate
    g.model = model
    if prompt is not None:
        g.prompt = prompt
    elif tokens is not None:
        g.tokens.extend(int(t) for t in tokens)
    else:
        for m in messages:
            _message(g.messages.add(), m)
    if tools:
        if messages is None:
            raise invalid_argument("tools are offered in a chat: pass messages")
        try:
            g.tools.extend(json.dumps(t) for t in tools)
        except (TypeError, ValueError) as error:
            raise invalid_argument(f"tools must be JSON objects: {error}") from None
    g.max_tokens = int(max_tokens)
    _optional(g, "temperature", temperature, float)
    _optional(g, "top_k", top_k, int)
    _optional(g, "top_p", top_p, float)
    _optional(g, "min_p", min_p, float)
    _optional(g, "repetition_penalty", repetition_penalty, float)
    _optional(g, "seed", seed, int)
    if isinstance(stop, str):
        stop = [stop]
    g.stop.extend(stop)
    g.stream = bool(stream)
    g.deadline_ms = 0 if deadline_ms is None else int(deadline_ms)
    ms = keep_alive_ms(keep_alive)
    if ms is not None:
        g.keep_alive_ms = ms
    g.logprobs = bool(logprobs) or bool(top_logprobs)
    _optional(g, "top_logprobs", top_logprobs, int)
    return envelope


def _message(out, m):
    """A chat message: role, content, and (carrying a conversation on) an assistant's tool_calls
    (ToolCall or OpenAI's {"id", "function": {"name", "arguments"}}) or a tool's answer."""
    try:
        out.role = m["role"]
        out.content = m.get("content") or ""
        for c in m.get("tool_calls") or ():
            if isinstance(c, results.ToolCall):
                out.tool_calls.add(id=c.id, name=c.name, arguments=json.dumps(c.arguments))
                continue
            f = c["function"]
            arguments = f.get("arguments", {})
            out.tool_calls.add(id=c.get("id", ""), name=f["name"],
                               arguments=arguments if isinstance(arguments, str) else json.dumps(arguments))
        out.tool_call_id = m.get("tool_call_id") or ""
        out.name = m.get("name") or ""
    except (KeyError, TypeError, AttributeError) as error:
        raise invalid_argument(f"message {m!r}: {error}") from None


def _tool_calls(calls):
    return [results.ToolCall(id=c.id, name=c.name, arguments=json.loads(c.arguments)) for c in calls]


def _logprobs(entries):
    def one(l, top=()):
        return results.TokenLogprob(token=l.token, logprob=l.logprob, piece=bytes(l.piece),
                                    top=[one(t) for t in top])
    return [one(e.chosen, e.top) for e in entries]


def embed_request(model, inputs, *, deadline_ms=None, keep_alive=None, dimensions=None):
    """The embed Envelope: ``inputs`` a string or a list of them; ``dimensions`` each embedding's
    first values, at unit length again (None: all)."""
    if isinstance(inputs, str):
        inputs = [inputs]
    envelope = pb.Envelope()
    e = envelope.embed
    e.model = model
    try:
        e.input.extend(inputs)
    except TypeError as error:
        raise invalid_argument(f"inputs to embed must be strings: {error}") from None
    e.deadline_ms = 0 if deadline_ms is None else int(deadline_ms)
    if dimensions is not None:
        try:
            n = None if isinstance(dimensions, bool) else operator.index(dimensions)  # numpy's integers too
        except TypeError:
            n = None
        if n is None or not 1 <= n < 2**32:
            raise invalid_argument(f"dimensions must be a whole number of at least 1, not {dimensions!r}")
        e.dimensions = n
    ms = keep_alive_ms(keep_alive)
    if ms is not None:
        e.keep_alive_ms = ms
    return envelope


def embed_result(envelope):
    """The reply as an EmbedResult (an error reply raises)."""
    raise_if_error(envelope)
    r = envelope.embed_reply
    return results.EmbedResult(
        embeddings=[list(e.values) for e in r.embeddings], dimensions=r.dimensions, prompt_tokens=r.prompt_tokens,
        tokens=[e.tokens for e in r.embeddings], embed_us=r.embed_us,
    )


def chunk(c):
    return results.GenerateChunk(index=c.index, text=c.text, tokens=list(c.tokens), logprobs=_logprobs(c.logprobs),
                                 tool_calls=_tool_calls(c.tool_calls))


def result(envelope):
    """The final reply as a GenerateResult (an error reply raises)."""
    raise_if_error(envelope)
    r = envelope.generate_reply
    return results.GenerateResult(
        finish_reason=r.finish_reason, prompt_tokens=r.prompt_tokens, completion_tokens=r.completion_tokens,
        first_token_us=r.first_token_us, generate_us=r.generate_us, chunks=r.chunks, text=r.text,
        tokens=list(r.tokens), logprobs=_logprobs(r.logprobs), tool_calls=_tool_calls(r.tool_calls),
        cached_prompt_tokens=r.cached_prompt_tokens,
    )


class Generation:
    """A streamed generation: iterate for its chunks (GenerateChunk) as they come; the iteration
    ends with the final reply, then in ``result`` (GenerateResult). ``text`` gathers the chunks'
    text. An error reply (after chunks too: a deadline, or a worker that died mid-stream under a
    generation that cannot resume) raises from the iteration."""

    def __init__(self, connection, request_id):
        self._connection = connection
        self._request_id = request_id
        self.text = ""
        self.result = None
        self._ended = False

    def __iter__(self):
        return self

    def __next__(self):
        if self._ended:
            raise StopIteration
        try:
            envelope = self._connection.wait_envelope(self._request_id)
        except BaseException:
            self._ended = True
            raise
        if envelope.HasField("generate_chunk"):
            c = chunk(envelope.generate_chunk)
            self.text += c.text
            return c
        self._ended = True
        self.result = result(envelope)
        raise StopIteration

    def close(self):
        """Stops reading. Before the end, the connection is reset: the daemon cancels the
        generation and the next call connects again."""
        if not self._ended:
            self._ended = True
            self._connection._reset("a generation was closed before its end")

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()
