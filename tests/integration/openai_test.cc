// The OpenAI-compatible endpoints against a real daemon serving the demo model, over raw HTTP on
// the client socket: what any OpenAI client sees. The same generation through the framed protocol
// is the reference (greedy: token-identical); streams are server-sent events that end in
// `data: [DONE]`; errors are OpenAI's error object. tests/clients/ drives the official `openai`
// library against the same endpoints.
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <thread>

#include <google/protobuf/stubs/strutil.h>
#include <nlohmann/json.hpp>

#include "tests/integration/daemon_fixture.h"
#include "tests/integration/http_exchange.h"
#include "tests/text.h"
#include "tests/unit/tiny_model.h"

namespace warmpool::testing {
namespace {

using nlohmann::json;

class OpenAiTest : public DaemonTest {
 protected:
  void StartWithDemoModel() {
    std::filesystem::copy(DemoModelDirectory(), models_dir_ + "/lm", std::filesystem::copy_options::recursive);
    StartDaemon();
  }
  Response Post(const std::string& path, const json& body) {
    std::vector<Response> r = Split(Exchange(ConnectUnix(socket_), HttpPost(path, body.dump(), true)));
    EXPECT_EQ(r.size(), 1u);
    return r.empty() ? Response{} : r[0];
  }
  // The data of each server-sent event, in order.
  static std::vector<std::string> Events(const std::string& body) {
    std::vector<std::string> out;
    for (size_t at = 0; (at = body.find("data: ", at)) != std::string::npos;) {
      const size_t end = body.find("\n\n", at);
      out.push_back(body.substr(at + 6, end - at - 6));
      at = end;
    }
    return out;
  }
  std::string FramedText(const std::string& prompt, bool chat, uint32_t max_tokens) {
    auto c = Connect();
    v1::GenerateRequest r;
    r.set_model("lm");
    if (chat) {
      v1::ChatMessage* m = r.add_messages();
      m->set_role("user");
      m->set_content(prompt);
    } else {
      r.set_prompt(prompt);
    }
    r.set_max_tokens(max_tokens);
    r.set_temperature(0);
    auto reply = c->Generate(std::move(r));
    EXPECT_TRUE(reply.ok()) << reply.status().ToString();
    return reply.ok() ? reply->text() : "";
  }
};

TEST_F(OpenAiTest, ChatAndCompletionsWholeAndStreamedSayWhatTheFramedProtocolSays) {
  StartWithDemoModel();
  const json chat = {{"model", "lm"},
                     {"messages", json::array({{{"role", "user"}, {"content", "What may I do with the program?"}}})},
                     {"max_tokens", 12},
                     {"temperature", 0}};
  Response whole = Post("/v1/chat/completions", chat);
  ASSERT_EQ(whole.status, 200) << whole.body;
  const json doc = json::parse(whole.body);
  EXPECT_EQ(doc["object"], "chat.completion");
  EXPECT_EQ(doc["model"], "lm");
  EXPECT_EQ(doc["choices"][0]["message"]["role"], "assistant");
  const std::string text = doc["choices"][0]["message"]["content"];
  EXPECT_FALSE(text.empty());
  EXPECT_EQ(text, FramedText("What may I do with the program?", true, 12));
  EXPECT_EQ(doc["usage"]["total_tokens"], doc["usage"]["prompt_tokens"].get<int>() + doc["usage"]["completion_tokens"].get<int>());
  EXPECT_EQ(doc["usage"]["prompt_tokens_details"]["cached_tokens"], 0) << "a short prompt: no whole block to find";

  json streamed = chat;
  streamed["stream"] = true;
  streamed["stream_options"] = {{"include_usage", true}};
  Response events = Post("/v1/chat/completions", streamed);
  ASSERT_EQ(events.status, 200) << events.body;
  EXPECT_TRUE(Contains(events.headers, "Content-Type: text/event-stream")) << events.headers;
  std::vector<std::string> data = Events(events.body);
  ASSERT_GE(data.size(), 4u) << events.body;
  EXPECT_EQ(data.back(), "[DONE]");
  const json usage = json::parse(data[data.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"], doc["usage"]);
  const json last = json::parse(data[data.size() - 3]);
  EXPECT_EQ(last["choices"][0]["finish_reason"], doc["choices"][0]["finish_reason"]);
  std::string joined;
  for (size_t i = 0; i + 3 < data.size(); i++) {
    const json chunk = json::parse(data[i]);
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
    EXPECT_EQ(chunk["id"], last["id"]) << "one id for the whole stream";
    if (i == 0) {
      EXPECT_EQ(chunk["choices"][0]["delta"]["role"], "assistant");
    }
    joined += chunk["choices"][0]["delta"]["content"].get<std::string>();
  }
  EXPECT_EQ(joined, text);

  const json completion = {{"model", "lm"}, {"prompt", "This License"}, {"max_tokens", 10}, {"temperature", 0}};
  Response plain = Post("/v1/completions", completion);
  ASSERT_EQ(plain.status, 200) << plain.body;
  EXPECT_EQ(json::parse(plain.body)["choices"][0]["text"], FramedText("This License", false, 10));
  json streamed_completion = completion;
  streamed_completion["stream"] = true;
  std::string pieces;
  std::vector<std::string> completion_events = Events(Post("/v1/completions", streamed_completion).body);
  ASSERT_FALSE(completion_events.empty());
  for (const std::string& e : completion_events) {
    if (e != "[DONE]") pieces += json::parse(e)["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(pieces, json::parse(plain.body)["choices"][0]["text"]);
  ExpectQuiescentAndValid();
}

TEST_F(OpenAiTest, AnAliasReachesItsModelThroughEveryApi) {
  // A client configured for another server's model name reaches a local model ([[models]] aliases).
  std::filesystem::copy(DemoModelDirectory(), dir_ + "/license", std::filesystem::copy_options::recursive);
  StartDaemon("[[models]]\nname = \"lm\"\npath = \"" + dir_ + "/license\"\naliases = [\"gpt-4o-mini\", \"llama3\"]\n");
  const std::string expected = FramedText("What may I do?", true, 6);
  const json chat = {{"messages", {{{"role", "user"}, {"content", "What may I do?"}}}}, {"max_tokens", 6}, {"temperature", 0}};
  auto with = [&](json extra) {
    json body = chat;
    body.update(extra);
    return body;
  };
  Response openai = Post("/v1/chat/completions", with({{"model", "gpt-4o-mini"}}));
  ASSERT_EQ(openai.status, 200) << openai.body;
  EXPECT_EQ(json::parse(openai.body)["choices"][0]["message"]["content"], expected);
  const json ollama_chat = {{"model", "llama3"}, {"messages", chat["messages"]}, {"stream", false},
                            {"options", {{"num_predict", 6}, {"temperature", 0}}}};
  Response ollama = Post("/api/chat", ollama_chat);
  ASSERT_EQ(ollama.status, 200) << ollama.body;
  EXPECT_EQ(json::parse(ollama.body)["message"]["content"], expected);
  EXPECT_EQ(Post("/v1/chat/completions", with({{"model", "gpt-4o"}})).status, 404);
}

TEST_F(OpenAiTest, EmbeddingsAsFloatsAndAsBase64AndTheModelList) {
  StartWithDemoModel();
  Response floats = Post("/v1/embeddings", {{"model", "lm"}, {"input", json::array({"free software", "a license"})}});
  ASSERT_EQ(floats.status, 200) << floats.body;
  const json doc = json::parse(floats.body);
  ASSERT_EQ(doc["data"].size(), 2u);
  EXPECT_EQ(doc["data"][1]["index"], 1);
  const std::vector<float> first = doc["data"][0]["embedding"];
  // The same request in each form: the same bits (an input grouped with others may differ in its
  // last bits from the same input alone: engines/transformer/embedding.h, EmbedGroup).
  Response base64 = Post("/v1/embeddings", {{"model", "lm"}, {"input", json::array({"free software", "a license"})},
                                            {"encoding_format", "base64"}});
  ASSERT_EQ(base64.status, 200) << base64.body;
  std::string bytes;
  ASSERT_TRUE(google::protobuf::Base64Unescape(json::parse(base64.body)["data"][0]["embedding"].get<std::string>(), &bytes));
  ASSERT_EQ(bytes.size(), first.size() * sizeof(float));
  std::vector<float> decoded(first.size());
  std::memcpy(decoded.data(), bytes.data(), bytes.size());
  EXPECT_EQ(decoded, first);
  Response single = Post("/v1/embeddings", {{"model", "lm"}, {"input", "free software"}});
  ASSERT_EQ(single.status, 200) << single.body;
  const std::vector<float> alone = json::parse(single.body)["data"][0]["embedding"];
  // dimensions: the first values at unit length again, from OpenAI's endpoint and Ollama's alike.
  Response shorter = Post("/v1/embeddings", {{"model", "lm"}, {"input", "free software"}, {"dimensions", 16}});
  ASSERT_EQ(shorter.status, 200) << shorter.body;
  const std::vector<float> prefix = json::parse(shorter.body)["data"][0]["embedding"];
  ASSERT_EQ(prefix.size(), 16u);
  double squares = 0;
  for (size_t i = 0; i < 16; i++) squares += double{alone[i]} * alone[i];
  for (size_t i = 0; i < 16; i++) EXPECT_NEAR(prefix[i], alone[i] / std::sqrt(squares), 1e-6) << i;
  Response ollama = Post("/api/embed", {{"model", "lm"}, {"input", "free software"}, {"dimensions", 16}});
  ASSERT_EQ(ollama.status, 200) << ollama.body;
  EXPECT_EQ(json::parse(ollama.body)["embeddings"][0].get<std::vector<float>>(), prefix);
  // Ollama's reading: 0, or the size or more, leave the vectors whole; its older endpoint has none.
  for (int whole : {0, 128, 4096}) {
    Response r = Post("/api/embed", {{"model", "lm"}, {"input", "free software"}, {"dimensions", whole}});
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["embeddings"][0].get<std::vector<float>>(), alone) << whole;
  }
  EXPECT_EQ(Post("/api/embeddings", {{"model", "lm"}, {"prompt", "free software"}, {"dimensions", 16}}).status, 400);
  std::vector<Response> list = Split(Exchange(ConnectUnix(socket_), HttpGet("/v1/models", true)));
  ASSERT_EQ(list.size(), 1u);
  const json models = json::parse(list[0].body);
  EXPECT_EQ(models["object"], "list");
  EXPECT_EQ(models["data"][0]["id"], "lm");
  EXPECT_EQ(models["data"][0]["object"], "model");
}

TEST_F(OpenAiTest, ErrorsComeAsOpenAisErrorObjectWithTheirStatus) {
  StartWithDemoModel();
  struct Bad {
    std::string path;
    std::string body;
    int status;
    std::string says;
  };
  const std::vector<Bad> bad = {
      {"/v1/chat/completions", R"({"model": "nope", "messages": [{"role": "user", "content": "x"}]})", 404, "not registered"},
      {"/v1/chat/completions", R"({"model": "lm", "messages": [{"role": "user", "content": "x"}], "n": 2})", 400, "\"n\""},
      {"/v1/chat/completions", R"({"model": "lm", "messages": []})", 400, "messages"},
      {"/v1/chat/completions", R"({"model": "lm", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
       400, "text only"},
      {"/v1/chat/completions",
       R"({"model": "lm", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}]})",
       409, "takes no tools"},
      {"/v1/chat/completions", R"({"model": "lm", "messages": [{"role": "user", "content": "x"}], "tools": [{"name": "f"}]})",
       400, "each tool"},
      {"/v1/chat/completions",
       R"({"model": "lm", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"})",
       400, "tool_choice"},
      {"/v1/chat/completions",
       R"({"model": "lm", "messages": [{"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]})",
       400, "arguments"},
      // Arguments nested deeper than any body may be (they would overflow a stack written out).
      {"/v1/chat/completions",
       R"({"model": "lm", "messages": [{"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": ")" +
           std::string(100000, '[') + std::string(100000, ']') + R"("}}]}]})",
       400, "nests deeper"},
      {"/v1/chat/completions", R"({"model": "lm", "messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})",
       400, "tool_choice"},
      {"/v1/chat/completions", R"({"model": "lm", "messages": [{"role": "user", "content": "x"}], "parallel_tool_calls": false})",
       400, "parallel_tool_calls"},
      {"/v1/chat/completions", "{not json", 400, "JSON"},
      {"/v1/completions", R"({"model": "lm", "prompt": ["a", "b"]})", 400, "one prompt"},
      {"/v1/embeddings", R"({"model": "lm", "input": [1, 2]})", 400, "token ids"},
      {"/v1/embeddings", R"({"model": "lm", "input": "x", "dimensions": 0})", 400, "at least 1"},
      {"/v1/embeddings", R"({"model": "lm", "input": "x", "dimensions": 129})", 400, "embeds in 128 values"},
      {"/v1/embeddings", R"({"model": "lm", "input": "x", "dimensions": "8"})", 400, "dimensions must be a whole number"},
  };
  for (const Bad& b : bad) {
    std::vector<Response> r = Split(Exchange(ConnectUnix(socket_), HttpPost(b.path, b.body, true)));
    ASSERT_EQ(r.size(), 1u) << b.body;
    EXPECT_EQ(r[0].status, b.status) << b.body << " -> " << r[0].body;
    const json error = json::parse(r[0].body, nullptr, false);
    ASSERT_TRUE(error.is_object() && error.contains("error") && error["error"].contains("message")) << r[0].body;
    EXPECT_TRUE(Contains(error["error"]["message"].get<std::string>(), b.says)) << r[0].body;
    EXPECT_TRUE(error["error"].contains("type")) << r[0].body;
  }
  std::vector<Response> get = Split(Exchange(ConnectUnix(socket_), HttpGet("/v1/chat/completions", true)));
  ASSERT_EQ(get.size(), 1u);
  EXPECT_EQ(get[0].status, 405);
  EXPECT_TRUE(json::parse(get[0].body).contains("error"));
}

