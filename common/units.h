#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace warmpool {

// Parses "1073741824", "512MiB", "2GiB", "64KiB", "1.5GiB", "100MB" (decimal units are powers of 10).
Result<uint64_t> ParseSize(std::string_view text);
// 1536 -> "1.5 KiB"
std::string FormatBytes(uint64_t bytes);
// "250ms", "30s", "5m", "1h", "90" (seconds), "-1" (forever: -1) -> milliseconds.
Result<int64_t> ParseDurationMs(std::string_view text);

}  // namespace warmpool
