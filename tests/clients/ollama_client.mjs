// The official `ollama` JavaScript library against warmpoold's Ollama endpoints, unchanged: only
// its host points at warmpool. Run by tests/python/test_official_clients.py with what the framed
// protocol answered for the same greedy requests (WARMPOOL_EXPECT).
import assert from "node:assert/strict";
import { Ollama } from "ollama";

const expect = JSON.parse(process.env.WARMPOOL_EXPECT);
// The daemon asks every TCP request for an API key ([http] api_keys_file): sent as a header, as
// any Ollama client behind an authenticating proxy does.
const ollama = new Ollama({ host: process.env.WARMPOOL_OLLAMA_HOST,
  headers: { Authorization: `Bearer ${process.env.WARMPOOL_API_KEY}` } });
// Loading and unloading (an empty prompt) administer the pool: over TCP they need the admin token.
const admin = new Ollama({
  host: process.env.WARMPOOL_OLLAMA_HOST,
  headers: { Authorization: `Bearer ${process.env.WARMPOOL_ADMIN_TOKEN}` },
});
const greedy = { temperature: 0 };

const version = await ollama.version();
assert.equal(typeof version.version, "string");
const tags = await ollama.list();
assert.ok(tags.models.some((m) => m.name === "lm"), "lm among the models");
const shown = await ollama.show({ model: "lm" });
assert.ok(shown.capabilities.includes("completion"));

// An empty prompt loads the model (kept 10 minutes); ps shows it.
await assert.rejects(ollama.generate({ model: "lm", prompt: "" }), (e) => e.status_code === 403 && /token/.test(e.message));
const loaded = await admin.generate({ model: "lm", prompt: "", keep_alive: "10m" });
assert.equal(loaded.done_reason, "load");
assert.ok((await ollama.ps()).models.some((m) => m.name === "lm"), "lm loaded");

const generated = await ollama.generate({ model: "lm", prompt: expect.prompt, stream: false, options: { ...greedy, num_predict: 10 } });
assert.equal(generated.response, expect.completion);
assert.equal(generated.done, true);
assert.equal(generated.eval_count > 0, true);

let streamed = "";
let last = null;
for await (const part of await ollama.chat({
  model: "lm",
  messages: [{ role: "user", content: expect.question }],
  stream: true,
  options: { ...greedy, num_predict: 12 },
})) {
  streamed += part.message.content;
  last = part;
}
assert.equal(streamed, expect.chat);
assert.equal(last.done, true);
assert.ok(["stop", "length"].includes(last.done_reason));

const whole = await ollama.chat({ model: "lm", messages: [{ role: "user", content: expect.question }], stream: false, options: { ...greedy, num_predict: 12 } });
assert.equal(whole.message.content, expect.chat);

const embedded = await ollama.embed({ model: "lm", input: [expect.prompt] });
assert.deepEqual(embedded.embeddings[0], expect.embedding);
const shorter = await ollama.embed({ model: "lm", input: [expect.prompt], dimensions: 8 });
assert.deepEqual(shorter.embeddings[0], expect.shorter);

await assert.rejects(ollama.generate({ model: "nope", prompt: "x", stream: false }), (e) => e.status_code === 404);
await assert.rejects(ollama.pull({ model: "llama3", stream: false }), (e) => /register/.test(e.message));

// A tool call (the "tools" model: Qwen2.5's template, a scripted answer), whole and streamed, and
// the conversation carried on with the tool's answer.
const tools = [{ type: "function", function: { name: "get_weather", description: "The weather in a city",
  parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } }];
const ask = { model: "tools", messages: [{ role: "user", content: "Weather in Paris?" }], tools, stream: false };
const called = await ollama.chat(ask);
assert.equal(called.message.tool_calls.length, 1);
assert.equal(called.message.tool_calls[0].function.name, "get_weather");
assert.deepEqual(called.message.tool_calls[0].function.arguments, { city: "Paris" });
assert.equal(called.message.content, "");
const calls = [];
for await (const part of await ollama.chat({ ...ask, stream: true })) calls.push(...(part.message.tool_calls ?? []));
assert.deepEqual(calls.map((c) => c.function), [{ name: "get_weather", arguments: { city: "Paris" } }]);
const answered = await ollama.chat({ ...ask, messages: [...ask.messages, called.message,
  { role: "tool", tool_name: "get_weather", content: "22 degrees, sunny" }] });
assert.ok(answered.prompt_eval_count > called.prompt_eval_count, "the call and its answer are in the prompt");

// keep_alive 0 with an empty prompt unloads it.
const unloaded = await admin.generate({ model: "lm", prompt: "", keep_alive: 0 });
assert.equal(unloaded.done_reason, "unload");
console.log("ollama client: ok");
