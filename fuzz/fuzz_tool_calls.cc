// Tool calls read out of a model's text (engines/chat_template/tool_calls.h): whatever the text
// and however it is cut into pieces as it streams, the reader gives what reading it whole gives,
// every call it finds has a name and arguments that are a JSON object, and no byte of text is
// invented (the content is never longer than the text).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "engines/chat_template/tool_calls.h"
#include "fuzz/fuzz_check.h"

using warmpool::chat::ToolCallFormat;
using warmpool::chat::ToolCallReader;
using warmpool::chat::ToolCallText;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  // The first byte picks the format, the second the size of the pieces the rest streams in.
  const ToolCallFormat format = data[0] % 2 == 0 ? ToolCallFormat::kHermes : ToolCallFormat::kLlama3Json;
  const size_t piece = 1 + data[1] % 16;
  const std::string_view text(reinterpret_cast<const char*>(data) + 2, size - 2);
  const ToolCallText whole = warmpool::chat::ReadToolCalls(format, text);
  ToolCallReader reader(format);
  ToolCallText streamed;
  for (size_t at = 0; at < text.size(); at += piece) {
    ToolCallText part = reader.Feed(text.substr(at, piece));
    streamed.content += part.content;
    streamed.calls.insert(streamed.calls.end(), part.calls.begin(), part.calls.end());
  }
  ToolCallText rest = reader.Finish();
  streamed.content += rest.content;
  streamed.calls.insert(streamed.calls.end(), rest.calls.begin(), rest.calls.end());
  FUZZ_CHECK(streamed.content == whole.content);
  FUZZ_CHECK(streamed.calls == whole.calls);
  FUZZ_CHECK(whole.content.size() <= text.size());
  FUZZ_CHECK(reader.saw_calls() == !whole.calls.empty());
  for (const warmpool::chat::ToolCall& call : whole.calls) {
    FUZZ_CHECK(!call.name.empty());
    FUZZ_CHECK(nlohmann::json::parse(call.arguments, nullptr, false).is_object());
  }
  return 0;
}
