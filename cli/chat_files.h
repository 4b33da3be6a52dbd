// The files `warmpool generate --tools FILE --messages FILE` reads: the tools a chat offers the
// model and a conversation to carry on, in OpenAI's shapes, so that what `--json` printed (a
// reply's tool_calls) can go back in as an assistant's turn.
#pragma once

#include <string>

#include "common/status.h"
#include "ipc/warmpool.pb.h"

namespace warmpool::cli {

// A JSON array of tools, each an object ({"type": "function", "function": {"name": ...}}), into
// request.tools, one JSON text each (the daemon checks what they say). INVALID_ARGUMENT, naming
// the file, when it cannot be read, is not JSON or not an array of objects.
Status ReadTools(const std::string& path, v1::GenerateRequest& request);

// A JSON array of messages into request.messages: each an object with a string "role" and
// optionally "content" (a string), "tool_calls" (an assistant's: {"id", "name", "arguments"} as
// --json prints them, or OpenAI's {"id", "function": {"name", "arguments"}}, the arguments an object
// or its JSON text), "tool_call_id" and "name" (a tool's answer). INVALID_ARGUMENT, naming the file
// and the message, for anything else.
Status ReadMessages(const std::string& path, v1::GenerateRequest& request);

}  // namespace warmpool::cli
