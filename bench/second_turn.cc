#include "bench/second_turn.h"

#include <chrono>
#include <cstdio>
#include <future>
#include <thread>

#include <fmt/format.h>

#include "bench/language_model.h"
#include "bench/skeleton.h"
#include "bench/stats.h"

namespace warmpool::bench {
namespace {

using Clock = std::chrono::steady_clock;

class SecondTurn {
 public:
  SecondTurn(SecondTurnOptions options, BenchRun& run) : options_(std::move(options)), run_(run) {}

  Status Run() {
    const std::string models = run_.File("models");
    const uint32_t context = std::max<uint32_t>(2048, options_.history + options_.tokens * 2 + 128);
    Result<LanguageModel> lm = WriteLanguageModel(models + "/lm", options_.tokenizer_dir, options_.model_mib, 32,
                                                  context, options_.history);
    if (!lm.ok()) return lm.status();
    lm_ = *lm;
    const std::string config =
        fmt::format("[daemon]\nmodels_dir = \"{}\"\nworkers_per_device = {}\n[[models]]\nname = \"lm\"\n"
                    "path = \"{}/lm\"\nreplicas = {}\n",
                    models, std::max(2u, options_.replicas), models, options_.replicas);
    if (Status s = run_.StartDaemon(options_.daemon, options_.backend, config); !s.ok()) return s;
    Result<std::unique_ptr<client::Client>> c = run_.Connect();
    if (!c.ok()) return run_.WithLog(c.status());
    client_ = std::move(*c);
    if (options_.replicas > 1) {
      Result<std::unique_ptr<client::Client>> other = run_.Connect();
      if (!other.ok()) return run_.WithLog(other.status());
      other_ = std::move(*other);
    }
    std::vector<double> first, second;
    uint32_t prompt_tokens = 0, cached = 0;
    for (uint32_t r = 0; r <= options_.rounds; r++) {  // round 0 loads the model and warms up
      const std::string history = fmt::format("Round {}. {}", r, lm_.long_prompt);
      Result<Turn> one = Ask(history);
      if (!one.ok()) return run_.WithLog(one.status());
      // Another stream first, where there are replicas: running beside the second turn.
      std::promise<void> started;
      Status other_status = OkStatus();
      std::thread other;
      if (other_) {
        other = std::thread([&] {
          v1::GenerateRequest request;
          request.set_model("lm");
          request.set_prompt(fmt::format("Another conversation, round {}: {}", r, lm_.prompt));
          request.set_max_tokens(options_.tokens * 4);
          request.set_temperature(0);
          request.set_stream(true);
          bool told = false;
          Result<v1::GenerateReply> reply = other_->Generate(request, [&](const v1::GenerateChunk&) {
            if (!told) started.set_value();
            told = true;
          });
          if (!told) started.set_value();
          if (!reply.ok()) other_status = reply.status();
        });
        started.get_future().wait();
      }
      Result<Turn> two = Ask(history + one->text + " Then what?");
      if (other.joinable()) other.join();
      if (!two.ok()) return run_.WithLog(two.status());
      if (!other_status.ok()) return run_.WithLog(other_status);
      if (r == 0) continue;
      first.push_back(one->first_token_ms);
      second.push_back(two->first_token_ms);
      prompt_tokens = two->prompt_tokens;
      cached = two->cached_tokens;
    }
    Print(Median(first), Median(second), prompt_tokens, cached);
    client_.reset();
    other_.reset();
    return run_.StopDaemon();
  }

 private:
  struct Turn {
    double first_token_ms = 0;
    std::string text;
    uint32_t prompt_tokens = 0;
    uint32_t cached_tokens = 0;
  };

  Result<Turn> Ask(const std::string& prompt) {
    v1::GenerateRequest r;
    r.set_model("lm");
    r.set_prompt(prompt);
    r.set_max_tokens(options_.tokens);
    r.set_temperature(0);
    r.set_stream(true);
    Turn turn;
    const auto start = Clock::now();
    Result<v1::GenerateReply> reply = client_->Generate(r, [&](const v1::GenerateChunk& chunk) {
      if (turn.first_token_ms == 0 && chunk.tokens_size() > 0) turn.first_token_ms = MsSince(start);
      turn.text += chunk.text();
    });
    if (!reply.ok()) return reply.status();
    turn.prompt_tokens = reply->prompt_tokens();
    turn.cached_tokens = reply->cached_prompt_tokens();
    return turn;
  }

  void Print(double first, double second, uint32_t prompt_tokens, uint32_t cached) {
    const double ratio = second / first;
    if (options_.json) {
      std::printf("{\"mode\": \"second-turn\", \"model_mib\": %u, \"layers\": %u, \"history_tokens\": %u, "
                  "\"first_turn_first_token_ms\": %.2f, \"second_turn_first_token_ms\": %.2f, "
                  "\"second_vs_first\": %.3f, \"second_turn_prompt_tokens\": %u, \"second_turn_cached_tokens\": %u}\n",
                  options_.model_mib, lm_.layers, lm_.long_prompt_tokens, first, second, ratio, prompt_tokens, cached);
      return;
    }
    std::printf("warmpool-bench --generate --second-turn: a %u MiB bf16 model (%u layers), a %u-token history, "
                "%u replica(s)%s, medians of %u rounds\n",
                options_.model_mib, lm_.layers, lm_.long_prompt_tokens, options_.replicas,
                options_.replicas > 1 ? " and another stream beside the second turn" : "", options_.rounds);
    std::printf("  first turn, first token                 %8.2f ms\n", first);
    std::printf("  second turn, first token                %8.2f ms   %.3fx the first (goal <= 0.2x); %u of its %u "
                "prompt tokens from the prefix cache\n",
                second, ratio, cached, prompt_tokens);
  }

  SecondTurnOptions options_;
  BenchRun& run_;
  LanguageModel lm_;
  std::unique_ptr<client::Client> client_;
  std::unique_ptr<client::Client> other_;  // --replicas: the stream beside the second turn
};

}  // namespace

int RunSecondTurn(const SecondTurnOptions& options) {
  return BenchRun::Main("--generate --second-turn", [&](BenchRun& run) { return SecondTurn(options, run).Run(); });
}

}  // namespace warmpool::bench
