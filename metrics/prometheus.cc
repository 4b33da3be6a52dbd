#include "metrics/prometheus.h"

#include <fmt/format.h>

#include <array>
#include <optional>

#include "common/status.h"
#include "shm/model_index.h"
#include "shm/seqlock.h"

namespace warmpool::metrics {

namespace {

constexpr std::array<const char*, static_cast<size_t>(shm::RequestKind::kCount)> kKinds = {
    "infer", "load", "unload", "pin", "register", "generate", "embed"};
constexpr std::array<const char*, static_cast<size_t>(shm::LoadSource::kCount)> kSources = {
    "file", "attach", "unpark"};
constexpr std::array<const char*, static_cast<size_t>(shm::ReleaseReason::kCount)> kReasons = {
    "budget", "capacity", "keep_alive", "single_active", "explicit", "reload", "failure"};
constexpr std::array<const char*, static_cast<size_t>(shm::RestartReason::kCount)> kRestartReasons = {
    "crashed", "killed"};
constexpr std::array<shm::ModelState, 6> kStates = {
    shm::ModelState::kRegistered, shm::ModelState::kLoading, shm::ModelState::kReady,
    shm::ModelState::kParked,     shm::ModelState::kFailed,  shm::ModelState::kUnloading};

// A number as Prometheus reads it: integers exactly, the rest with enough digits.
std::string Number(double v) {
  // Range first: casting a double outside int64_t's range is undefined.
  if (v < 9e15 && v > -9e15 && v == static_cast<double>(static_cast<int64_t>(v))) {
    return fmt::format("{}", static_cast<int64_t>(v));
  }
  return fmt::format("{}", v);
}

class Writer {
 public:
  // HELP and TYPE once per family, before its first sample.
  void Family(std::string_view name, std::string_view type, std::string_view help) {
    fmt::format_to(std::back_inserter(out_), "# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }
  void Sample(std::string_view name, std::string_view labels, double value) {
    if (labels.empty()) fmt::format_to(std::back_inserter(out_), "{} {}\n", name, Number(value));
    else fmt::format_to(std::back_inserter(out_), "{}{{{}}} {}\n", name, labels, Number(value));
  }
  void Histogram(std::string_view name, const std::string& labels, const shm::Histogram& h) {
    const std::string sep = labels.empty() ? "" : ",";
    uint64_t cumulative = 0;
    for (uint32_t b = 0; b < shm::kHistogramBuckets; b++) {
      cumulative += h.buckets[b];
      std::string le = b + 1 == shm::kHistogramBuckets ? "+Inf" : Number(shm::kBucketBoundsSeconds[b]);
      Sample(fmt::format("{}_bucket", name), fmt::format("{}{}le=\"{}\"", labels, sep, le),
             static_cast<double>(cumulative));
    }
    Sample(fmt::format("{}_sum", name), labels, static_cast<double>(h.sum_ns) / 1e9);
    // The count is the +Inf bucket's: a reader may have caught the count ahead of the buckets.
    Sample(fmt::format("{}_count", name), labels, static_cast<double>(cumulative));
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

struct ModelView {
  std::string label;  // model="name"
  shm::ModelRecord record;
  const shm::ModelStats* stats;
};

}  // namespace

std::string EscapeLabel(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string RenderPrometheus(const shm::SegmentView& view, const BuildInfo& build) {
  Writer w;
  const shm::SegmentHeader& header = view.header();
  const shm::PoolStats& pool = view.pool_stats();

  std::vector<ModelView> models;
  for (uint32_t i = 0; i < view.max_models(); i++) {
    std::optional<shm::ModelRecord> r = shm::SeqRead(view.model(i), 1 << 12);
    if (!r || static_cast<shm::ModelState>(r->state) == shm::ModelState::kEmpty) continue;
    r->name[sizeof(r->name) - 1] = '\0';
    models.push_back({fmt::format("model=\"{}\"", EscapeLabel(r->name)), *r, &view.model_stats(i)});
  }

  w.Family("warmpool_build_info", "gauge", "Always 1; the labels say which warmpoold serves.");
  w.Sample("warmpool_build_info",
           fmt::format("version=\"{}\",backend=\"{}\",instance=\"{}\"", EscapeLabel(build.version),
                       EscapeLabel(build.backend), EscapeLabel(build.instance)),
           1);
  w.Family("warmpool_start_time_seconds", "gauge", "When warmpoold started, in unix seconds.");
  w.Sample("warmpool_start_time_seconds", "", static_cast<double>(shm::StatLoad(pool.started_unix_ns) / 1'000'000'000));

  w.Family("warmpool_model_requests_total", "counter",
           "Requests naming a registered model, by what they asked and the code they were answered with.");
  for (const ModelView& m : models) {
    for (uint32_t k = 0; k < kKinds.size(); k++) {
      for (uint32_t c = 0; c < shm::kCodes; c++) {
        uint64_t n = shm::StatLoad(m.stats->requests[k][c]);
        // Every kind's OK series always, the rest once they happened: fewer series, no gaps in rates.
        if (n == 0 && c != 0) continue;
        w.Sample("warmpool_model_requests_total",
                 fmt::format("{},request=\"{}\",code=\"{}\"", m.label, kKinds[k], CodeName(static_cast<Code>(c))),
                 static_cast<double>(n));
      }
    }
  }
  struct HistogramFamily {
    const char* name;
    const char* help;
    const shm::Histogram shm::ModelStats::*field;
  };
  for (const HistogramFamily& f : {
           HistogramFamily{"warmpool_model_inference_duration_seconds",
                           "Inference requests from receipt to reply, as the daemon saw them.",
                           &shm::ModelStats::infer_seconds},
           HistogramFamily{"warmpool_model_queue_wait_seconds",
                           "Inference requests from receipt to dispatch to a worker (millisecond clock).",
                           &shm::ModelStats::queue_seconds},
           HistogramFamily{"warmpool_model_load_duration_seconds",
                           "Loads from the file and attaches of shared weights, sent to ready.",
                           &shm::ModelStats::load_seconds},
           HistogramFamily{"warmpool_model_unpark_duration_seconds",
                           "Unparks (a parked host copy back onto its device), sent to ready.",
                           &shm::ModelStats::unpark_seconds},
           HistogramFamily{"warmpool_model_time_to_first_token_seconds",
                           "Generations from receipt to their first token (vLLM: time_to_first_token_seconds).",
                           &shm::ModelStats::first_token_seconds},
           HistogramFamily{"warmpool_model_time_per_output_token_seconds",
                           "Each generation's mean time per token after its first (vLLM: "
                           "request_time_per_output_token_seconds).",
                           &shm::ModelStats::time_per_output_token_seconds}}) {
    w.Family(f.name, "histogram", f.help);
    for (const ModelView& m : models) w.Histogram(f.name, m.label, shm::LoadHistogram(m.stats->*f.field));
  }
  w.Family("warmpool_model_loads_total", "counter",
           "Loads that succeeded, by where the weights came from.");
  for (const ModelView& m : models) {
    for (uint32_t s = 0; s < kSources.size(); s++) {
      w.Sample("warmpool_model_loads_total", fmt::format("{},source=\"{}\"", m.label, kSources[s]),
               static_cast<double>(shm::StatLoad(m.stats->loads[s])));
    }
  }
  w.Family("warmpool_model_releases_total", "counter",
           "Resident models let go, by reason (budget, capacity and single_active are evictions).");
  for (const ModelView& m : models) {
    for (uint32_t r = 0; r < kReasons.size(); r++) {
      w.Sample("warmpool_model_releases_total", fmt::format("{},reason=\"{}\"", m.label, kReasons[r]),
               static_cast<double>(shm::StatLoad(m.stats->releases[r])));
    }
  }
  w.Family("warmpool_model_crashes_total", "counter", "Worker deaths charged to the model.");
  for (const ModelView& m : models) {
    w.Sample("warmpool_model_crashes_total", m.label,
             static_cast<double>(shm::StatLoad(m.stats->crashes_charged)));
  }
  // Language models' serving metrics, as the names vLLM gives them say (docs/metrics.md maps them
  // for routers such as the Gateway API Inference Extension's endpoint picker).
  struct Counter {
    const char* name;
    const char* help;
    const uint64_t shm::ModelStats::*field;
  };
  for (const Counter& c : {Counter{"warmpool_model_prompt_tokens_total", "Prompt tokens of generations that ended "
                                   "(vLLM: prompt_tokens_total).", &shm::ModelStats::prompt_tokens},
                           Counter{"warmpool_model_prompt_tokens_cached_total", "Of the prompt tokens, those "
                                   "found in the model's prefix cache, not computed again (vLLM: "
                                   "prefix_cache_hits_total).", &shm::ModelStats::prompt_tokens_cached},
                           Counter{"warmpool_model_generation_tokens_total", "Tokens generated (vLLM: "
                                   "generation_tokens_total).", &shm::ModelStats::generation_tokens},
                           Counter{"warmpool_model_generations_cancelled_total", "Generations stopped because their "
                                   "client left.", &shm::ModelStats::generations_cancelled},
                           Counter{"warmpool_model_kv_cache_waits_total", "Generations a replica's KV cache had no "
                                   "room for beside those it ran (kv_cache_tokens), sent back to wait for it.",
                                   &shm::ModelStats::kv_cache_waits},
                           Counter{"warmpool_model_kv_cache_preemptions_total", "Of those, generations preempted "
                                   "mid-way for others' room, to go on later after the tokens sent.",
                                   &shm::ModelStats::kv_cache_preemptions}}) {
    w.Family(c.name, "counter", c.help);
    for (const ModelView& m : models) w.Sample(c.name, m.label, static_cast<double>(shm::StatLoad(m.stats->*c.field)));
  }
  w.Family("warmpool_model_requests_running", "gauge",
           "Generations and embeddings running on workers (vLLM: num_requests_running).");
  for (const ModelView& m : models) {
    w.Sample("warmpool_model_requests_running", m.label, static_cast<double>(shm::StatLoad(m.stats->sequences_running)));
  }
  w.Family("warmpool_model_requests_waiting", "gauge",
           "Requests waiting for the model: its load, room, or a worker (vLLM: num_requests_waiting).");
  for (const ModelView& m : models) {
    w.Sample("warmpool_model_requests_waiting", m.label, static_cast<double>(shm::StatLoad(m.stats->requests_waiting)));
  }
  w.Family("warmpool_model_kv_cache_usage_ratio", "gauge",
           "Of the KV cache blocks its serving replicas have, the share their sequences hold, 0 to 1; blocks kept "
           "only for the prefix cache are free (vLLM: kv_cache_usage_perc). Engines that keep no cache in blocks: "
           "the share of their sequences running.");
  for (const ModelView& m : models) {
    const uint64_t blocks = shm::StatLoad(m.stats->kv_blocks);
    const uint64_t blocks_held = shm::StatLoad(m.stats->kv_blocks_held);
    const uint64_t held = shm::StatLoad(m.stats->sequences_held);
    const uint64_t running = shm::StatLoad(m.stats->generations_running);  // an embedding holds no sequence
    const double ratio = blocks > 0  ? static_cast<double>(std::min(blocks_held, blocks)) / static_cast<double>(blocks)
                         : held == 0 ? 0.0
                                     : static_cast<double>(std::min(running, held)) / static_cast<double>(held);
    w.Sample("warmpool_model_kv_cache_usage_ratio", m.label, ratio);
  }
  w.Family("warmpool_model_state", "gauge", "1 for the state the model is in, 0 for the others.");
  for (const ModelView& m : models) {
    for (shm::ModelState s : kStates) {
      w.Sample("warmpool_model_state", fmt::format("{},state=\"{}\"", m.label, shm::ModelStateName(s)),
               m.record.state == static_cast<uint32_t>(s) ? 1 : 0);
    }
  }
  w.Family("warmpool_model_weight_bytes", "gauge", "Bytes of the model's weights (loaded or not).");
  for (const ModelView& m : models) {
    w.Sample("warmpool_model_weight_bytes", m.label, static_cast<double>(m.record.weight_bytes));
  }
  w.Family("warmpool_model_inflight_requests", "gauge", "Requests of the model running on workers.");
  for (const ModelView& m : models) {
    w.Sample("warmpool_model_inflight_requests", m.label, m.record.inflight);
  }

  std::optional<shm::SegmentHeader> h = shm::SeqRead(header, 1 << 12);
  const shm::SegmentHeader& hh = h ? *h : header;
  w.Family("warmpool_device_used_bytes", "gauge", "Device memory accounted to resident models.");
  for (uint32_t d = 0; d < hh.device_count; d++) {
    w.Sample("warmpool_device_used_bytes", fmt::format("device=\"{}\"", d),
             static_cast<double>(hh.device_used_bytes[d]));
  }
  w.Family("warmpool_device_budget_bytes", "gauge", "The device's memory budget (0: unlimited).");
  for (uint32_t d = 0; d < hh.device_count; d++) {
    w.Sample("warmpool_device_budget_bytes", fmt::format("device=\"{}\"", d),
             static_cast<double>(hh.device_budget_bytes[d]));
  }
  w.Family("warmpool_parked_bytes", "gauge", "Host memory held by parked copies.");
  w.Sample("warmpool_parked_bytes", "", static_cast<double>(hh.park_used_bytes));
  w.Family("warmpool_park_budget_bytes", "gauge", "The park budget (0: parking disabled).");
  w.Sample("warmpool_park_budget_bytes", "", static_cast<double>(hh.park_budget_bytes));

  uint32_t up = 0, total = 0;
  for (uint32_t s = 0; s < view.max_workers(); s++) {
    std::optional<shm::WorkerRecord> r = shm::SeqRead(view.worker(s), 1 << 12);
    if (!r || r->state == static_cast<uint32_t>(shm::WorkerState::kEmpty)) continue;
    total++;
    auto state = static_cast<shm::WorkerState>(r->state);
    up += state == shm::WorkerState::kIdle || state == shm::WorkerState::kBusy;
  }
  w.Family("warmpool_workers", "gauge", "Worker slots in use.");
  w.Sample("warmpool_workers", "", total);
  w.Family("warmpool_workers_up", "gauge", "Workers running and ready for jobs.");
  w.Sample("warmpool_workers_up", "", up);
  w.Family("warmpool_worker_restarts_total", "counter",
           "Worker processes started again, by why the last one ended.");
  for (uint32_t r = 0; r < kRestartReasons.size(); r++) {
    w.Sample("warmpool_worker_restarts_total", fmt::format("reason=\"{}\"", kRestartReasons[r]),
             static_cast<double>(shm::StatLoad(pool.restarts[r])));
  }
  w.Family("warmpool_inflight_requests", "gauge", "Inference requests running on workers.");
  w.Sample("warmpool_inflight_requests", "", static_cast<double>(shm::StatLoad(pool.inflight)));
  w.Family("warmpool_queued_requests", "gauge",
           "Requests waiting in the daemon: for a load, for room, or for a worker.");
  w.Sample("warmpool_queued_requests", "", static_cast<double>(shm::StatLoad(pool.queued)));
  return w.Take();
}

}  // namespace warmpool::metrics
