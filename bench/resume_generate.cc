#include "bench/resume_generate.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include <fmt/format.h>

#include "bench/language_model.h"
#include "bench/skeleton.h"
#include "bench/stats.h"

namespace warmpool::bench {
namespace {

using Clock = std::chrono::steady_clock;

class ResumeGenerate {
 public:
  ResumeGenerate(ResumeGenerateOptions options, BenchRun& run) : options_(std::move(options)), run_(run) {}

  Status Run() {
    const std::string models = run_.File("models");
    Result<LanguageModel> lm = WriteLanguageModel(models + "/lm", options_.tokenizer_dir, options_.model_mib,
                                                  options_.prompt);
    if (!lm.ok()) return lm.status();
    lm_ = *lm;
    // Every round kills a worker on purpose: that is no crash loop to stop the model for.
    const std::string config = fmt::format("[daemon]\nmodels_dir = \"{}\"\n[recovery]\ncrash_loop_crashes = {}\n",
                                           models, options_.rounds + 2);
    if (Status s = run_.StartDaemon(options_.daemon, options_.backend, config); !s.ok()) {
      return s;
    }
    for (auto* c : {&stream_, &control_}) {
      Result<std::unique_ptr<client::Client>> connected = run_.Connect();
      if (!connected.ok()) return run_.WithLog(connected.status());
      *c = std::move(*connected);
    }
    std::vector<double> kill_gap, median_gap;
    bool identical = true;
    uint32_t prompt_tokens = 0, copied = 0;
    for (uint32_t r = 0; r <= options_.rounds; r++) {  // round 0 loads the model and warms up
      const std::string prompt = fmt::format("Round {}. {}", r, lm_.prompt);  // new to the prefix cache
      // The prompt's full blocks into the prefix cache first, so that the undisturbed stream and the
      // killed one both take them from there and compute the same rest: a prompt computed whole
      // and one taken in part from the cache may differ in the last bits (their products have
      // different numbers of rows), and a greedy stream can follow either.
      if (Result<Stream> primed = Generate(prompt, false, 1); !primed.ok()) return run_.WithLog(primed.status());
      Result<Stream> whole = Generate(prompt, false);
      if (!whole.ok()) return run_.WithLog(whole.status());
      Result<Stream> cut = Generate(prompt, true);
      if (!cut.ok()) return run_.WithLog(cut.status());
      if (r == 0) continue;
      identical = identical && cut->text == whole->text && cut->tokens == whole->tokens;
      kill_gap.push_back(cut->kill_gap_ms);
      median_gap.push_back(cut->median_gap_ms);
      prompt_tokens = cut->prompt_tokens;
      copied = r == 1 ? cut->cached_tokens : std::min(copied, cut->cached_tokens);  // the worst round's
    }
    Print(Median(kill_gap), Median(median_gap), prompt_tokens, copied, identical);
    stream_.reset();
    control_.reset();
    return run_.StopDaemon();
  }

 private:
  struct Stream {
    std::string text;
    std::vector<int32_t> tokens;
    uint32_t prompt_tokens = 0;
    uint32_t cached_tokens = 0;  // of the prompt's, not computed (the dead worker's cache, when resumed)
    double kill_gap_ms = 0;    // the kill to the next token
    double median_gap_ms = 0;  // between tokens, the others
  };

  // The pid of the worker serving the model (its only replica).
  Result<pid_t> Worker() {
    Result<v1::StatusReply> status = control_->GetStatus();
    if (!status.ok()) return status.status();
    for (const v1::WorkerStatus& w : status->workers()) {
      if (std::find(w.models().begin(), w.models().end(), "lm") != w.models().end() && w.pid() > 0) return w.pid();
    }
    return Error(Code::kNotFound, "no worker serves the model");
  }

  // max_tokens: 0 for the bench's --tokens.
  Result<Stream> Generate(const std::string& prompt, bool kill, uint32_t max_tokens = 0) {
    v1::GenerateRequest r;
    r.set_model("lm");
    r.set_prompt(prompt);
    r.set_max_tokens(max_tokens != 0 ? max_tokens : options_.tokens);
    r.set_temperature(0);
    r.set_stream(true);
    Stream s;
    std::vector<Clock::time_point> arrivals;
    Clock::time_point killed{};
    Status kill_error;
    Result<v1::GenerateReply> reply = stream_->Generate(r, [&](const v1::GenerateChunk& chunk) {
      if (chunk.tokens_size() == 0) return;
      arrivals.push_back(Clock::now());
      s.text += chunk.text();
      s.tokens.insert(s.tokens.end(), chunk.tokens().begin(), chunk.tokens().end());
      if (kill && s.tokens.size() == options_.tokens / 2) {
        Result<pid_t> worker = Worker();
        if (!worker.ok()) {
          kill_error = worker.status();
          return;
        }
        killed = Clock::now();
        ::kill(*worker, SIGKILL);
      }
    });
    if (!reply.ok()) return reply.status();
    if (!kill_error.ok()) return kill_error;
    s.prompt_tokens = reply->prompt_tokens();
    s.cached_tokens = reply->cached_prompt_tokens();
    std::vector<double> gaps;
    for (size_t i = 1; i < arrivals.size(); i++) {
      const double gap = std::chrono::duration<double, std::milli>(arrivals[i] - arrivals[i - 1]).count();
      if (kill && arrivals[i - 1] <= killed && arrivals[i] > killed) {
        s.kill_gap_ms = std::chrono::duration<double, std::milli>(arrivals[i] - killed).count();
      } else {
        gaps.push_back(gap);
      }
    }
    s.median_gap_ms = Median(gaps);
    return s;
  }

  void Print(double kill_gap, double median_gap, uint32_t prompt_tokens, uint32_t copied, bool identical) {
    if (options_.json) {
      std::printf("{\"mode\": \"resume-generate\", \"backend\": \"%s\", \"model_mib\": %u, \"layers\": %u, "
                  "\"tokens\": %u, "
                  "\"kill_to_next_token_ms\": %.2f, \"itl_median_ms\": %.3f, \"kill_gap_vs_median\": %.2f, "
                  "\"prompt_tokens\": %u, \"prompt_tokens_copied\": %u, \"identical\": %s}\n",
                  options_.backend.c_str(), options_.model_mib, lm_.layers, options_.tokens, kill_gap, median_gap,
                  kill_gap / median_gap,
                  prompt_tokens, copied, identical ? "true" : "false");
      return;
    }
    std::printf("warmpool-bench --generate --resume: a %u MiB bf16 model (%u layers) on backend %s, %u greedy "
                "tokens, its worker killed after %u, medians of %u rounds\n",
                options_.model_mib, lm_.layers, options_.backend.c_str(), options_.tokens, options_.tokens / 2, options_.rounds);
    std::printf("  between tokens                          %8.2f ms\n", median_gap);
    std::printf("  the kill to the next token              %8.2f ms   %.1fx (goal: 50 ms + one step); %u of the "
                "prompt's %u tokens copied from the dead worker's KV cache, not computed; the stream %s the "
                "undisturbed one\n",
                kill_gap, kill_gap / median_gap, copied, prompt_tokens, identical ? "is" : "is NOT");
  }

  ResumeGenerateOptions options_;
  BenchRun& run_;
  LanguageModel lm_;
  std::unique_ptr<client::Client> stream_, control_;
};

}  // namespace

int RunResumeGenerate(const ResumeGenerateOptions& options) {
  return BenchRun::Main("--generate --resume", [&](BenchRun& run) { return ResumeGenerate(options, run).Run(); });
}

}  // namespace warmpool::bench
