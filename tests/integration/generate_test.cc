// Language models end to end: a Hugging Face model directory in the models directory, served by
// the transformer engine in a worker, its text streamed to the C++ client and the CLI; a worker
// killed mid-stream (the stream resumes), a client that leaves, a park and an unpark.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/integration/daemon_fixture.h"
#include "engines/transformer/decode_attention.h"
#include "engines/transformer/generation.h"
#include "engines/transformer/packed_model.h"
#include "tests/unit/tiny_model.h"

namespace warmpool::testing {
namespace {

class GenerateTest : public DaemonTest {
 protected:
  void WriteModel(const std::string& name, transformer::RandomCheckpoint spec = {}) {
    WriteTinyModel(models_dir_ + "/" + name, spec);
  }
  static v1::GenerateRequest Greedy(const std::string& model, const std::string& prompt, uint32_t max_tokens,
                                    bool stream = true) {
    v1::GenerateRequest r;
    r.set_model(model);
    r.set_prompt(prompt);
    r.set_max_tokens(max_tokens);
    r.set_temperature(0);
    r.set_stream(stream);
    return r;
  }
  struct Streamed {
    std::string text;
    std::vector<int32_t> tokens;
    std::vector<uint32_t> indices;
    Result<v1::GenerateReply> final = Status();
  };
  static Streamed Stream(client::Client& c, v1::GenerateRequest request) {
    Streamed s;
    s.final = c.Generate(std::move(request), [&](const v1::GenerateChunk& chunk) {
      s.text += chunk.text();
      s.tokens.insert(s.tokens.end(), chunk.tokens().begin(), chunk.tokens().end());
      s.indices.push_back(chunk.index());
    });
    return s;
  }
  uint32_t Inflight(client::Client& c, const std::string& model) {
    auto ps = c.Ps();
    EXPECT_TRUE(ps.ok());
    for (const auto& e : ps->models()) {
      if (e.name() == model) return e.inflight();
    }
    return 0;
  }
};

// What registration counts for a bf16 model's KV cache is what the worker's engine reports once it
// has loaded it: the first admission counts the cache the model will have, not an f32 one.
TEST_F(GenerateTest, RegistrationCountsTheKvCacheTheEngineKeeps) {
  if (!transformer::HaveBF16KvCache(16)) GTEST_SKIP() << "no bf16 KV cache on this CPU: f32 either way";
  transformer::RandomCheckpoint bf16;
  bf16.dtype = safetensors::DType::BF16;
  WriteModel("tiny", bf16);
  StartDaemon("", {"--backend", "host"});
  auto c = Connect();
  auto registered = c->Models();
  ASSERT_TRUE(registered.ok() && registered->models_size() == 1);
  ASSERT_TRUE(c->Generate(Greedy("tiny", "This License", 2, /*stream=*/false)).ok());
  auto loaded = c->Models();
  ASSERT_TRUE(loaded.ok() && loaded->models_size() == 1);
  EXPECT_EQ(loaded->models(0).kv_bytes_per_token(), registered->models(0).kv_bytes_per_token());
  EXPECT_EQ(loaded->models(0).workspace_bytes(), registered->models(0).workspace_bytes());
}

TEST_F(GenerateTest, AModelDirectoryStreamsTheTextItAlsoGivesWhole) {
  WriteModel("tiny");
  StartDaemon();
  auto c = Connect();
  auto models = c->Models();
  ASSERT_TRUE(models.ok());
  ASSERT_EQ(models->models_size(), 1);
  EXPECT_EQ(models->models(0).engine(), "transformer");
  EXPECT_EQ(models->models(0).context(), 2048u);
  EXPECT_GT(models->models(0).kv_bytes_per_token(), 0u);
  EXPECT_GE(models->models(0).workspace_bytes(), models->models(0).kv_bytes_per_token() * 2048);

  Streamed streamed = Stream(*c, Greedy("tiny", "This License applies to", 24));
  ASSERT_TRUE(streamed.final.ok()) << streamed.final.status().ToString();
  ASSERT_FALSE(streamed.indices.empty());
  for (uint32_t i = 0; i < streamed.indices.size(); i++) EXPECT_EQ(streamed.indices[i], i);
  EXPECT_EQ(streamed.final->chunks(), streamed.indices.size());
  EXPECT_EQ(streamed.final->completion_tokens(), streamed.tokens.size());
  EXPECT_TRUE(streamed.final->text().empty()) << "streamed: the text came in the chunks";

  auto whole = c->Generate(Greedy("tiny", "This License applies to", 24, /*stream=*/false));
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_EQ(whole->text(), streamed.text);
  EXPECT_EQ(std::vector<int32_t>(whole->tokens().begin(), whole->tokens().end()), streamed.tokens);
  EXPECT_EQ(whole->chunks(), 0u);

  // ps shows the context and what the KV cache takes.
  auto ps = c->Ps();
  ASSERT_TRUE(ps.ok() && ps->models_size() == 1);
  EXPECT_EQ(ps->models(0).context(), 2048u);

  // The CLI: NDJSON chunks, then the final line; the same text.
  std::string out, err;
  ASSERT_EQ(Cli({"generate", "tiny", "This License applies to", "--max-tokens", "24", "--temperature", "0", "--json"},
                &out, &err),
            0)
      << err;
  std::istringstream lines(out);
  std::string line, text;
  nlohmann::json last;
  while (std::getline(lines, line)) {
    last = nlohmann::json::parse(line);
    if (!last.contains("done")) text += last["text"].get<std::string>();
  }
  EXPECT_EQ(text, streamed.text);
  EXPECT_EQ(last["finish_reason"], streamed.final->finish_reason());
  // Tensors to a language model: refused, naming what to send instead.
  auto tensor = c->Infer("tiny", RandomMatrix(1, 4, 1));
  ASSERT_FALSE(tensor.ok());
  EXPECT_EQ(tensor.status().code(), Code::kFailedPrecondition);
}

TEST_F(GenerateTest, BadRequestsGetTypedErrorsAndTheModelKeepsServing) {
  WriteModel("tiny");
  StartDaemon();
  auto c = Connect();
  auto refused = [&](v1::GenerateRequest r, Code code, const char* says) {
    auto reply = c->Generate(std::move(r));
    ASSERT_FALSE(reply.ok()) << says;
    EXPECT_EQ(reply.status().code(), code) << reply.status().ToString();
    EXPECT_TRUE(Contains(reply.status().message(), says)) << reply.status().message();
  };
  v1::GenerateRequest nan = Greedy("tiny", "x", 4);
  nan.set_temperature(std::numeric_limits<float>::quiet_NaN());
  refused(nan, Code::kInvalidArgument, "temperature");
  refused(Greedy("tiny", std::string(30000, 'q'), 4), Code::kInvalidArgument, "context");
  v1::GenerateRequest both = Greedy("tiny", "x", 4);
  both.add_tokens(1);
  refused(both, Code::kInvalidArgument, "not both");
  v1::GenerateRequest stops = Greedy("tiny", "x", 4);
  for (int i = 0; i < 17; i++) stops.add_stop("s");
  refused(stops, Code::kInvalidArgument, "stop strings");
  v1::GenerateRequest outside = Greedy("tiny", "", 4);
  outside.add_tokens(1 << 30);
  refused(outside, Code::kInvalidArgument, "vocabulary");
  refused(Greedy("nope", "x", 4), Code::kNotFound, "nope");
  auto fine = c->Generate(Greedy("tiny", "still serving", 4));
  EXPECT_TRUE(fine.ok()) << fine.status().ToString();
}

// SIGKILL of the worker after the first chunk: the stream goes on, on a respawned worker that
// attaches the weights the supervisor held, after the tokens the client has — with a sampled
// generation too, whose seed carries on: the client's stream is the undisturbed one, no chunk
// twice and none missing, and the prompt is copied from the dead worker's KV cache.
TEST_F(GenerateTest, AWorkerKilledMidStreamHasItsStreamResumeWhereItWasCut) {
  WriteModel("tiny");
  StartDaemon("", {"--enable-fault-injection"});
  auto c = Connect();
  v1::GenerateRequest sampled = Greedy("tiny", "Preamble", 16);
  sampled.set_temperature(0.9f);
  sampled.set_seed(5);
  for (const v1::GenerateRequest& request : {Greedy("tiny", "Preamble", 16), sampled}) {
    Streamed whole = Stream(*c, request);
    ASSERT_TRUE(whole.final.ok()) << whole.final.status().ToString();
    ASSERT_TRUE(c->ArmFault(client::FaultSpec{"infer.mid", "kill", "tiny", 0, 1}).ok());
    Streamed cut = Stream(*c, request);
    ASSERT_TRUE(cut.final.ok()) << cut.final.status().ToString();
    EXPECT_EQ(cut.tokens, whole.tokens);
    EXPECT_EQ(cut.text, whole.text);
    for (uint32_t i = 0; i < cut.indices.size(); i++) EXPECT_EQ(cut.indices[i], i);
    EXPECT_EQ(cut.final->completion_tokens(), whole.final->completion_tokens());
    EXPECT_EQ(cut.final->chunks(), cut.indices.size());
    // The respawned worker's cache was empty: the prompt's keys and values came from the dead
    // worker's, which the supervisor held (engine ABI version 10), not from computing it again.
    EXPECT_GT(cut.final->prompt_tokens(), 0u);
    EXPECT_EQ(cut.final->cached_prompt_tokens(), cut.final->prompt_tokens());
  }
  auto status = c->GetStatus();
  ASSERT_TRUE(status.ok());
  uint32_t restarts = 0;
  for (const auto& w : status->workers()) restarts += w.restarts();
  EXPECT_EQ(restarts, 2u) << "each stream's worker was killed once";
  ExpectQuiescentAndValid();
}

// A prompt of several prefill pieces: the engine's progress between them reaches no client (every
// chunk carries text or tokens, numbered without a gap), and the reply counts the whole prompt.
TEST_F(GenerateTest, ALongPromptsProgressIsNotSentAsChunks) {
  WriteModel("tiny");
  StartDaemon();
  auto c = Connect();
  std::string prompt;
  while (prompt.size() < 6000) prompt += "This License applies to any program or other work which contains a notice. ";
  Streamed s = Stream(*c, Greedy("tiny", prompt, 8));
  ASSERT_TRUE(s.final.ok()) << s.final.status().ToString();
  EXPECT_GT(s.final->prompt_tokens(), 2 * transformer::kPrefillPiece);
  for (uint32_t i = 0; i < s.indices.size(); i++) EXPECT_EQ(s.indices[i], i);
  EXPECT_EQ(s.final->completion_tokens(), s.tokens.size());
  EXPECT_LE(s.indices.size(), s.tokens.size() + 1) << "a chunk per token, and the held-back text at most";
}

// Embeddings through warmpoold: one per input, in order, at unit length; an input embeds the same
// alone or beside others, and again from a parked copy.
TEST_F(GenerateTest, EmbeddingsComeOnePerInputAtUnitLengthAndTheSameFromAParkedCopy) {
  WriteModel("tiny");
  StartDaemon("[pool]\npark_budget = \"100MiB\"\n");
  auto c = Connect();
  auto values = [](const v1::Embedding& e) { return std::vector<float>(e.values().begin(), e.values().end()); };
  auto embed = [&](std::vector<std::string> inputs) {
    v1::EmbedRequest r;
    r.set_model("tiny");
    for (std::string& input : inputs) r.add_input(std::move(input));
    return c->Embed(std::move(r));
  };
  auto both = embed({"free software", "the GNU General Public License"});
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  ASSERT_EQ(both->embeddings_size(), 2);
  EXPECT_EQ(both->dimensions(), 64u) << "the tiny model's hidden size";
  for (const v1::Embedding& e : both->embeddings()) {
    ASSERT_EQ(e.values_size(), 64);
    double squares = 0;
    for (float v : e.values()) squares += double{v} * v;
    EXPECT_NEAR(squares, 1.0, 1e-5);
    EXPECT_GT(e.tokens(), 1u);
  }
  EXPECT_EQ(both->prompt_tokens(), both->embeddings(0).tokens() + both->embeddings(1).tokens());
  // An input's embedding is its own whatever comes with it, up to the order of the sums of a
  // step that embeds several together (engines/transformer/embedding.h, EmbedGroup).
  auto near = [](const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::fabs(a[i] - b[i]) > 1e-5f) return false;
    }
    return true;
  };
  auto alone = embed({"the GNU General Public License"});
  ASSERT_TRUE(alone.ok());
  EXPECT_TRUE(near(values(alone->embeddings(0)), values(both->embeddings(1))));
  EXPECT_NE(values(both->embeddings(0)), values(both->embeddings(1)));
  ASSERT_TRUE(c->Unload("tiny", /*park=*/true).ok());
  auto unparked = embed({"free software", "the GNU General Public License"});
  ASSERT_TRUE(unparked.ok()) << unparked.status().ToString();
  EXPECT_EQ(values(unparked->embeddings(0)), values(both->embeddings(0))) << "the same request: the same bits";
  auto empty = embed({""});
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), Code::kInvalidArgument);

  // The CLI: a JSON array per input, in order; the lines of stdin when no text is given.
  std::string out, err;
  ASSERT_EQ(Cli({"embed", "tiny", "free software", "x"}, &out, &err), 0) << err;
  std::istringstream lines(out);
  std::string first;
  ASSERT_TRUE(std::getline(lines, first));
  EXPECT_TRUE(near(nlohmann::json::parse(first).get<std::vector<float>>(), values(both->embeddings(0))));
  ASSERT_EQ(Cli({"embed", "tiny", "--json"}, &out, &err, "free software\n\nx\n"), 0) << err;
  nlohmann::json reply = nlohmann::json::parse(out);
  EXPECT_EQ(reply["embeddings"].size(), 2u) << "the empty line is skipped";
  EXPECT_EQ(reply["dimensions"], 64);
  EXPECT_NE(Cli({"embed", "tiny", ""}, &out, &err), 0);
  EXPECT_NE(err.find("INVALID_ARGUMENT"), std::string::npos) << err;
  // --dimensions: the first values, at unit length again (as the protocol's dimensions gives them).
  ASSERT_EQ(Cli({"embed", "tiny", "free software", "--dimensions", "8"}, &out, &err), 0) << err;
  const std::vector<float> shorter = nlohmann::json::parse(out).get<std::vector<float>>();
  ASSERT_EQ(shorter.size(), 8u);
  double squares = 0;
  for (size_t i = 0; i < 8; ++i) squares += double{values(both->embeddings(0))[i]} * values(both->embeddings(0))[i];
  for (size_t i = 0; i < 8; ++i) EXPECT_NEAR(shorter[i], values(both->embeddings(0))[i] / std::sqrt(squares), 1e-5);
  EXPECT_NE(Cli({"embed", "tiny", "x", "--dimensions", "65"}, &out, &err), 0);
  EXPECT_NE(err.find("embeds in 64 values"), std::string::npos) << err;
}