// Ollama's endpoints, on the socket (where the peer's credentials make this test an
// administrator): the same text as the framed protocol, NDJSON streams that end in "done",
// Ollama's error object, its keep_alive (negative: forever), options it does not do refused.
TEST_F(OpenAiTest, OllamasEndpointsSayWhatTheFramedProtocolSays) {
  StartWithDemoModel();
  auto get = [&](const std::string& path) {
    std::vector<Response> r = Split(Exchange(ConnectUnix(socket_), HttpGet(path, true)));
    EXPECT_EQ(r.size(), 1u);
    return r.empty() ? Response{} : r[0];
  };
  EXPECT_TRUE(json::parse(get("/api/version").body).contains("version"));
  const json tags = json::parse(get("/api/tags").body);
  ASSERT_EQ(tags["models"].size(), 1u) << tags;
  EXPECT_EQ(tags["models"][0]["name"], "lm");

  const json generate = {{"model", "lm"}, {"prompt", "This License"}, {"options", {{"temperature", 0}, {"num_predict", 10}, {"num_ctx", 4096}}},
                         {"keep_alive", "-1m"}};
  Response streamed = Post("/api/generate", generate);
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  std::string text;
  json last;
  for (size_t at = 0; at < streamed.body.size();) {
    const size_t end = streamed.body.find('\n', at);
    last = json::parse(streamed.body.substr(at, end - at));
    text += last["response"].get<std::string>();
    at = end + 1;
  }
  EXPECT_EQ(text, FramedText("This License", false, 10));
  EXPECT_EQ(last["done"], true);
  EXPECT_EQ(last["eval_count"].get<int>() > 0, true);
  const json ps = json::parse(get("/api/ps").body);
  ASSERT_EQ(ps["models"].size(), 1u) << ps;
  EXPECT_EQ(ps["models"][0]["expires_at"], "9999-12-31T23:59:59Z") << "a negative keep_alive keeps it";

  const json chat = {{"model", "lm"}, {"messages", json::array({{{"role", "user"}, {"content", "What may I do with the program?"}}})},
                     {"stream", false}, {"options", {{"temperature", 0}, {"num_predict", 12}}}};
  Response whole = Post("/api/chat", chat);
  ASSERT_EQ(whole.status, 200) << whole.body;
  EXPECT_EQ(json::parse(whole.body)["message"]["content"], FramedText("What may I do with the program?", true, 12));
  Response embedded = Post("/api/embed", {{"model", "lm"}, {"input", "free software"}});
  ASSERT_EQ(embedded.status, 200) << embedded.body;
  EXPECT_GT(json::parse(embedded.body)["embeddings"][0].size(), 0u);

  struct Bad {
    std::string path;
    json body;
    int status;
    std::string says;
  };
  const std::vector<Bad> bad = {
      {"/api/generate", {{"model", "lm"}, {"prompt", "x"}, {"options", {{"mirostat", 2}}}}, 400, "options.mirostat"},
      {"/api/generate", {{"model", "lm"}, {"prompt", "x"}, {"format", "json"}}, 400, "\"format\""},
      {"/api/generate", {{"model", "nope"}, {"prompt", "x"}, {"stream", false}}, 404, "not registered"},
      {"/api/pull", {{"model", "llama3"}}, 409, "register"},
      {"/api/chat", {{"model", "lm"}, {"messages", json::array({{{"role", "user"}, {"content", "x"}, {"images", {"aGk="}}}})}},
       400, "images"},
  };
  for (const Bad& b : bad) {
    Response r = Post(b.path, b.body);
    EXPECT_EQ(r.status, b.status) << b.body << " -> " << r.body;
    const json error = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(error.is_object() && error["error"].is_string()) << r.body;
    EXPECT_TRUE(Contains(error["error"].get<std::string>(), b.says)) << r.body;
  }
  // An empty prompt with keep_alive 0 unloads it, as Ollama's does.
  Response unloaded = Post("/api/generate", {{"model", "lm"}, {"keep_alive", 0}});
  ASSERT_EQ(unloaded.status, 200) << unloaded.body;
  EXPECT_EQ(json::parse(unloaded.body)["done_reason"], "unload");
  ExpectQuiescentAndValid();
}

