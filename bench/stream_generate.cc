#include "bench/stream_generate.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "bench/language_model.h"
#include "bench/skeleton.h"
#include "bench/stats.h"

namespace warmpool::bench {
namespace {

using Clock = std::chrono::steady_clock;

v1::GenerateRequest Greedy(const std::string& prompt, uint32_t max_tokens) {
  v1::GenerateRequest r;
  r.set_model("lm");
  r.set_prompt(prompt);
  r.set_max_tokens(max_tokens);
  r.set_temperature(0);
  r.set_stream(true);
  return r;
}

class StreamGenerate {
 public:
  StreamGenerate(StreamGenerateOptions options, BenchRun& run) : options_(std::move(options)), run_(run) {}

  Status Run() {
    const std::string models = run_.File("models");
    // Room for the long prompt, and for the stream beside it to outlast that prompt however few of
    // its tokens a step takes (BesideALongPrompt).
    const uint32_t context = std::max<uint32_t>(
        {2048, options_.prompt + options_.tokens + 64, options_.prompt + StreamBesideTokens() + 64,
         options_.long_prompt + 64});
    Result<LanguageModel> lm = WriteLanguageModel(models + "/lm", options_.tokenizer_dir, options_.model_mib,
                                                  options_.prompt, context, options_.long_prompt);
    if (!lm.ok()) return lm.status();
    lm_ = *lm;
    // The stream beside the long prompt and that prompt run at once only where the cache holds both
    // (each admitted by all it may need): otherwise the prompt waits for the stream to end.
    const uint64_t both = uint64_t{options_.prompt} + StreamBesideTokens() + options_.long_prompt + 2 * 64;
    if (options_.kv_cache_tokens != 0 && options_.kv_cache_tokens < both) {
      return Error(Code::kInvalidArgument,
                   "--kv-cache-tokens {} cannot hold a stream of {} tokens and a {}-token prompt at once: give {} or more",
                   options_.kv_cache_tokens, StreamBesideTokens(), options_.long_prompt, both);
    }
    std::string config =
        fmt::format("[daemon]\nmodels_dir = \"{}\"\nthreads_per_worker = {}\n[[models]]\nname = \"lm\"\npath = \"{}/lm\"\nparallel = {}\n",
                    models, options_.threads, models, std::max(options_.streams, 2u));
    if (options_.kv_cache_tokens != 0) config += fmt::format("kv_cache_tokens = {}\n", options_.kv_cache_tokens);
    if (options_.prefill_stretch != 0) config += fmt::format("prefill_stretch = {}\n", options_.prefill_stretch);
    if (Status s = run_.StartDaemon(options_.daemon, options_.backend, config); !s.ok()) return s;
    for (uint32_t i = 0; i < std::max(options_.streams, 2u); i++) {
      Result<std::unique_ptr<client::Client>> c = run_.Connect();
      if (!c.ok()) return run_.WithLog(c.status());
      clients_.push_back(std::move(*c));
    }
    std::vector<double> alone, together, alone_decoding, together_decoding;
    for (uint32_t r = 0; r <= options_.rounds; r++) {  // round 0 loads the model and warms up
      Result<Rates> one = Streams(1);
      if (!one.ok()) return run_.WithLog(one.status());
      Result<Rates> many = Streams(options_.streams);
      if (!many.ok()) return run_.WithLog(many.status());
      if (r == 0) continue;
      alone.push_back(one->end_to_end);
      together.push_back(many->end_to_end);
      // A round without a window (a stream done before the last began: too few --tokens) has no
      // decoding figure rather than a zero one.
      if (one->decoding > 0 && many->decoding > 0) {
        alone_decoding.push_back(one->decoding);
        together_decoding.push_back(many->decoding);
      }
    }
    if (together_decoding.empty()) {
      std::fprintf(stderr, "no round had all %u streams decoding at once: give more --tokens\n", options_.streams);
      alone_decoding.push_back(0);
      together_decoding.push_back(0);
    }
    Result<Latencies> beside = BesideALongPrompt();
    if (!beside.ok()) return run_.WithLog(beside.status());
    if (Status s = ReadKvCache(); !s.ok()) return run_.WithLog(s);
    Print({Median(alone), Median(alone_decoding)}, {Median(together), Median(together_decoding)}, *beside);
    clients_.clear();
    return run_.StopDaemon();
  }

 private:
  struct Latencies {
    double median_ms = 0;        // between tokens, outside the long prompt's prefill
    double during_p99_ms = 0;    // during it (nearest rank; the largest when there are few)
    double during_max_ms = 0;
    size_t during = 0;           // gaps during it
    double prefill_ms = 0;       // sent to the long request's first token
    uint32_t long_tokens = 0;    // its prompt's, as the daemon counted them
  };

