// `warmpool top`'s memory between refreshes: it compares each sample with the one before and
// turns counter deltas into rates (requests per second, error share, latency quantiles) and into
// events (loads by source, evictions and releases by reason, crashes, worker deaths), keeping the
// last few events. Pure: samples in, frames out; no clock, no I/O.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "top/top_sample.h"

namespace warmpool::top {

// Over the interval since the previous sample; absent when there is nothing to compare with (the
// first sample, a record reset for another model, the socket source) or nothing to measure.
struct ModelRates {
  std::optional<double> requests_per_second;
  std::optional<double> error_ratio;  // of the inference requests answered, 0..1
  std::optional<double> p50_seconds;
  std::optional<double> p99_seconds;
};

struct ModelRow {
  ModelSample model;
  ModelRates rates;
};

struct Event {
  uint64_t unix_ns = 0;  // when top noticed it (the sample's time), not when it happened
  std::string text;
};

struct Frame {
  PoolSample pool;
  std::vector<ModelRow> models;  // every model but the idle registered ones, in display order
  uint32_t idle_registered = 0;  // registered, not loaded, no requests in the interval
  std::vector<Event> events;     // newest first
  double interval_seconds = 0;   // since the previous sample; 0 for the first
};

ModelRates RatesBetween(const shm::ModelStats& before, const shm::ModelStats& after,
                        double seconds);
// Ready before loading before unloading before parked before failed before registered; busier
// (requests per second, then in-flight) first within a state; then by name.
bool ShownBefore(const ModelRow& a, const ModelRow& b);

class Tracker {
 public:
  explicit Tracker(size_t events_kept = 8) : events_kept_(events_kept) {}

  Frame Next(PoolSample sample);
  // A different daemon from now on (a restart): its counters do not continue the old one's.
  void Forget() { previous_.reset(); }
  // An event of top's own (the daemon went away, came back).
  void Note(uint64_t unix_ns, std::string text);
  std::vector<Event> Events() const { return {events_.begin(), events_.end()}; }

 private:
  void NoteModelChanges(const PoolSample& now);
  void NoteWorkerChanges(const PoolSample& now);

  std::optional<PoolSample> previous_;
  std::deque<Event> events_;  // newest first
  size_t events_kept_;
};

}  // namespace warmpool::top
