// Text helpers every test uses, in one place: sources compiled together in a unity build must not
// each define their own.
#pragma once

#include <string_view>

namespace warmpool::testing {

inline bool Contains(std::string_view text, std::string_view part) { return text.find(part) != std::string_view::npos; }

}  // namespace warmpool::testing