  // What `count` streams at once (one per connection, each its own prompt) made, in tokens/s.
  struct Rates {
    double end_to_end = 0;  // every completion token, from the first send to the last token
    // Decoding: the tokens that arrived while every stream was decoding (after the last stream's
    // first token, up to the first stream's last), over that window; one stream: its tokens after
    // its first, over their span. The prompts' prefill is outside it, and so is the ramp while
    // later prompts prefill beside earlier streams (paced: step_pacer.h). 0 when no window is left.
    double decoding = 0;
  };
  Result<Rates> Streams(uint32_t count) {
    std::vector<Result<v1::GenerateReply>> replies(count, Status());
    std::vector<std::vector<std::pair<Clock::time_point, int>>> arrivals(count);  // per chunk: when, tokens
    const auto start = Clock::now();
    std::vector<std::thread> threads;
    for (uint32_t i = 0; i < count; i++) {
      threads.emplace_back([&, i] {
        // A prompt of its own, new every round: the prefix cache serves none of it.
        replies[i] = clients_[i]->Generate(Greedy(fmt::format("{}-{}: {}", ++asked_, i, lm_.prompt), options_.tokens),
                                           [&arrivals, i](const v1::GenerateChunk& chunk) {
                                             if (chunk.tokens_size() > 0) {
                                               arrivals[i].emplace_back(Clock::now(), chunk.tokens_size());
                                             }
                                           });
      });
    }
    for (std::thread& t : threads) t.join();
    Rates rates;
    uint64_t tokens = 0;
    Clock::time_point last_first = start, first_last = Clock::time_point::max(), last = start;
    for (uint32_t i = 0; i < count; i++) {
      if (!replies[i].ok()) return replies[i].status();
      tokens += replies[i]->completion_tokens();
      if (arrivals[i].empty()) return Error(Code::kInternal, "a stream sent no chunk with tokens");
      last_first = std::max(last_first, arrivals[i].front().first);
      first_last = std::min(first_last, arrivals[i].back().first);
      last = std::max(last, arrivals[i].back().first);
    }
    rates.end_to_end = tokens / (std::chrono::duration<double>(last - start).count());
    if (first_last > last_first) {
      uint64_t within = 0;
      for (const auto& stream : arrivals) {
        for (const auto& [when, n] : stream) within += when > last_first && when <= first_last ? n : 0;
      }
      rates.decoding = within / std::chrono::duration<double>(first_last - last_first).count();
    }
    return rates;
  }

  // One stream decodes; after its 8th token another connection sends the long prompt (one token
  // wanted). The stream's gaps between tokens while that prefills, against its own median.
  // The stream beside the long prompt: a step goes by for each of its tokens, and a step takes one
  // of the long prompt's tokens at least (engines/transformer/step_pacer.h).
  uint32_t StreamBesideTokens() const { return options_.long_prompt + 128; }

  Result<Latencies> BesideALongPrompt() {
    const uint32_t tokens = StreamBesideTokens();
    std::vector<Clock::time_point> arrivals;
    Clock::time_point sent_long{}, long_first{};
    Result<v1::GenerateReply> long_reply = Status();
    std::thread long_request;
    Result<v1::GenerateReply> running = clients_[0]->Generate(Greedy(lm_.prompt, tokens), [&](const v1::GenerateChunk&) {
      arrivals.push_back(Clock::now());
      if (arrivals.size() == 8) {
        long_request = std::thread([&] {
          sent_long = Clock::now();
          long_reply = clients_[1]->Generate(Greedy(lm_.long_prompt, 1), [&](const v1::GenerateChunk& chunk) {
            if (long_first == Clock::time_point{} && chunk.tokens_size() > 0) long_first = Clock::now();
          });
        });
      }
    });
    if (long_request.joinable()) long_request.join();
    if (!running.ok()) return running.status();
    if (!long_reply.ok()) return long_reply.status();
    if (long_first == Clock::time_point{} || long_first > arrivals.back()) {
      return Error(Code::kInternal, "the stream ended before the long prompt was through");
    }
    // The median of the stream's gaps outside the prefill: those before it and the 64 just after
    // it, at positions near the ones the gaps during it were at (a decode step reads more of the
    // cache the further it goes: the stream's later gaps would make any ratio look better).
    constexpr size_t kAfter = 64;
    std::vector<double> outside, during;
    size_t after = 0;
    for (size_t i = 1; i < arrivals.size(); i++) {
      const double gap = std::chrono::duration<double, std::milli>(arrivals[i] - arrivals[i - 1]).count();
      if (arrivals[i] > sent_long && arrivals[i - 1] < long_first) during.push_back(gap);
      else if (arrivals[i] <= sent_long || after++ < kAfter) outside.push_back(gap);
    }
    Latencies l;
    l.median_ms = Median(outside);
    std::sort(during.begin(), during.end());
    l.during = during.size();
    l.during_max_ms = during.empty() ? 0 : during.back();
    l.during_p99_ms = during.empty() ? 0 : during[std::min(during.size() - 1, (during.size() * 99 + 99) / 100 - 1)];
    l.prefill_ms = std::chrono::duration<double, std::milli>(long_first - sent_long).count();
    l.long_tokens = long_reply->prompt_tokens();
    return l;
  }

