#include "bench/recovery_report.h"

#include <algorithm>
#include <cstdio>
#include <optional>

#include <fmt/format.h>

#include "bench/skeleton.h"

namespace warmpool::bench {
namespace {

// Median of log-derived times (ms after the kill) over the iterations that have them.
std::optional<double> MedianOf(const std::vector<RecoverySample>& samples,
                               std::optional<double> RecoveryLogEvents::*field) {
  std::vector<double> v;
  for (const RecoverySample& s : samples) {
    if ((s.log.*field).has_value()) v.push_back(*(s.log.*field));
  }
  if (v.empty()) return std::nullopt;
  std::sort(v.begin(), v.end());
  return v[(v.size() - 1) / 2];
}

std::string OptMs(std::optional<double> v) {
  return v.has_value() ? fmt::format("{:.0f}", *v) : std::string("n/a");
}
std::string OptJson(std::optional<double> v) {
  return v.has_value() ? fmt::format("{:.1f}", *v) : std::string("null");
}

}  // namespace

void PrintRecoveryReport(const RecoveryOptions& options, const DenseModelFile& model,
                         const RecoveryBaselines& baselines, const std::vector<RecoverySample>& samples) {
  std::vector<uint64_t> a_ns, b_ns;
  uint64_t affected = 0, failed = 0, before = 0, probe_failures = 0, not_busy = 0,
           no_success = 0, markers = 0;
  std::string first_error;
  for (const RecoverySample& s : samples) {
    if (s.affected > 0) a_ns.push_back(s.all_answered_ns);
    else not_busy++;
    if (s.first_success) b_ns.push_back(s.first_success_ns);
    else no_success++;
    affected += s.affected;
    failed += s.failed;
    before += s.answered_before_kill;
    probe_failures += s.probe_failures;
    markers += s.log.markers.value_or(0);
    if (first_error.empty()) first_error = s.first_error;
  }
  Spread a = SpreadOf(a_ns), b = SpreadOf(b_ns);
  double a_ratio = baselines.healthy_k.median_ms > 0 ? a.median_ms / baselines.healthy_k.median_ms : 0;
  double b_bound_ms = kTargetFirstSuccessSlackMs + baselines.probe_infer.median_ms;
  bool a_met = a.count > 0 && a_ratio <= kTargetAllAnsweredRatio;
  bool b_met = b.count > 0 && b.median_ms <= b_bound_ms;
  auto death = MedianOf(samples, &RecoveryLogEvents::death_ms);
  auto reload_start = MedianOf(samples, &RecoveryLogEvents::reload_start_ms);
  auto reload_done = MedianOf(samples, &RecoveryLogEvents::reload_done_ms);
  auto reload_reported = MedianOf(samples, &RecoveryLogEvents::reload_reported_ms);
  auto respawned = MedianOf(samples, &RecoveryLogEvents::respawn_ms);
  uint64_t sent = static_cast<uint64_t>(options.inflight) * samples.size();
  std::string layers =
      fmt::format("{},{},{}", model.in_features, model.hidden, model.out_features);
  double model_mib = model.weight_bytes / 1048576.0;

  if (options.json) {
    std::printf(
        "%s\n",
        fmt::format(
            "{{\"mode\": \"recovery\", \"model\": \"{}\", \"layers\": \"{}\", "
            "\"weight_bytes\": {}, \"workers\": 2, \"replicas\": {}, \"iterations\": {}, \"inflight\": {}, "
            "\"rows\": {}, \"respawn_min_ms\": {}, \"respawn_max_ms\": {}, "
            "\"crash_loop_crashes\": {}, "
            "\"warm_load_ms\": {{\"median\": {:.3f}, \"p90\": {:.3f}}}, "
            "\"warm_load_reported_ms\": {{\"median\": {:.1f}}}, "
            "\"infer_ms\": {{\"rows\": {}, \"median\": {:.3f}, \"p90\": {:.3f}}}, "
            "\"probe_infer_ms\": {{\"rows\": 1, \"median\": {:.3f}}}, "
            "\"healthy_pipelined_ms\": {{\"median\": {:.3f}, \"p90\": {:.3f}}}, "
            "\"all_answered_ms\": {{\"count\": {}, \"median\": {:.3f}, \"p90\": {:.3f}}}, "
            "\"first_success_ms\": {{\"count\": {}, \"median\": {:.3f}, \"p90\": {:.3f}}}, "
            "\"all_answered_ratio\": {:.3f}, \"first_success_bound_ms\": {:.3f}, "
            "\"target_all_answered_ratio\": {}, \"target_first_success_slack_ms\": {}, "
            "\"all_answered_target_met\": {}, \"first_success_target_met\": {}, "
            "\"requests_sent\": {}, \"requests_affected\": {}, \"requests_answered_before_kill\": "
            "{}, \"requests_failed\": {}, \"iterations_not_busy\": {}, "
            "\"probe_failures\": {}, \"iterations_without_success\": {}, "
            "\"inflight_markers_reclaimed\": {}, "
            "\"log_median_ms_after_kill\": {{\"death_handled\": {}, \"reload_started\": {}, "
            "\"reload_done\": {}, \"reload_reported\": {}, \"worker_respawned\": {}}}, "
            "\"first_error\": \"{}\"}}",
            kModel, layers, model.weight_bytes, options.replicas, samples.size(), options.inflight,
            options.rows, kRespawnMinMs, kRespawnMaxMs, kCrashLoopCrashes,
            baselines.warm_load.median_ms, baselines.warm_load.p90_ms, baselines.warm_load_reported.median_ms,
            options.rows, baselines.batch_infer.median_ms, baselines.batch_infer.p90_ms,
            baselines.probe_infer.median_ms,
            baselines.healthy_k.median_ms, baselines.healthy_k.p90_ms,
            a.count, a.median_ms, a.p90_ms, b.count, b.median_ms, b.p90_ms, a_ratio, b_bound_ms,
            kTargetAllAnsweredRatio, kTargetFirstSuccessSlackMs, a_met, b_met, sent, affected,
            before, failed, not_busy, probe_failures, no_success, markers, OptJson(death),
            OptJson(reload_start), OptJson(reload_done), OptJson(reload_reported),
            OptJson(respawned), JsonEscape(first_error))
            .c_str());
    return;
  }
  std::string out = fmt::format(
      "warmpool-bench --recovery: SIGKILL of the worker running \"{}\" (dense {}, relu, "
      "{:.1f} MiB f32, random weights), 2 workers, {} replica(s), backend {}\n"
      "{} iterations; per kill {} pipelined requests of {} rows on the worker, plus 1 new "
      "request (1 row) from a second connection right after the kill\n"
      "daemon config: [recovery] respawn_min_ms = {}, respawn_max_ms = {} (so respawn backoff "
      "does not dominate), crash_loop_crashes = {} (so repeated kills do not mark the model "
      "failed)\n\n",
      kModel, layers, model_mib, options.replicas, options.backend, samples.size(), options.inflight,
      options.rows, kRespawnMinMs, kRespawnMaxMs, kCrashLoopCrashes);
  out += fmt::format(
      "baseline: warm load from the page cache (unload, then load): median {:.2f} ms, p90 "
      "{:.2f} ms (daemon-reported load_ms median {:.0f})\n",
      baselines.warm_load.median_ms, baselines.warm_load.p90_ms, baselines.warm_load_reported.median_ms);
  out += fmt::format(
      "steady state: infer of {} rows median {:.2f} ms, of 1 row median {:.2f} ms\n"
      "baseline of (a): the same {} requests pipelined on the healthy pool, all answered: median "
      "{:.2f} ms, p90 {:.2f} ms\n\n",
      options.rows, baselines.batch_infer.median_ms, baselines.probe_infer.median_ms, options.inflight,
      baselines.healthy_k.median_ms, baselines.healthy_k.p90_ms);
  out += fmt::format("{:<46} {:>10} {:>10}\n", "from SIGKILL", "median ms", "p90 ms");
  out += fmt::format("{:<46} {:>10.2f} {:>10.2f}\n", "(a) all affected requests answered",
                     a.median_ms, a.p90_ms);
  out += fmt::format("{:<46} {:>10.2f} {:>10.2f}\n", "(b) first success of a new request",
                     b.median_ms, b.p90_ms);
  out += fmt::format("{:<46} {:>10.2f} {:>10.2f}\n", "(for scale) warm load from the page cache",
                     baselines.warm_load.median_ms, baselines.warm_load.p90_ms);
  out += fmt::format(
      "\n(a) all affected answered: target within {}x of the healthy pool: {:.2f} / {:.2f} ms = "
      "{:.2f}x, {}\n",
      kTargetAllAnsweredRatio, a.median_ms, baselines.healthy_k.median_ms, a_ratio, a_met ? "met" : "NOT met");
  out += fmt::format(
      "(b) first new success: target within {} ms + its own compute ({:.2f} ms) = {:.2f} ms: "
      "{:.2f} ms, {}\n",
      kTargetFirstSuccessSlackMs, baselines.probe_infer.median_ms, b_bound_ms, b.median_ms,
      b_met ? "met" : "NOT met");
  out += fmt::format(
      "\nrequests: {} sent to the killed worker, {} answered after the kill (affected), {} "
      "before it; {} failed; {} in-flight markers reclaimed in all\n",
      sent, affected, before, failed, markers);
  out += fmt::format(
      "new requests: {} failed before the first success; {} iteration(s) without a success; {} "
      "iteration(s) where the worker had finished everything before the kill\n",
      probe_failures, no_success, not_busy);
  if (!first_error.empty()) out += fmt::format("first error: {}\n", first_error);
  out += fmt::format(
      "\nwhere the time goes (daemon log, 1 ms resolution, median ms after the kill):\n"
      "  death handled by the supervisor   {:>6}\n"
      "  reload started (other worker)     {:>6}\n"
      "  reload done                       {:>6}   (daemon-reported load {} ms)\n"
      "  (a) last affected reply           {:>6.0f}   (re-running up to {} x {} rows: {:.2f} ms "
      "each in steady state)\n"
      "  (b) first new request answered    {:>6.0f}\n"
      "  killed worker respawned           {:>6}\n",
      OptMs(death), OptMs(reload_start), OptMs(reload_done), OptMs(reload_reported),
      a.median_ms, options.inflight, options.rows, baselines.batch_infer.median_ms, b.median_ms,
      OptMs(respawned));
  // The affected replies in the order they came (median over iterations of the n-th): how
  // the retries run, one after another or side by side.
  out += "  affected replies, n-th to come     ";
  for (size_t n = 0; n < options.inflight; ++n) {
    std::vector<uint64_t> nth;
    for (const RecoverySample& s : samples) {
      if (n < s.affected_ns.size()) nth.push_back(s.affected_ns[n]);
    }
    if (nth.empty()) break;
    out += fmt::format(" {:.0f}", SpreadOf(nth).median_ms);
  }
  out += "\n";
  std::fputs(out.c_str(), stdout);
}

}  // namespace warmpool::bench
