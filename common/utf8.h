// UTF-8 validity for text that reaches clients: protobuf string fields must be valid UTF-8, and a
// reply carrying invalid bytes fails to parse on the other side, for every client of the daemon.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "common/status.h"

namespace warmpool {

// Length of the valid UTF-8 sequence at the start of text (strict: no overlong forms, no
// surrogates, nothing above U+10FFFF), or 0 when it is not one.
size_t Utf8SequenceLength(std::string_view text);
// Whether all of text is valid UTF-8 (as Utf8SequenceLength judges each sequence).
bool IsValidUtf8(std::string_view text);
// Each byte that does not belong to a valid UTF-8 sequence becomes '?'.
std::string ValidUtf8(std::string text);
// The same status with its message made valid UTF-8: for errors that quote what a user gave (a
// path, a file's bytes), on their way to clients, whose protobuf strings must be valid UTF-8.
Status ValidUtf8(Status status);

}  // namespace warmpool
