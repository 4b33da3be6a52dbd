// How deeply a JSON text nests, counted on its bytes before any parser sees it. nlohmann's
// parser keeps its own stack, but writing a document back out (dump) and copying it recurse once
// per level: a text of a hundred thousand brackets, small enough for any body limit, overflows the
// stack. Every JSON text from a client or a model is measured with this first.
#pragma once

#include <string_view>

namespace warmpool {

// The deepest nesting of brackets outside strings, counting up to `limit` + 1 (where it stops).
int JsonNestingDepth(std::string_view text, int limit);

}  // namespace warmpool
