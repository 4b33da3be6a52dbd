#include "bench/parked_generate.h"

#include <chrono>
#include <cstdio>

#include <fmt/format.h>

#include "bench/language_model.h"
#include "bench/skeleton.h"
#include "bench/stats.h"

namespace warmpool::bench {
namespace {

using Clock = std::chrono::steady_clock;

class ParkedGenerate {
 public:
  ParkedGenerate(ParkedGenerateOptions options, BenchRun& run) : options_(std::move(options)), run_(run) {}

  Status Run() {
    const std::string models = run_.File("models");
    Result<LanguageModel> lm = WriteLanguageModel(models + "/parked", options_.tokenizer_dir, options_.model_mib,
                                                  options_.prompt);
    if (!lm.ok()) return lm.status();
    prompt_ = lm->prompt;
    prompt_tokens_ = lm->prompt_tokens;
    const std::string config = fmt::format("[daemon]\nmodels_dir = \"{}\"\n[pool]\npark_budget = \"4GiB\"\n", models);
    if (Status s = run_.StartDaemon(options_.daemon, "host", config); !s.ok()) return s;
    Result<std::unique_ptr<client::Client>> c = run_.Connect();
    if (!c.ok()) return run_.WithLog(c.status());
    client_ = std::move(*c);
    if (Result<double> warm = FirstToken(); !warm.ok()) return run_.WithLog(warm.status());  // loaded, seen once
    std::vector<double> prefill, unpark, parked;
    for (uint32_t r = 0; r < options_.rounds; r++) {
      Result<double> p = FirstToken();  // ready: the prefill alone
      if (!p.ok()) return run_.WithLog(p.status());
      prefill.push_back(*p);
      if (Status s = client_->Unload("parked", /*park=*/true); !s.ok()) return run_.WithLog(s);
      const auto start = Clock::now();
      if (Result<v1::LoadReply> l = client_->Load("parked"); !l.ok()) return run_.WithLog(l.status());
      unpark.push_back(MsSince(start));  // the unpark alone
      if (Status s = client_->Unload("parked", /*park=*/true); !s.ok()) return run_.WithLog(s);
      Result<double> f = FirstToken();  // parked: unpark, then prefill, in one request
      if (!f.ok()) return run_.WithLog(f.status());
      parked.push_back(*f);
    }
    Print(Median(prefill), Median(unpark), Median(parked), lm->layers);
    return run_.StopDaemon();
  }

 private:
  // ms from sending a one-token generation to its first chunk.
  Result<double> FirstToken() {
    v1::GenerateRequest r;
    r.set_model("parked");
    // Each request's prompt begins differently: the prefix cache would otherwise serve the prompt
    // an earlier round computed, and the prefill would not be timed.
    r.set_prompt(fmt::format("{} {}", ++asked_, prompt_));
    r.set_max_tokens(1);
    r.set_temperature(0);
    r.set_stream(true);
    double first = -1;
    const auto start = Clock::now();
    Result<v1::GenerateReply> reply = client_->Generate(r, [&](const v1::GenerateChunk&) {
      if (first < 0) first = MsSince(start);
    });
    if (!reply.ok()) return reply.status();
    return first >= 0 ? first : MsSince(start);
  }

  void Print(double prefill, double unpark, double parked, uint32_t layers) {
    const double ratio = parked / (unpark + prefill);
    if (options_.json) {
      std::printf("{\"mode\": \"parked-generate\", \"model_mib\": %u, \"layers\": %u, \"prompt_tokens\": %u, "
                  "\"prefill_ms\": %.2f, \"unpark_ms\": %.2f, \"parked_first_token_ms\": %.2f, "
                  "\"first_token_vs_unpark_plus_prefill\": %.3f}\n",
                  options_.model_mib, layers, prompt_tokens_, prefill, unpark, parked, ratio);
      return;
    }
    std::printf("warmpool-bench --generate --parked: a %u MiB bf16 model (%u layers), a %u-token prompt, medians of %u rounds\n",
                options_.model_mib, layers, prompt_tokens_, options_.rounds);
    std::printf("  first token, model ready (the prefill)      %8.2f ms\n", prefill);
    std::printf("  unpark alone (load of the parked model)     %8.2f ms\n", unpark);
    std::printf("  first token, model parked                   %8.2f ms   %.2fx unpark + prefill\n", parked, ratio);
  }

  ParkedGenerateOptions options_;
  BenchRun& run_;
  std::unique_ptr<client::Client> client_;
  std::string prompt_;
  uint32_t prompt_tokens_ = 0;
  uint32_t asked_ = 0;
};

}  // namespace

int RunParkedGenerate(const ParkedGenerateOptions& options) {
  return BenchRun::Main("--generate --parked", [&](BenchRun& run) { return ParkedGenerate(options, run).Run(); });
}

}  // namespace warmpool::bench