  // The KV cache as the daemon counts it (most of the model's workspace), as its engine reported it.
  Status ReadKvCache() {
    Result<v1::ModelsReply> models = clients_[0]->Models();
    if (!models.ok()) return models.status();
    for (const v1::ModelInfo& m : models->models()) {
      if (m.name() != "lm") continue;
      kv_cache_tokens_ = m.kv_cache_tokens();
      kv_cache_bytes_ = m.kv_cache_tokens() * m.kv_bytes_per_token();
    }
    return OkStatus();
  }

  void Print(const Rates& alone, const Rates& together, const Latencies& l) {
    const double ratio = together.end_to_end / alone.end_to_end;
    const double decoding_ratio = alone.decoding > 0 ? together.decoding / alone.decoding : 0;
    const double itl = l.during_p99_ms / l.median_ms;
    if (options_.json) {
      std::printf("{\"mode\": \"stream-generate\", \"model_mib\": %u, \"layers\": %u, \"streams\": %u, \"tokens\": %u, "
                  "\"one_stream_tokens_per_s\": %.2f, \"streams_tokens_per_s\": %.2f, \"streams_vs_one\": %.3f, "
                  "\"one_stream_decode_tokens_per_s\": %.2f, \"streams_decode_tokens_per_s\": %.2f, "
                  "\"streams_decode_vs_one\": %.3f, "
                  "\"long_prompt_tokens\": %u, \"long_prefill_ms\": %.1f, \"itl_median_ms\": %.3f, "
                  "\"itl_during_prefill_p99_ms\": %.3f, \"itl_during_prefill_max_ms\": %.3f, "
                  "\"itl_p99_vs_median\": %.3f, \"kv_cache_tokens\": %llu, \"kv_cache_bytes\": %llu}\n",
                  options_.model_mib, lm_.layers, options_.streams, options_.tokens, alone.end_to_end,
                  together.end_to_end, ratio, alone.decoding, together.decoding, decoding_ratio, l.long_tokens,
                  l.prefill_ms, l.median_ms, l.during_p99_ms, l.during_max_ms, itl,
                  static_cast<unsigned long long>(kv_cache_tokens_), static_cast<unsigned long long>(kv_cache_bytes_));
      return;
    }
    std::printf("warmpool-bench --generate --streams %u: a %u MiB bf16 model (%u layers), [[models]] parallel = %u, "
                "%u greedy tokens per stream, medians of %u rounds, prefill stretch %s\n",
                options_.streams, options_.model_mib, lm_.layers, std::max(options_.streams, 2u), options_.tokens,
                options_.rounds,
                options_.prefill_stretch != 0 ? fmt::format("{}", options_.prefill_stretch).c_str() : "2 (the default)");
    std::printf("  decoding: one stream           %8.2f tokens/s\n", alone.decoding);
    std::printf("            %2u streams at once   %8.2f tokens/s  %.2fx one (goal >= 5x with 8)\n", options_.streams,
                together.decoding, decoding_ratio);
    std::printf("  first send to last token, prefills included: one %.2f, %u at once %.2f tokens/s: %.2fx\n",
                alone.end_to_end, options_.streams, together.end_to_end, ratio);
    std::printf("  beside a %u-token prompt (prefilled in %.0f ms): inter-token p99 %.2f ms (max %.2f, %zu gaps) "
                "vs median %.2f ms: %.2fx (goal <= 3x)\n",
                l.long_tokens, l.prefill_ms, l.during_p99_ms, l.during_max_ms, l.during, l.median_ms, itl);
    std::printf("  KV cache: %llu positions (%.1f MiB), shared by the streams\n",
                static_cast<unsigned long long>(kv_cache_tokens_), kv_cache_bytes_ / 1048576.0);
  }

  StreamGenerateOptions options_;
  BenchRun& run_;
  LanguageModel lm_;
  std::vector<std::unique_ptr<client::Client>> clients_;
  std::atomic<uint32_t> asked_{0};
  uint64_t kv_cache_tokens_ = 0;
  uint64_t kv_cache_bytes_ = 0;
};

}  // namespace

int RunStreamGenerate(const StreamGenerateOptions& options) {
  return BenchRun::Main("--generate --streams", [&](BenchRun& run) { return StreamGenerate(options, run).Run(); });
}

}  // namespace warmpool::bench
