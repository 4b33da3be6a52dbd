// The official `openai` JavaScript library against warmpoold's OpenAI-compatible endpoints,
// unchanged: only its baseURL points at warmpool. Run by tests/python/test_official_clients.py,
// which starts the daemon and passes what the framed protocol answered for the same greedy
// requests (WARMPOOL_EXPECT); every answer here must say the same, token for token.
import assert from "node:assert/strict";
import OpenAI from "openai";

const expect = JSON.parse(process.env.WARMPOOL_EXPECT);
const client = new OpenAI({ baseURL: process.env.WARMPOOL_OPENAI_URL, apiKey: process.env.WARMPOOL_API_KEY, maxRetries: 0 });
const chat = { model: "lm", messages: [{ role: "user", content: expect.question }], max_tokens: 12, temperature: 0 };

// Without the key: OpenAI's authentication error.
const stranger = new OpenAI({ baseURL: process.env.WARMPOOL_OPENAI_URL, apiKey: "not-a-key-of-this-daemon", maxRetries: 0 });
await assert.rejects(stranger.models.list(), (e) => e.status === 401);

const models = await client.models.list();
assert.ok(models.data.some((m) => m.id === "lm" && m.object === "model"), "lm in the model list");

const whole = await client.chat.completions.create(chat);
assert.equal(whole.choices[0].message.content, expect.chat);
assert.equal(whole.usage.total_tokens, whole.usage.prompt_tokens + whole.usage.completion_tokens);

let streamed = "";
let usage = null;
for await (const chunk of await client.chat.completions.create({ ...chat, stream: true, stream_options: { include_usage: true } })) {
  if (chunk.choices.length > 0) streamed += chunk.choices[0].delta.content ?? "";
  if (chunk.usage) usage = chunk.usage;
}
assert.equal(streamed, expect.chat);
assert.deepEqual(usage, whole.usage);

const completion = await client.completions.create({ model: "lm", prompt: expect.prompt, max_tokens: 10, temperature: 0 });
assert.equal(completion.choices[0].text, expect.completion);

// The library asks for base64 and decodes it: the vector must be the framed protocol's.
const embedded = await client.embeddings.create({ model: "lm", input: [expect.prompt] });
assert.equal(embedded.data[0].embedding.length, expect.embedding.length);
embedded.data[0].embedding.forEach((v, i) => assert.equal(v, expect.embedding[i], `embedding[${i}]`));
// dimensions: the first values at unit length again, as the Python client's.
const shorter = await client.embeddings.create({ model: "lm", input: [expect.prompt], dimensions: 8 });
assert.deepEqual(shorter.data[0].embedding, expect.shorter);

const logprobs = await client.chat.completions.create({ ...chat, max_tokens: 3, logprobs: true, top_logprobs: 2 });
assert.equal(logprobs.choices[0].logprobs.content.length, logprobs.usage.completion_tokens);
assert.equal(logprobs.choices[0].logprobs.content[0].top_logprobs.length, 2);

await assert.rejects(client.chat.completions.create({ ...chat, model: "nope" }), (e) => {
  assert.equal(e.status, 404);
  assert.equal(e.code, "model_not_found");
  return true;
});
await assert.rejects(client.chat.completions.create({ ...chat, n: 2 }), (e) => e.status === 400);

// Cancellation: a stream aborted after its first chunk (the library stops reading and closes the
// connection; with a model this small the rest may already be buffered, so both endings are
// fine); the model serves the next request. That the daemon stops the generation within a step
// when its client leaves is tested at the daemon's level (GenerateTest.AClientThatLeaves...).
const controller = new AbortController();
const long = await client.chat.completions.create({ ...chat, max_tokens: 200, stream: true }, { signal: controller.signal });
let seen = 0;
try {
  for await (const chunk of long) {
    seen++;
    controller.abort();
  }
} catch (e) {
  assert.ok(e.name === "APIUserAbortError" || e.name === "AbortError", `aborted: ${e.name}`);
}
assert.ok(seen >= 1, "a chunk before the abort");
const after = await client.chat.completions.create(chat);
assert.equal(after.choices[0].message.content, expect.chat);

// A tool call: the "tools" model (Qwen2.5's template, a scripted answer) calls get_weather. Whole,
// streamed (the library gathers the deltas), and a conversation carried on with the call and the
// tool's answer, which the template renders.
const tools = [{ type: "function", function: { name: "get_weather", description: "The weather in a city",
  parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } }];
const ask = { model: "tools", messages: [{ role: "user", content: "Weather in Paris?" }], tools };
const called = await client.chat.completions.create(ask);
assert.equal(called.choices[0].finish_reason, "tool_calls");
assert.equal(called.choices[0].message.content, null);
const [call] = called.choices[0].message.tool_calls;
assert.equal(call.type, "function");
assert.equal(call.function.name, "get_weather");
assert.deepEqual(JSON.parse(call.function.arguments), { city: "Paris" });
assert.match(call.id, /^call_/);

const gathered = [];
let finish = null;
for await (const chunk of await client.chat.completions.create({ ...ask, stream: true })) {
  const choice = chunk.choices[0];
  for (const delta of choice.delta.tool_calls ?? []) {
    gathered[delta.index] ??= { name: "", arguments: "" };
    gathered[delta.index].name += delta.function?.name ?? "";
    gathered[delta.index].arguments += delta.function?.arguments ?? "";
  }
  assert.ok(!choice.delta.content, "no text besides the call");
  finish = choice.finish_reason ?? finish;
}
assert.equal(finish, "tool_calls");
assert.equal(gathered.length, 1);
assert.equal(gathered[0].name, "get_weather");
assert.deepEqual(JSON.parse(gathered[0].arguments), { city: "Paris" });

const answered = await client.chat.completions.create({
  ...ask,
  messages: [...ask.messages, called.choices[0].message, { role: "tool", tool_call_id: call.id, content: "22 degrees, sunny" }],
});
assert.ok(answered.usage.prompt_tokens > called.usage.prompt_tokens, "the call and its answer are in the prompt");
const offered = await client.chat.completions.create({ ...ask, tool_choice: "none" });
assert.ok(offered.usage.prompt_tokens < called.usage.prompt_tokens, "tool_choice none: the tools are not shown");
await assert.rejects(client.chat.completions.create({ ...ask, tool_choice: "required" }), (e) => e.status === 400);
await assert.rejects(client.chat.completions.create({ ...chat, tools }), (e) => {
  assert.equal(e.status, 409);  // the demo model's template shows no tool-call format
  return true;
});
console.log("openai client: ok");
