#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench/sharing_result.h"
#include "bench/skeleton.h"

namespace warmpool::bench {

using namespace probes;  // NOLINT: MiB

void ReportSharing(const SharingOptions& options, const std::vector<SizeResult>& results, uint64_t budget,
                 uint64_t park_budget) {
  if (options.json) {
    std::string sizes;
    for (const SizeResult& r : results) {
      if (!sizes.empty()) sizes += ", ";
      std::string attach;
      for (uint32_t k = 0; k + 1 < kSharingWorkers; ++k) {
        if (!attach.empty()) attach += ", ";
        attach += fmt::format("{{\"from\": {}, \"to\": {}, \"until_ps_shows\": {}, \"reply\": {}}}",
                              k + 1, k + 2, SpreadJson(r.attach[k]), SpreadJson(r.attach_reply[k]));
      }
      std::string unpark = fmt::format(
          "{{\"bytes\": {}, \"unpark\": {}, \"unpark_reported\": {}, \"park\": {}, "
          "\"memcpy_fresh\": {}, \"memcpy_fresh_memfd\": {}, \"memcpy_reused\": {}, "
          "\"unpark_gb_per_s\": {:.3f}, \"memcpy_fresh_gb_per_s\": {:.3f}, "
          "\"memcpy_fresh_memfd_gb_per_s\": {:.3f}, \"memcpy_reused_gb_per_s\": {:.3f}, "
          "\"ratio_vs_fresh\": {:.3f}, \"ratio_vs_fresh_memfd\": {:.3f}, "
          "\"ratio_vs_reused\": {:.3f}, \"unparking_log_lines\": {}, \"target\": {}, "
          "\"target_met\": {}}}",
          r.file.weight_bytes, SpreadJson(r.unpark), SpreadJson(r.unpark_reported),
          SpreadJson(r.park), SpreadJson(r.memcpy_fresh), SpreadJson(r.memcpy_memfd),
          SpreadJson(r.memcpy_reused), r.unpark_gbps, r.memcpy_fresh_gbps, r.memcpy_memfd_gbps,
          r.memcpy_reused_gbps, r.unpark_ratio_fresh, r.unpark_ratio_memfd,
          r.unpark_ratio_reused, r.unpark_log_lines, kTargetUnparkRatio,
          r.unpark_ratio_reused >= kTargetUnparkRatio);
      std::string first = fmt::format(
          "{{\"after_load\": {}, \"steady_after_load\": {}, \"after_attach\": {}, "
          "\"steady_after_attach\": {}, \"ratio_after_load\": {:.3f}, \"ratio_after_attach\": {:.3f}, "
          "\"target\": {}, \"target_met\": {}}}",
          SpreadJson(r.first_after_load), SpreadJson(r.steady_after_load), SpreadJson(r.first_after_attach),
          SpreadJson(r.steady_after_attach), r.first_load_ratio, r.first_attach_ratio, kTargetFirstRatio,
          r.first_load_ratio <= kTargetFirstRatio && r.first_attach_ratio <= kTargetFirstRatio);
      std::string workers;
      for (const WorkerMemory& m : r.workers) {
        if (!workers.empty()) workers += ", ";
        workers += fmt::format(
            "{{\"slot\": {}, \"pid\": {}, \"pss_bytes\": {}, \"rss_bytes\": {}, "
            "\"pss_shmem_bytes\": {}, \"pss_bytes_before_infer\": {}, "
            "\"rss_bytes_before_infer\": {}}}",
            m.slot, m.pid, m.after.pss_bytes, m.after.rss_bytes, m.after.pss_shmem_bytes,
            m.before.pss_bytes, m.before.rss_bytes);
      }
      sizes += fmt::format(
          "{{\"size_mib\": {}, \"model\": \"{}\", \"layers\": \"{},{},{}\", \"file_bytes\": {}, "
          "\"weight_bytes\": {}, \"workspace_bytes_per_replica\": {}, \"iterations\": {}, "
          "\"cold_load\": {{\"cat\": {}, \"cat_empty_file\": {}, \"load\": {}, "
          "\"load_reported\": {}, \"cat_gb_per_s\": {:.3f}, \"load_gb_per_s\": {:.3f}, "
          "\"ratio\": {:.3f}, \"cat_read_only_ms\": {:.4f}, \"ratio_vs_read_only\": {:.3f}, "
          "\"target\": {}, \"target_met\": {}}}, "
          "\"attach\": {{\"steps\": [{}], \"all\": {}, \"polls\": {}, \"poll_sleep_us\": {}, "
          "\"poll_round_trip\": {}, \"target_ms\": {}, \"target_met\": {}}}, "
          "\"pss\": {{\"replicas\": {}, \"touch_rounds\": {}, \"requests_per_round\": {}, "
          "\"all_touched\": {}, \"workers\": [{}], \"pss_sum_bytes\": {}, \"rss_sum_bytes\": {}, "
          "\"pss_sum_before_infer_bytes\": {}, \"rss_sum_before_infer_bytes\": {}, "
          "\"pss_shmem_sum_bytes\": {}, \"pss_sum_idle_workers_bytes\": {}, "
          "\"supervisor_pss_bytes\": {}, \"supervisor_rss_bytes\": {}, \"pss_ratio\": {:.3f}, "
          "\"rss_ratio\": {:.3f}, \"pss_shmem_ratio\": {:.3f}, \"pss_above_idle_ratio\": {:.3f}, "
          "\"target\": {}, \"target_met\": {}}}, \"unpark\": {}, \"first_request\": {}}}",
          r.size_mib, r.model, r.file.in_features, r.file.hidden, r.file.out_features,
          r.file_bytes, r.file.weight_bytes, r.workspace_bytes, r.iterations, SpreadJson(r.cat),
          SpreadJson(r.cat_empty), SpreadJson(r.load), SpreadJson(r.load_reported), r.cat_gbps,
          r.load_gbps, r.load_ratio, r.cat_read_ms, r.load_ratio_read, kTargetLoadRatio, r.load_ratio >= kTargetLoadRatio, attach,
          SpreadJson(r.attach_all), r.polls, options.poll_us, SpreadJson(r.poll_rtt),
          kTargetAttachMs, r.attach_all.median_ms < kTargetAttachMs, kSharingWorkers, r.touch_rounds,
          kPipelined, r.all_touched, workers, r.pss_sum, r.rss_sum, r.pss_before_sum,
          r.rss_before_sum, r.pss_shmem_sum, r.pss_idle_sum, r.supervisor.pss_bytes,
          r.supervisor.rss_bytes, r.pss_ratio, r.rss_ratio, r.pss_shmem_ratio,
          r.pss_above_idle_ratio, kTargetPssRatio, r.pss_ratio <= kTargetPssRatio, unpark, first);
    }
    std::printf("%s\n",
                fmt::format("{{\"mode\": \"sharing\", \"backend\": \"{}\", \"workers\": {}, "
                            "\"budgetbytes\": {}, \"park_budgetbytes\": {}, "
                            "\"attach_measured_by\": \"ps polling\", \"sizes\": [{}]}}",
                            JsonEscape(options.backend), kSharingWorkers, budget, park_budget, sizes)
                    .c_str());
    return;
  }

  std::string out = fmt::format(
      "warmpool-bench --sharing: dense f32 models (random weights) served by {} workers, backend "
      "{}, [pool] budget {:.1f} GiB, park_budget {:.1f} GiB; {} iteration(s) per size\n",
      kSharingWorkers, options.backend, budget / 1073741824.0, park_budget / 1073741824.0,
      options.iterations);
  for (const SizeResult& r : results) {
    out += fmt::format(
        "\n=== {} MiB: \"{}\" (dense {},{},{}), file {} bytes ({:.1f} MiB), weights {} bytes, "
        "workspace {:.1f} MiB per replica ===\n",
        r.size_mib, r.model, r.file.in_features, r.file.hidden, r.file.out_features,
        r.file_bytes, MiB(r.file_bytes), r.file.weight_bytes, MiB(r.workspace_bytes));
    out += fmt::format(
        "1. cold load from the page cache vs cat (interleaved, {} each)\n"
        "   {:<44} {:>10} {:>10} {:>10}\n",
        r.iterations, "", "median ms", "p90 ms", "GB/s");
    out += fmt::format("   {:<44} {:>10.3f} {:>10.3f} {:>10.2f}\n",
                       "cat FILE > /dev/null (fork+exec /bin/cat)", r.cat.median_ms,
                       r.cat.p90_ms, r.cat_gbps);
    out += fmt::format("   {:<44} {:>10.3f} {:>10.3f} {:>10.2f}\n",
                       "unload, then load (load timed, replicas 1)", r.load.median_ms,
                       r.load.p90_ms, r.load_gbps);
    out += fmt::format(
        "   (cat of an empty file, i.e. fork+exec+wait alone: median {:.3f} ms; daemon-reported "
        "load_ms median {:.0f})\n",
        r.cat_empty.median_ms, r.load_reported.median_ms);
    out += fmt::format(
        "   throughput ratio load/cat {:.2f}x (target >= {}x): {}   [against cat less its "
        "fork+exec ({:.3f} ms, {:.2f} GB/s): {:.2f}x]\n",
        r.load_ratio, kTargetLoadRatio, r.load_ratio >= kTargetLoadRatio ? "met" : "NOT met",
        r.cat_read_ms, r.cat_read_gbps, r.load_ratio_read);

    out += fmt::format(
        "2. replica attach: LoadRequest replicas=N -> ps shows N (ps polled: {} us sleep + one "
        "ps round trip, median {:.1f} us, so ~{:.0f} us granularity; {} polls)\n"
        "   {:<44} {:>10} {:>10} {:>10}\n",
        options.poll_us, r.poll_rtt.median_ms * 1e3,
        options.poll_us + r.poll_rtt.median_ms * 1e3, r.polls, "", "median ms", "p90 ms",
        "reply ms");
    for (uint32_t k = 0; k + 1 < kSharingWorkers; ++k) {
      out += fmt::format("   {:<44} {:>10.3f} {:>10.3f} {:>10.3f}\n",
                         fmt::format("{} -> {} replicas", k + 1, k + 2), r.attach[k].median_ms,
                         r.attach[k].p90_ms, r.attach_reply[k].median_ms);
    }
    out += fmt::format("   {:<44} {:>10.3f} {:>10.3f}\n", "all attaches", r.attach_all.median_ms,
                       r.attach_all.p90_ms);
    out += fmt::format("   attach median {:.3f} ms (target < {} ms): {}\n",
                       r.attach_all.median_ms, kTargetAttachMs,
                       r.attach_all.median_ms < kTargetAttachMs ? "met" : "NOT met");

    out += fmt::format(
        "3. memory with {} replicas, after {} round(s) of {} pipelined 1-row inferences ({})\n"
        "   {:<8} {:>8} {:>12} {:>12} {:>12} {:>14} {:>14}\n",
        kSharingWorkers, r.touch_rounds, kPipelined,
        r.all_touched ? "every worker's Rss holds the weights: all touched them"
                      : "NOT every worker touched the weights",
        "slot", "pid", "Pss MiB", "Pss_Shmem", "Rss MiB", "Pss MiB before", "Rss MiB before");
    for (const WorkerMemory& m : r.workers) {
      out += fmt::format("   {:<8} {:>8} {:>12.1f} {:>12.1f} {:>12.1f} {:>14.1f} {:>14.1f}\n",
                         m.slot, m.pid, MiB(m.after.pss_bytes), MiB(m.after.pss_shmem_bytes),
                         MiB(m.after.rss_bytes), MiB(m.before.pss_bytes),
                         MiB(m.before.rss_bytes));
    }
    out += fmt::format("   {:<8} {:>8} {:>12.1f} {:>12} {:>12.1f} {:>14.1f} {:>14.1f}\n", "sum",
                       "", MiB(r.pss_sum), "", MiB(r.rss_sum), MiB(r.pss_before_sum),
                       MiB(r.rss_before_sum));
    out += fmt::format(
        "   (\"before\": right after the last attach, before any inference; supervisor, which "
        "holds the memfd: Pss {:.1f} MiB, Rss {:.1f} MiB)\n",
        MiB(r.supervisor.pss_bytes), MiB(r.supervisor.rss_bytes));
    out += fmt::format(
        "   sum of Pss / one copy (file size) {:.3f}x (target <= {}x): {}; sum of Rss {:.2f}x\n"
        "   of which shared (sum of Pss_Shmem: the weights' memfd) {:.3f}x; sum of Pss above the "
        "same workers idle before any model ({:.1f} MiB) {:.3f}x\n",
        r.pss_ratio, kTargetPssRatio, r.pss_ratio <= kTargetPssRatio ? "met" : "NOT met",
        r.rss_ratio, r.pss_shmem_ratio, MiB(r.pss_idle_sum), r.pss_above_idle_ratio);

    out += fmt::format(
        "4. unpark vs memcpy of the weights ({} bytes, {:.1f} MiB; interleaved, {} each; "
        "'unparking \"{}\"' logged {} time(s))\n"
        "   {:<44} {:>10} {:>10} {:>10}\n",
        r.file.weight_bytes, MiB(r.file.weight_bytes), r.iterations, r.model,
        r.unpark_log_lines, "", "median ms", "p90 ms", "GB/s");
    out += fmt::format("   {:<44} {:>10.3f} {:>10.3f} {:>10.2f}\n",
                       "unload --park, then load (load timed)", r.unpark.median_ms,
                       r.unpark.p90_ms, r.unpark_gbps);
    out += fmt::format("   {:<44} {:>10.3f} {:>10.3f} {:>10.2f}\n",
                       "memcpy into a fresh buffer (mmap, no memset)", r.memcpy_fresh.median_ms,
                       r.memcpy_fresh.p90_ms, r.memcpy_fresh_gbps);
    out += fmt::format("   {:<44} {:>10.3f} {:>10.3f} {:>10.2f}\n",
                       "memcpy into a fresh memfd region", r.memcpy_memfd.median_ms,
                       r.memcpy_memfd.p90_ms, r.memcpy_memfd_gbps);
    out += fmt::format("   {:<44} {:>10.3f} {:>10.3f} {:>10.2f}\n",
                       "memcpy into a reused, faulted buffer", r.memcpy_reused.median_ms,
                       r.memcpy_reused.p90_ms, r.memcpy_reused_gbps);
    out += fmt::format(
        "   (the unload --park call itself: median {:.3f} ms; daemon-reported load_ms of the "
        "unpark median {:.0f})\n",
        r.park.median_ms, r.unpark_reported.median_ms);
    out += fmt::format(
        "   throughput ratio unpark/memcpy(reused) {:.2f}x (target >= {}x): {}   [vs fresh buffer "
        "{:.2f}x; vs fresh memfd {:.2f}x]\n",
        r.unpark_ratio_reused, kTargetUnparkRatio,
        r.unpark_ratio_reused >= kTargetUnparkRatio ? "met" : "NOT met", r.unpark_ratio_fresh,
        r.unpark_ratio_memfd);
    out += fmt::format(
        "5. the first request after a switch (unload, load; 1 row) and after a second replica's "
        "attach (2 rows at once, one per replica), against the {} that follow each ({} each)\n"
        "   {:<44} {:>10} {:>10} {:>10} {:>8}\n",
        kSteadyCalls, r.iterations, "", "first ms", "steady ms", "ratio", "target");
    out += fmt::format("   {:<44} {:>10.3f} {:>10.3f} {:>9.2f}x {:>7}x\n", "after a load", r.first_after_load.median_ms,
                       r.steady_after_load.median_ms, r.first_load_ratio, kTargetFirstRatio);
    out += fmt::format("   {:<44} {:>10.3f} {:>10.3f} {:>9.2f}x {:>7}x\n", "after an attach",
                       r.first_after_attach.median_ms, r.steady_after_attach.median_ms, r.first_attach_ratio,
                       kTargetFirstRatio);
  }

  out += fmt::format("\n{:<10} {:>12} {:>14} {:>14} {:>14} {:>14} {:>14} {:>12} {:>12}\n", "size",
                     "load/cat", "attach med ms", "attach p90 ms", "Pss/1 copy",
                     "unpark/fresh", "unpark/reused", "1st/load", "1st/attach");
  for (const SizeResult& r : results) {
    out += fmt::format("{:<10} {:>11.2f}x {:>14.3f} {:>14.3f} {:>13.3f}x {:>13.2f}x {:>13.2f}x {:>11.2f}x {:>11.2f}x\n",
                       fmt::format("{} MiB", r.size_mib), r.load_ratio, r.attach_all.median_ms,
                       r.attach_all.p90_ms, r.pss_ratio, r.unpark_ratio_fresh,
                       r.unpark_ratio_reused, r.first_load_ratio, r.first_attach_ratio);
  }
  out += fmt::format("{:<10} {:>11}x {:>14} {:>14} {:>13}x {:>14} {:>13}x {:>11}x {:>11}x\n", "target",
                     ">= 0.7", "< 1", "", "<= 1.1", "", ">= 0.7", "<= 1.5", "<= 1.5");
  out +=
      "attach time: from sending the LoadRequest to the first ps reply showing the new count "
      "(daemon log stamps have 1 ms resolution, too coarse for a sub-millisecond target)\n"
      "unpark/reused: throughput of a timed load of a parked model (request to reply) against "
      "memcpy of the same bytes into a buffer mapped and faulted before\n"
      "1st/load, 1st/attach: the first request on a model just loaded, and on a replica just "
      "attached, against steady requests\n";
  std::fputs(out.c_str(), stdout);
}

}  // namespace warmpool::bench