// Log-probabilities through warmpoold: one per token in the chunks (or the reply), with the most
// likely tokens' when asked; the CLI prints them in its --json lines.
TEST_F(GenerateTest, LogprobsComeWithEachTokenThroughTheDaemonAndTheCli) {
  WriteModel("tiny");
  StartDaemon();
  auto c = Connect();
  v1::GenerateRequest r = Greedy("tiny", "Everyone is permitted", 5);
  r.set_logprobs(true);
  r.set_top_logprobs(2);
  std::vector<v1::TokenLogprobs> logprobs;
  std::vector<int32_t> tokens;
  auto final = c->Generate(r, [&](const v1::GenerateChunk& chunk) {
    EXPECT_EQ(chunk.logprobs_size(), chunk.tokens_size());
    logprobs.insert(logprobs.end(), chunk.logprobs().begin(), chunk.logprobs().end());
    tokens.insert(tokens.end(), chunk.tokens().begin(), chunk.tokens().end());
  });
  ASSERT_TRUE(final.ok()) << final.status().ToString();
  ASSERT_EQ(logprobs.size(), tokens.size());
  for (size_t i = 0; i < tokens.size(); i++) {
    EXPECT_EQ(logprobs[i].chosen().token(), tokens[i]);
    EXPECT_LE(logprobs[i].chosen().logprob(), 0.0f);
    ASSERT_EQ(logprobs[i].top_size(), 2);
    EXPECT_EQ(logprobs[i].top(0).token(), tokens[i]) << "greedy";
  }
  r.set_stream(false);
  auto whole = c->Generate(r);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->logprobs_size(), whole->tokens_size());
  r.set_top_logprobs(21);
  EXPECT_EQ(c->Generate(r).status().code(), Code::kInvalidArgument);

  std::string out, err;
  ASSERT_EQ(Cli({"generate", "tiny", "Everyone is permitted", "--max-tokens", "3", "--temperature", "0", "--json",
                 "--logprobs"},
                &out, &err),
            0)
      << err;
  std::istringstream lines(out);
  std::string line;
  ASSERT_TRUE(std::getline(lines, line));
  nlohmann::json first = nlohmann::json::parse(line);
  ASSERT_TRUE(first.contains("logprobs")) << line;
  EXPECT_EQ(first["logprobs"][0]["token"], first["tokens"][0]);
  EXPECT_TRUE(first["logprobs"][0]["bytes"].is_array());
}

