// warmpool-bench --regions: large tensors through clients' shared-memory regions. A private
// warmpoold serves the echo engine; one client sends --payload-mib MiB (default 16) per request.
// Paths, interleaved per round, --iterations times each:
//   memcpy     the baseline: the bytes copied into a buffer and out of another once (what any
//              client that has its data elsewhere pays at least)
//   region     the same copies into and out of a registered region, with the request between
//              (the worker reads the input and writes the output in place)
//   in-place   the request alone, the tensors already in the region
//   frames     the same tensor sent in the request frame and returned in the reply
// Reports medians, the spread (min..max) and region/memcpy (target <= 2x). Asserts nothing.
#pragma once

#include <cstdint>
#include <string>

namespace warmpool::bench {

struct RegionsOptions {
  std::string daemon;            // warmpoold binary; empty: next to warmpool-bench
  std::string backend = "host";  // warmpoold --backend
  uint32_t payload_mib = 16;
  uint32_t iterations = 20;
  bool json = false;
};

// Runs the whole mode; returns the process exit status (0, or 1 after printing an error).
int RunRegions(const RegionsOptions& options);

}  // namespace warmpool::bench
