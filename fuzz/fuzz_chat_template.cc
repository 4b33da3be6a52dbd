// Chat templates from model files (engines/chat_template): whatever the bytes, Parse refuses them
// with INVALID_ARGUMENT or gives a template that renders, within small limits, a fixed conversation
// to text or to INVALID_ARGUMENT — never a crash, a hang or an unbounded allocation. A template
// that renders twice renders the same text both times.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "engines/chat_template/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using warmpool::chat::ChatTemplate;
  const std::string source(reinterpret_cast<const char*>(data), size);
  warmpool::Result<ChatTemplate> parsed = ChatTemplate::Parse(source);
  if (!parsed.ok()) {
    if (parsed.status().code() != warmpool::Code::kInvalidArgument) std::abort();
    return 0;
  }
  static const nlohmann::ordered_json context = {
      {"messages",
       {{{"role", "system"}, {"content", "Be brief."}},
        {{"role", "user"}, {"content", "Hi \xc3\xa9"}},
        {{"role", "assistant"}, {"content", "<think>x</think>Hello"}, {"tool_calls", nlohmann::ordered_json::array()}}}},
      {"add_generation_prompt", true},
      {"bos_token", "<s>"},
      {"eos_token", "</s>"},
      {"tools", {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", nlohmann::ordered_json::object()}}}}}}};
  const warmpool::chat::RenderLimits limits{.max_output_bytes = 1 << 16, .max_steps = 20000};
  warmpool::Result<std::string> first = parsed->Render(context, limits);
  if (!first.ok()) {
    if (first.status().code() != warmpool::Code::kInvalidArgument) std::abort();
    return 0;
  }
  if (first->size() > limits.max_output_bytes) std::abort();
  warmpool::Result<std::string> second = parsed->Render(context, limits);
  // strftime_now reads the clock: a template that calls it may differ between two renderings.
  if (source.find("strftime_now") == std::string::npos && (!second.ok() || *second != *first)) std::abort();
  return 0;
}