// Parking keeps the tokenizer, the weights and the KV cache (engine ABI version 11): the prompt the
// model computed before it was parked is in its prefix cache after it is unparked, whole blocks of
// it, and the cache kept counts in the parked model's size.
TEST_F(GenerateTest, ParkedAndUnparkedItGeneratesTheSameTextAndKeepsItsPrefixCache) {
  WriteModel("tiny");
  StartDaemon("[pool]\npark_budget = \"100MiB\"\n");
  auto c = Connect();
  std::string prompt;
  for (int i = 0; i < 8; ++i) prompt += "You may convey verbatim copies of the Program's source code. ";
  auto before = c->Generate(Greedy("tiny", prompt, 16, /*stream=*/false));
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  ASSERT_GT(before->prompt_tokens(), 64u);
  EXPECT_EQ(before->cached_prompt_tokens(), 0u);
  ASSERT_TRUE(c->Unload("tiny", /*park=*/true).ok());
  auto ps = c->Ps();
  ASSERT_TRUE(ps.ok() && ps->models_size() == 1);
  EXPECT_EQ(ps->models(0).state(), "parked");
  EXPECT_GT(ps->models(0).workspace_bytes(), 0u) << "the KV cache kept with the copy";
  auto after = c->Generate(Greedy("tiny", prompt, 16, /*stream=*/false));
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_EQ(after->text(), before->text()) << "the tokenizer and the weights came back from the parked copy";
  EXPECT_EQ(after->cached_prompt_tokens(), (before->prompt_tokens() - 1) / 64 * 64)
      << "the prompt's whole blocks came back with the parked cache";
}

