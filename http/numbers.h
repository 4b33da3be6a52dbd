// Numbers a client writes in a header or a query parameter. strtoul would take " 12", "+12",
// "12x" (as 12), "-5" (as 2^64 - 5) and "" (as 0), and a request that said something else would
// then be served as if it had said that: every such number goes through this one parser instead,
// which takes only decimal digits, all of the text, within the range the parameter allows.
#pragma once

#include <cstdint>
#include <string_view>

#include "common/status.h"

namespace warmpool::http {

// INVALID_ARGUMENT naming `name` (e.g. "query parameter deadline_ms") and the accepted range
// when `text` is not an integer in [min, max].
Result<uint64_t> ParseDecimal(std::string_view text, std::string_view name, uint64_t min,
                              uint64_t max);

}  // namespace warmpool::http
