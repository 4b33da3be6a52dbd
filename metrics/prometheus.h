// `GET /metrics`: the pool in Prometheus's text exposition format (version 0.0.4), read from the
// shared-memory segment alone (records under their seqlocks, stats words by relaxed loads), so the
// same text could be produced by any process that maps the segment. Names follow Prometheus's
// conventions: base units (bytes, seconds), `_total` counters, `_seconds` histograms, one
// `warmpool_` prefix, labels for the model, the device, the reason.
#pragma once

#include <string>

#include "shm/segment.h"

namespace warmpool::metrics {

struct BuildInfo {
  std::string version;
  std::string backend;   // "host" or "cuda"
  std::string instance;
};

std::string RenderPrometheus(const shm::SegmentView& view, const BuildInfo& build);

// Prometheus's label value escaping: backslash, double quote and newline.
std::string EscapeLabel(std::string_view value);

}  // namespace warmpool::metrics