// A park budget with room for the weights' copy but not the KV cache parks the weights alone: the
// unparked model starts with an empty cache, and computes the same text.
TEST_F(GenerateTest, AParkBudgetWithoutRoomForTheKvCacheParksTheWeightsAlone) {
  WriteModel("tiny");
  const int directory = open((models_dir_ + "/tiny").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(directory, 0);
  Result<transformer::PackedModel> packed = transformer::DescribeDirectory(directory, "tiny");
  close(directory);
  ASSERT_TRUE(packed.ok()) << packed.status().ToString();
  StartDaemon(fmt::format("[pool]\npark_budget = {}\n", packed->region_bytes + 4096));  // the copy's, and 4 KiB
  auto c = Connect();
  std::string prompt;
  for (int i = 0; i < 8; ++i) prompt += "You may convey verbatim copies of the Program's source code. ";
  auto before = c->Generate(Greedy("tiny", prompt, 16, /*stream=*/false));
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  ASSERT_TRUE(c->Unload("tiny", /*park=*/true).ok());
  auto ps = c->Ps();
  ASSERT_TRUE(ps.ok() && ps->models_size() == 1);
  EXPECT_EQ(ps->models(0).state(), "parked");
  EXPECT_EQ(ps->models(0).workspace_bytes(), 0u);
  auto after = c->Generate(Greedy("tiny", prompt, 16, /*stream=*/false));
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_EQ(after->text(), before->text());
  EXPECT_EQ(after->cached_prompt_tokens(), 0u);
}

// A generation to the end of a long context takes seconds; its client leaving ends it within a
// step, so the model is idle again long before it would have finished (judged against the pace of
// its own steps, measured in the same run).
TEST_F(GenerateTest, AClientThatLeavesStopsItsGeneration) {
  WriteModel("wide", transformer::RandomCheckpoint{.hidden_size = 512, .intermediate_size = 1024,
                                                   .num_hidden_layers = 8, .num_attention_heads = 8,
                                                   .num_key_value_heads = 8, .dtype = safetensors::DType::BF16});
  StartDaemon();
  auto watcher = Connect();
  double step_seconds = 0;
  {
    auto c = Connect();
    v1::Envelope e;
    *e.mutable_generate() = Greedy("wide", "Everyone is permitted", 0);  // to the end of the context
    auto id = c->Send(e);
    ASSERT_TRUE(id.ok());
    std::chrono::steady_clock::time_point first;
    constexpr int kChunks = 9;
    for (int chunks = 0; chunks < kChunks; chunks++) {
      auto reply = c->Wait(*id);
      ASSERT_TRUE(reply.ok() && reply->has_generate_chunk()) << (reply.ok() ? reply->DebugString() : "");
      if (chunks == 0) first = std::chrono::steady_clock::now();
    }
    step_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - first).count() / (kChunks - 1);
    EXPECT_EQ(Inflight(*watcher, "wide"), 1u);
  }  // the connection closes
  const auto left = std::chrono::steady_clock::now();
  // What is left of the whole generation (2048 tokens of context) at that pace.
  const double remaining = step_seconds * 2000;
  while (Inflight(*watcher, "wide") != 0 &&
         std::chrono::duration<double>(std::chrono::steady_clock::now() - left).count() < remaining) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - left).count();
  EXPECT_EQ(Inflight(*watcher, "wide"), 0u);
  EXPECT_LT(seconds, remaining / 4) << "idle " << seconds << " s after the client left; a step takes "
                                    << step_seconds << " s";
  auto next = watcher->Generate(Greedy("wide", "Everyone", 2));
  EXPECT_TRUE(next.ok()) << next.status().ToString();
}

}  // namespace
}  // namespace warmpool::testing
