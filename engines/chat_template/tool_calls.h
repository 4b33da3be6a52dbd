// Tool calls in a model's output: the inverse of a chat template that renders tools. A model
// trained to call tools writes each call in its family's format, and a server reads them back out
// of the text it generates:
//
//   hermes       <tool_call>{"name": "f", "arguments": {...}}</tool_call>, any number of them, with
//                text around (Qwen2/2.5/3, Hermes, SmolLM3; NousResearch's Hermes function calling)
//   llama3_json  the whole answer a JSON object {"name": "f", "parameters": {...}} (several
//                separated by ';'), maybe after <|python_tag|> (Llama 3.1/3.2's JSON tool calling)
//
// The format is read off the template (the markers it renders) unless a model's configuration
// names it. Text that looks like a call but is not one (JSON that does not parse, a call never
// closed) stays text: nothing a model writes is dropped.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace warmpool::chat {

enum class ToolCallFormat { kNone, kHermes, kLlama3Json };

std::string_view ToolCallFormatName(ToolCallFormat format);  // "none", "hermes", "llama3_json"
Result<ToolCallFormat> ParseToolCallFormat(std::string_view name);
// The format a chat template's model writes its calls in, judged by what the template renders for
// an assistant's earlier calls and its instructions; kNone when it shows neither format.
ToolCallFormat DetectToolCallFormat(std::string_view template_source);

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object, compact
  bool operator==(const ToolCall&) const = default;
};

// Text for the reader (what is not a call) and the calls found in it, in order.
struct ToolCallText {
  std::string content;
  std::vector<ToolCall> calls;
};

// Reads a generation's text as it streams: Feed returns what can be shown now (text that cannot
// begin a call) and the calls completed by this piece; Finish returns what was held back. The
// content of all the pieces together is the text without its calls, and whitespace that only
// separated calls (or preceded the first one) is dropped with them.
class ToolCallReader {
 public:
  explicit ToolCallReader(ToolCallFormat format) : format_(format) {}
  ToolCallText Feed(std::string_view text);
  ToolCallText Finish();
  bool saw_calls() const { return calls_ != 0; }

 private:
  void FeedHermes(ToolCallText& out);
  void FeedLlama(ToolCallText& out);
  void Emit(ToolCallText& out, std::string_view text);

  ToolCallFormat format_;
  std::string pending_;        // text not yet decided
  std::string held_space_;     // whitespace last seen: dropped if a call follows it
  bool after_call_ = false;    // nothing but whitespace since the last call
  bool in_call_ = false;       // hermes: after <tool_call>
  size_t close_scan_ = 0;      // hermes: where the search for </tool_call> goes on
  bool whole_answer_ = false;  // llama3_json: the answer began as a call; decided at the end
  bool decided_ = false;       // llama3_json: the answer's start was seen
  size_t calls_ = 0;
};

// A whole text at once.
ToolCallText ReadToolCalls(ToolCallFormat format, std::string_view text);

}  // namespace warmpool::chat
