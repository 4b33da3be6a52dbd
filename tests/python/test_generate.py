"""Generations from the Python client: a language model directory (a tokenizer trained by
tokenizer_reference.py, a random checkpoint by warmpool-mkmodel) streamed chunk by chunk, whole,
stopped early, and refused with typed errors."""

import json
import os
import subprocess
import sys
import time

import pytest

import warmpool
from conftest import Daemon, binary
from scripted_model import write_tool_calling_model, write_scripted_model, TOOL_CALL, qwen_tools_template

HERE = os.path.dirname(os.path.abspath(__file__))


def write_language_model(directory, *extra):
    os.makedirs(directory)
    tokenizer = os.path.join(directory, "tokenizer.json")
    subprocess.run([sys.executable, os.path.join(HERE, "tokenizer_reference.py"), "train",
                    "/usr/share/common-licenses/GPL-3", "--merges", "300", "--style", "llama3",
                    "--out", tokenizer], check=True)
    with open(tokenizer) as f:
        t = json.load(f)
    vocab = max(list(t["model"]["vocab"].values()) + [a["id"] for a in t["added_tokens"]]) + 1
    subprocess.run([binary("warmpool-mkmodel"), directory, "--arch", "llama", "--vocab", str(vocab),
                    "--dtype", "bf16", *extra], check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|end|>"}, f)


@pytest.fixture(scope="module")
def lm_daemon(tmp_path_factory):
    d = Daemon(str(tmp_path_factory.mktemp("lm")))
    write_language_model(os.path.join(d.models_dir, "lm"))
    write_language_model(os.path.join(d.models_dir, "embedder"), "--base-model-only")
    write_tool_calling_model(os.path.join(d.models_dir, "tools"))
    # Named templates, as Hugging Face's: a plain "default" and Qwen2.5's as "tool_use".
    write_scripted_model(os.path.join(d.models_dir, "named"), TOOL_CALL,
                         [{"name": "default", "template": "{% for m in messages %}{{ m.content }}\n{% endfor %}"},
                          {"name": "tool_use", "template": qwen_tools_template()}],
                         added=("<tool_call>", "</tool_call>"))
    d.start()
    yield d
    d.check_stopped_cleanly()


def test_a_stream_comes_in_order_and_says_what_the_whole_reply_says(lm_daemon):
    with warmpool.Client(lm_daemon.socket) as client:
        generation = client.generate("lm", "This License", max_tokens=20, temperature=0)
        chunks = list(generation)
        assert [c.index for c in chunks] == list(range(len(chunks)))
        assert generation.result.finish_reason in ("length", "stop")
        assert generation.result.chunks == len(chunks)
        assert generation.result.completion_tokens == sum(len(c.tokens) for c in chunks)
        assert generation.text == "".join(c.text for c in chunks)
        whole = client.generate("lm", "This License", max_tokens=20, temperature=0, stream=False)
        assert isinstance(whole, warmpool.GenerateResult)
        assert whole.text == generation.text
        assert whole.tokens == [t for c in chunks for t in c.tokens]
        # The connection goes on serving after a stream.
        assert "lm" in [m.name for m in client.models()]


def test_a_stream_closed_early_is_cancelled_and_the_client_goes_on(lm_daemon):
    with warmpool.Client(lm_daemon.socket) as client:
        with client.generate("lm", "Everyone is permitted", temperature=0) as generation:
            first = next(generation)  # to the end of the context, unless closed
            assert first.index == 0
        # The reset connection made the daemon cancel it; the next call connects again.
        def inflight():
            return sum(e.inflight for e in client.ps() if e.name == "lm")

        deadline = time.monotonic() + 10
        while inflight() != 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert inflight() == 0
        assert client.generate("lm", "again", max_tokens=2, stream=False).completion_tokens <= 2


def test_bad_requests_raise_typed_errors(lm_daemon):
    with warmpool.Client(lm_daemon.socket) as client:
        with pytest.raises(warmpool.InvalidArgument, match="temperature"):
            client.generate("lm", "x", temperature=float("nan"), stream=False)
        with pytest.raises(warmpool.InvalidArgument, match="not both"):
            client.generate("lm", "x", tokens=[1])
        with pytest.raises(warmpool.InvalidArgument, match="stop strings"):
            list(client.generate("lm", "x", stop=["s"] * 17))
        with pytest.raises(warmpool.NotFound):
            client.generate("nope", "x", stream=False)
        assert client.generate("lm", "still serving", max_tokens=3, stream=False).completion_tokens <= 3


def test_the_asyncio_client_streams_too(lm_daemon):
    import asyncio

    async def run():
        async with await warmpool.AsyncClient.connect(lm_daemon.socket) as client:
            whole = await client.generate("lm", "You may convey", max_tokens=12, temperature=0, stream=False)
            generation = await client.generate("lm", "You may convey", max_tokens=12, temperature=0)
            # Other requests share the connection meanwhile.
            models, chunks = await asyncio.gather(client.models(), _collect(generation))
            assert "lm" in [m.name for m in models]
            assert [c.index for c in chunks] == list(range(len(chunks)))
            assert generation.text == whole.text
            assert generation.result.chunks == len(chunks)
            # Closed early: the connection is reset, and the next call connects again.
            async with await client.generate("lm", "Everyone is permitted", temperature=0) as early:
                assert (await early.__anext__()).index == 0
            assert (await client.generate("lm", "x", max_tokens=1, stream=False)).completion_tokens <= 1

    async def _collect(generation):
        return [c async for c in generation]

    asyncio.run(run())


def test_messages_go_through_the_models_chat_template(tmp_path_factory, lm_daemon):
    d = Daemon(str(tmp_path_factory.mktemp("chat")))
    directory = os.path.join(d.models_dir, "chat")
    write_language_model(directory)
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|end|>",
                   "chat_template": "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}{{ eos_token }}"
                                    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"}, f)
    d.start()
    try:
        with warmpool.Client(d.socket) as client:
            conversation = [{"role": "user", "content": "Hello"}]
            chat = client.generate("chat", messages=conversation, max_tokens=8, temperature=0, stream=False)
            assert chat.prompt_tokens > 3
            streamed = client.generate("chat", messages=conversation, max_tokens=8, temperature=0)
            assert "".join(c.text for c in streamed) == chat.text
            with pytest.raises(warmpool.InvalidArgument, match="one of them"):
                client.generate("chat", "x", messages=conversation)
    finally:
        d.check_stopped_cleanly()
    # A model without a chat template says so.
    with warmpool.Client(lm_daemon.socket) as client:
        with pytest.raises(warmpool.FailedPrecondition, match="chat template"):
            client.generate("lm", messages=[{"role": "user", "content": "y"}], stream=False)


def test_embeddings_come_one_per_input_at_unit_length_from_both_clients(lm_daemon):
    import asyncio
    import math

    with warmpool.Client(lm_daemon.socket) as client:
        both = client.embed("lm", ["free software", "the GNU General Public License"], keep_alive="1m")
        assert isinstance(both, warmpool.EmbedResult)
        assert len(both.embeddings) == 2 and both.dimensions == 64
        for vector in both.embeddings:
            assert len(vector) == 64
            assert math.isclose(sum(v * v for v in vector), 1.0, rel_tol=1e-5)
        assert both.prompt_tokens == sum(both.tokens)
        # Alone or beside another input: the same embedding, up to the order of a step's sums.
        single = client.embed("lm", "free software").embeddings[0]
        assert all(math.isclose(a, b, abs_tol=1e-5) for a, b in zip(single, both.embeddings[0]))
        # dimensions: the first values, at unit length again.
        shorter = client.embed("lm", "free software", dimensions=16)
        assert shorter.dimensions == 16 and len(shorter.embeddings[0]) == 16
        norm = math.sqrt(sum(v * v for v in single[:16]))
        for got, full in zip(shorter.embeddings[0], single[:16]):
            assert math.isclose(got, full / norm, rel_tol=1e-5, abs_tol=1e-7)
        with pytest.raises(warmpool.InvalidArgument, match="embeds in 64 values"):
            client.embed("lm", "x", dimensions=65)
        with pytest.raises(warmpool.InvalidArgument, match="dimensions"):
            client.embed("lm", "x", dimensions=0)
        with pytest.raises(warmpool.InvalidArgument, match="empty"):
            client.embed("lm", [""])
        with pytest.raises(warmpool.InvalidArgument, match="strings"):
            client.embed("lm", [1, 2])
        with pytest.raises(warmpool.NotFound):
            client.embed("nope", "x")

    async def run():
        async with await warmpool.AsyncClient.connect(lm_daemon.socket) as client:
            return await client.embed("lm", ["free software", "the GNU General Public License"])

    assert asyncio.run(run()).embeddings == both.embeddings  # the same request: the same bits


def test_a_model_that_embeds_only_says_so_and_refuses_a_generation(lm_daemon):
    with warmpool.Client(lm_daemon.socket) as client:
        models = {m.name: m for m in client.models()}
        assert models["embedder"].embeds_only and not models["lm"].embeds_only
        with pytest.raises(warmpool.FailedPrecondition, match="embeds only"):
            client.generate("embedder", "free software", max_tokens=4, stream=False)
        assert client.embed("embedder", "free software").dimensions == 64


def test_logprobs_come_with_each_token_streamed_or_whole(lm_daemon):
    with warmpool.Client(lm_daemon.socket) as client:
        generation = client.generate("lm", "You may convey", max_tokens=6, temperature=0, logprobs=True,
                                     top_logprobs=3)
        chunks = list(generation)
        for c in chunks:
            assert len(c.logprobs) == len(c.tokens)
            for token, l in zip(c.tokens, c.logprobs):
                assert isinstance(l, warmpool.TokenLogprob)
                assert l.token == token and l.logprob <= 0 and isinstance(l.piece, bytes)
                assert len(l.top) == 3 and l.top[0].token == token  # greedy: the most likely
                assert l.top[0].logprob >= l.top[1].logprob >= l.top[2].logprob
        whole = client.generate("lm", "You may convey", max_tokens=6, temperature=0, logprobs=True, stream=False)
        assert [l.token for l in whole.logprobs] == whole.tokens
        assert [l.logprob for l in whole.logprobs] == [l.logprob for c in chunks for l in c.logprobs]
        assert all(l.top == [] for l in whole.logprobs)
        with pytest.raises(warmpool.InvalidArgument, match="top_logprobs"):
            client.generate("lm", "x", top_logprobs=21, stream=False)
        assert client.generate("lm", "x", max_tokens=2, stream=False).logprobs == []


def test_a_language_models_logits_come_as_a_typed_tensor(lm_daemon):
    import numpy as np

    with warmpool.Client(lm_daemon.socket) as client:
        ids = np.array([1, 2, 3], dtype=np.int64)
        logits = client.infer_tensors("lm", {"input_ids": ids})["logits"]
        assert logits.dtype == np.float32 and logits.ndim == 1 and logits.size > 100
        # Greedy generation from those ids picks the largest of these logits first.
        first = client.generate("lm", tokens=ids.tolist(), max_tokens=1, temperature=0, stream=False)
        assert first.tokens[0] == int(np.argmax(logits))
        with pytest.raises(warmpool.InvalidArgument, match=r"input_ids\[0\]"):
            client.infer_tensors("lm", {"input_ids": np.array([-5], dtype=np.int64)})


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


def test_tools_come_back_as_tool_calls_streamed_or_whole(lm_daemon):
    # The "tools" model (tests/python/scripted_model.py) answers any chat with a Hermes call.
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    with warmpool.Client(lm_daemon.socket) as c:
        whole = c.generate("tools", messages=ask, tools=[WEATHER], stream=False)
        assert whole.finish_reason == "tool_calls"
        assert whole.text == ""
        assert [(t.name, t.arguments) for t in whole.tool_calls] == [("get_weather", {"city": "Paris"})]
        assert whole.tool_calls[0].id.startswith("call_")
        streamed = c.generate("tools", messages=ask, tools=[WEATHER])
        calls = [t for chunk in streamed for t in chunk.tool_calls]
        assert [(t.name, t.arguments) for t in calls] == [("get_weather", {"city": "Paris"})]
        assert streamed.text == "" and streamed.result.finish_reason == "tool_calls"
        # Carried on: the call (as the result gave it) and the tool's answer are in the prompt.
        again = c.generate("tools", messages=ask + [{"role": "assistant", "tool_calls": whole.tool_calls},
                                                    {"role": "tool", "tool_call_id": whole.tool_calls[0].id,
                                                     "content": "22 degrees"}],
                           tools=[WEATHER], stream=False)
        assert again.prompt_tokens > whole.prompt_tokens
        # A model whose template shows no format refuses tools; tools need a chat.
        with pytest.raises(warmpool.FailedPrecondition, match="takes no tools"):
            c.generate("lm", messages=ask, tools=[WEATHER], stream=False)
        with pytest.raises(warmpool.InvalidArgument):
            c.generate("tools", "a prompt", tools=[WEATHER], stream=False)


def test_the_cli_offers_tools_prints_the_calls_and_carries_the_chat_on(lm_daemon, tmp_path):
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([WEATHER]))
    cli = [binary("warmpool"), "--socket", lm_daemon.socket, "generate", "tools"]

    def run(*args, ok=True):
        r = subprocess.run(cli + list(args), capture_output=True, text=True, stdin=subprocess.DEVNULL)
        assert (r.returncode == 0) == ok, r.stderr
        return r

    # The prompt becomes the chat's user turn; each call is a line of its own after the text.
    for streamed in ([], ["--no-stream"]):
        lines = run("Weather in Paris?", "--tools", str(tools), *streamed).stdout.splitlines()
        calls = [line for line in lines if line.startswith("tool call ")]
        assert len(calls) == 1, lines
        head, _, arguments = calls[0].partition(": get_weather ")
        assert head.startswith("tool call call_") and json.loads(arguments) == {"city": "Paris"}, calls[0]
    # --json: the calls in the final reply; as printed there they carry the chat on, with the answer.
    final = json.loads(run("Weather in Paris?", "--tools", str(tools), "--json", "--no-stream").stdout.splitlines()[-1])
    assert final["finish_reason"] == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in final["tool_calls"]] == [("get_weather", {"city": "Paris"})]
    conversation = tmp_path / "chat.json"
    conversation.write_text(json.dumps([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": final["tool_calls"]},
        {"role": "tool", "tool_call_id": final["tool_calls"][0]["id"], "content": "22 degrees"}]))
    again = json.loads(run("--messages", str(conversation), "--tools", str(tools), "--json", "--no-stream")
                       .stdout.splitlines()[-1])
    assert again["prompt_tokens"] > final["prompt_tokens"] + 5
    # OpenAI's shape of a call goes in too.
    openai_shape = [{"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]
    conversation.write_text(json.dumps([{"role": "user", "content": "Weather in Paris?"},
                                        {"role": "assistant", "content": "", "tool_calls": openai_shape},
                                        {"role": "tool", "tool_call_id": "call_1", "content": "22 degrees"}]))
    assert json.loads(run("--messages", str(conversation), "--tools", str(tools), "--json", "--no-stream")
                      .stdout.splitlines()[-1])["prompt_tokens"] == again["prompt_tokens"]
    # Bad files: typed errors naming the file and what is wrong; the daemon never sees them.
    bad = tmp_path / "bad.json"
    for text, option, says in (("{not json", "--tools", "not JSON"), ('{"a": 1}', "--tools", "expected a JSON array"),
                               ("[1]", "--tools", "tool 0 is not an object"),
                               ('[{"content": "hi"}]', "--messages", 'message 0: needs a "role"'),
                               ('[{"role": "user", "content": 5}]', "--messages", '"content" must be a string'),
                               ('[{"role": "assistant", "tool_calls": [{"id": "c"}]}]', "--messages",
                                'needs a "name"'),
                               ("[]", "--messages", "no message")):
        bad.write_text(text)
        r = run(option, str(bad), ok=False)
        assert r.returncode == 2 and "INVALID_ARGUMENT" in r.stderr and str(bad) in r.stderr and says in r.stderr, \
            (text, r.stderr)
    r = run("a prompt", "--messages", str(conversation), ok=False)
    assert "not both" in r.stderr
    assert "cannot be read" in run("x", "--tools", str(tmp_path / "missing.json"), ok=False).stderr


def test_a_named_tool_use_template_renders_chats_that_offer_tools(lm_daemon):
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    with warmpool.Client(lm_daemon.socket) as c:
        info = {m.name: m for m in c.models()}
        assert info["named"].tool_call_format == "hermes"  # read off the tool_use template
        plain = c.generate("named", messages=ask, max_tokens=1, stream=False)
        offered = c.generate("named", messages=ask, tools=[WEATHER], stream=False)
        # The default template renders the message alone; the tool one, Qwen's system prompt with the tools.
        assert offered.prompt_tokens > plain.prompt_tokens + 50
        assert [(t.name, t.arguments) for t in offered.tool_calls] == [("get_weather", {"city": "Paris"})]
