#include "chaos/stream_scenario.h"

#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <random>

#include "chaos/traffic.h"
#include "engines/tokenizer/tokenizer.h"
#include "engines/transformer/random_checkpoint.h"

namespace warmpool::chaos {
namespace {

namespace fs = std::filesystem;

// The shipped demo model's tokenizer (WARMPOOL_DEMO_MODEL where a bundle carries it, else the
// source tree's), with random f32 weights: f32, so that the resumed worker's prefill of the tokens
// sent computes what the undisturbed worker's steps did to within float rounding.
Status WriteLanguageModel(const std::string& directory) {
  const char* bundled = std::getenv("WARMPOOL_DEMO_MODEL");
  const std::string demo = bundled != nullptr ? bundled : WARMPOOL_SOURCE_DIR "/demo/license-llama";
  std::error_code error;
  fs::create_directories(directory, error);
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    fs::copy_file(demo + "/" + file, directory + "/" + file, fs::copy_options::overwrite_existing, error);
    if (error) return Error(Code::kNotFound, "the demo model's {} ({}): {}", file, demo, error.message());
  }
  Result<std::unique_ptr<tokenizer::Tokenizer>> t = tokenizer::Tokenizer::Load(directory + "/tokenizer.json");
  if (!t.ok()) return t.status();
  transformer::RandomCheckpoint spec;
  spec.vocab_size = (*t)->vocab_size();
  spec.seed = 17;
  spec.max_position_embeddings = 256;  // its KV caches small: the harness's budget is a few MiB
  return transformer::WriteRandomCheckpoint(directory, spec);
}

struct Stream {
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<uint32_t> indices;
  Result<v1::GenerateReply> final = Status();
};

// The stream of a seeded, sampled generation; with kill_at > 0, the worker serving it SIGKILLed
// when that many tokens have come.
Stream Generate(Harness& h, client::Client& c, uint32_t seed, uint32_t kill_at) {
  v1::GenerateRequest r;
  r.set_model("lm");
  r.set_prompt("This License applies to any program or other work");
  r.set_max_tokens(24);
  r.set_temperature(0.9f);
  r.set_seed(seed);
  r.set_stream(true);
  Stream s;
  s.final = c.Generate(r, [&](const v1::GenerateChunk& chunk) {
    s.tokens.insert(s.tokens.end(), chunk.tokens().begin(), chunk.tokens().end());
    s.text += chunk.text();
    s.indices.push_back(chunk.index());
    if (kill_at != 0 && s.tokens.size() >= kill_at) {
      kill_at = 0;
      auto control = h.Connect();
      if (!control.ok()) return;
      auto ps = (*control)->Ps();
      auto status = (*control)->GetStatus();
      if (!ps.ok() || !status.ok()) return;
      for (const auto& m : ps->models()) {
        if (m.name() == "lm" && m.worker() >= 0 && m.worker() < status->workers_size()) {
          kill(status->workers(m.worker()).pid(), SIGKILL);
        }
      }
    }
  });
  return s;
}

}  // namespace

void StreamResumeScenario(Harness& h, Checks& checks, size_t index) {
  if (h.Backend() == "cuda") {
    // A language model's GPU workspace (its cuBLAS workspace alone is 8 MiB) is beyond the
    // harness's budget of a few MiB, sized for its dense models; the host backend runs it.
    checks.passed.push_back("skipped on the cuda backend: the language model's workspace is over the budget");
    return;
  }
  const std::string directory = h.directory() + "/models/lm";
  if (Status written = WriteLanguageModel(directory); !written.ok()) {
    return checks.Expect(false, "a language model written", written.ToString());
  }
  auto client = h.Connect();
  if (!client.ok()) return checks.Expect(false, "connect", client.status().ToString());
  auto registered = (*client)->Register("lm", directory);
  checks.Expect(registered.ok(), "the language model registered", registered.status().ToString());
  Traffic bystander(h, TrafficSpec{&h.bystander(), 1, 0, 1, 2, 0, {}, false, 99});
  bystander.Start();
  std::mt19937 random(static_cast<uint32_t>(index) * 7919u + 1);
  const uint32_t restarts = h.TotalRestarts();
  // Two kills: a third within the minute would make the model a crash loop (`failed`).
  for (int round = 0; round < 2; ++round) {
    const auto seed = static_cast<uint32_t>(random());
    const uint32_t kill_at = 1 + random() % 22;
    Stream whole = Generate(h, **client, seed, 0);
    Stream cut = Generate(h, **client, seed, kill_at);
    const std::string what = fmt::format("round {}: seed {}, the worker killed at token {}", round, seed, kill_at);
    checks.Expect(whole.final.ok() && cut.final.ok(), what + ": both streams end well",
                  (whole.final.ok() ? cut.final.status() : whole.final.status()).ToString());
    checks.Expect(cut.tokens == whole.tokens && cut.text == whole.text,
                  what + ": the stream is the undisturbed one, token for token",
                  fmt::format("{} tokens against {}; \"{}\" against \"{}\"", cut.tokens.size(), whole.tokens.size(),
                              cut.text, whole.text));
    bool numbered = true;
    for (uint32_t i = 0; i < cut.indices.size(); ++i) numbered = numbered && cut.indices[i] == i;
    checks.Expect(numbered && cut.final.ok() && cut.final->chunks() == cut.indices.size(),
                  what + ": its chunks numbered without a gap");
  }
  bystander.Stop();
  TrafficResult served = bystander.Join();
  checks.Expect(served.problems.empty() && served.sent > 0, "bystander served throughout", served.Summary());
  for (int i = 0; i < 500 && h.TotalRestarts() < restarts + 2; i++) Sleep(10);
  checks.Expect(h.TotalRestarts() >= restarts + 2, "both kills restarted a worker");
  // As the other scenarios leave the daemon: the language model gone.
  (void)(*client)->Unregister("lm");
  Status quiet = h.Quiesce();
  checks.Expect(quiet.ok(), "quiescent", quiet.message());
}

}  // namespace warmpool::chaos