// An OpenAI client that aborts a stream (closes its connection) stops the generation within a
// step, as a framed one does (GenerateTest.AClientThatLeavesStopsItsGeneration measures the same
// way: against the pace of the stream's own steps, not a fixed time).
TEST_F(OpenAiTest, AClientThatAbortsAStreamStopsItsGeneration) {
  WriteTinyModel(models_dir_ + "/wide",
                 transformer::RandomCheckpoint{.hidden_size = 512, .intermediate_size = 1024, .num_hidden_layers = 8,
                                               .num_attention_heads = 8, .num_key_value_heads = 8,
                                               .dtype = safetensors::DType::BF16});
  StartDaemon();
  auto watcher = Connect();
  auto inflight = [&] {
    auto ps = watcher->Ps();
    EXPECT_TRUE(ps.ok());
    for (const auto& e : ps->models()) {
      if (e.name() == "wide") return e.inflight();
    }
    return 0u;
  };
  const int fd = ConnectUnix(socket_);
  ASSERT_GE(fd, 0);
  const std::string request = HttpPost(
      "/v1/completions", R"({"model": "wide", "prompt": "Everyone is permitted", "max_tokens": 100000, "stream": true})");
  ASSERT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
  std::string got;
  std::chrono::steady_clock::time_point first;
  int events = 0;
  constexpr int kEvents = 9;
  char buffer[4096];
  while (events < kEvents) {
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    ASSERT_GT(n, 0) << got;
    got.append(buffer, static_cast<size_t>(n));
    int now = 0;
    for (size_t at = 0; (at = got.find("data: ", at)) != std::string::npos; at += 6) now++;
    if (events == 0 && now > 0) first = std::chrono::steady_clock::now();
    events = now;
  }
  const double step_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - first).count() / (kEvents - 1);
  EXPECT_EQ(inflight(), 1u);
  // While it runs, a router sees its one sequence's blocks in use: some, at most the quarter of the
  // pool that is one of four sequences' whole context.
  std::string running;
  const std::string usage_name = "warmpool_model_kv_cache_usage_ratio{model=\"wide\"} ";
  double usage = 0;
  for (int i = 0; i < 100 && usage <= 0; i++) {
    std::vector<Response> r = Split(Exchange(ConnectUnix(socket_), HttpGet("/metrics", true)));
    running = r.empty() ? "" : r[0].body;
    const size_t at = running.find(usage_name);
    usage = at == std::string::npos ? 0 : std::stod(running.substr(at + usage_name.size()));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_NE(running.find("warmpool_model_requests_running{model=\"wide\"} 1\n"), std::string::npos);
  EXPECT_GT(usage, 0.0) << running;
  // Counted in blocks, not in sequences (which would say a quarter): a few tokens into its 2048,
  // it holds a block or two of the pool's 128.
  EXPECT_LT(usage, 0.2) << running;
  close(fd);  // the client aborts
  const auto left = std::chrono::steady_clock::now();
  const double remaining = step_seconds * 2000;  // what is left of a 2048-token context at that pace
  while (inflight() != 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() - left).count() < remaining) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - left).count();
  EXPECT_EQ(inflight(), 0u);
  EXPECT_LT(seconds, remaining / 4) << "busy " << seconds << " s after the client left; a step takes " << step_seconds
                                    << " s";
  // The metrics count it: cancelled, its tokens made, its first token's time; then a whole one.
  EXPECT_EQ(Post("/v1/completions", {{"model", "wide"}, {"prompt", "Everyone"}, {"max_tokens", 3}}).status, 200);
  std::vector<Response> scraped;
  auto sample = [&](const std::string& series) {
    const size_t at = scraped[0].body.find("\n" + series + " ");
    return at == std::string::npos ? -1.0 : std::stod(scraped[0].body.substr(at + series.size() + 2));
  };
  // The gauges are published every tick of the daemon's loop (50 ms): scraped until they are.
  for (int i = 0; i < 100; i++) {
    scraped = Split(Exchange(ConnectUnix(socket_), HttpGet("/metrics", true)));
    ASSERT_EQ(scraped.size(), 1u);
    if (sample("warmpool_model_requests_running{model=\"wide\"}") == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(sample("warmpool_model_generations_cancelled_total{model=\"wide\"}"), 1);
  EXPECT_GE(sample("warmpool_model_generation_tokens_total{model=\"wide\"}"), kEvents + 3);
  EXPECT_GE(sample("warmpool_model_prompt_tokens_total{model=\"wide\"}"), 2);
  EXPECT_EQ(sample("warmpool_model_time_to_first_token_seconds_count{model=\"wide\"}"), 2);
  EXPECT_EQ(sample("warmpool_model_time_per_output_token_seconds_count{model=\"wide\"}"), 2);
  EXPECT_EQ(sample("warmpool_model_requests_total{model=\"wide\",request=\"generate\",code=\"OK\"}"), 1);
  EXPECT_EQ(sample("warmpool_model_requests_running{model=\"wide\"}"), 0);
}

}  // namespace
}  // namespace warmpool::testing
