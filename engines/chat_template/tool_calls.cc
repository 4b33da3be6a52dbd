#include "engines/chat_template/tool_calls.h"

#include <optional>

#include <nlohmann/json.hpp>

#include "common/json_depth.h"

namespace warmpool::chat {
namespace {

using nlohmann::json;

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kSpace = " \t\r\n";

// The longest end of `text` that `marker` begins with (but not all of the marker): text that may
// yet become the marker when the next piece comes.
size_t PartialMarkerAtEnd(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; n--) {
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

// Model text is parsed only within a depth bound (common/json_depth.h): a model can be made to
// write brackets enough to overflow a stack when the arguments are written out again.
constexpr int kMaxCallDepth = 32;

json ParseCall(std::string_view text) {
  if (JsonNestingDepth(text, kMaxCallDepth) > kMaxCallDepth) return json(json::value_t::discarded);
  return json::parse(text.begin(), text.end(), nullptr, false);
}

// {"name": "f", "arguments": {...}} (or "parameters", Llama's word); arguments given as a string
// holding an object are taken too. Anything else is not a call.
std::optional<ToolCall> CallFrom(const json& doc) {
  if (!doc.is_object()) return std::nullopt;
  auto name = doc.find("name");
  if (name == doc.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) return std::nullopt;
  json arguments = json::object();
  for (const char* key : {"arguments", "parameters"}) {
    auto it = doc.find(key);
    if (it == doc.end()) continue;
    arguments = it->is_string() ? ParseCall(it->get_ref<const std::string&>()) : *it;
    break;
  }
  if (!arguments.is_object()) return std::nullopt;
  return ToolCall{name->get<std::string>(), arguments.dump(-1, ' ', false, json::error_handler_t::replace)};
}

std::optional<ToolCall> HermesCall(std::string_view body) { return CallFrom(ParseCall(body)); }

// Llama 3.1's answer: one or more JSON objects, separated by ';' (and whitespace), each a call.
std::optional<std::vector<ToolCall>> LlamaCalls(std::string_view text) {
  if (text.starts_with(kPythonTag)) text.remove_prefix(kPythonTag.size());
  std::vector<ToolCall> calls;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && (kSpace.find(text[i]) != std::string_view::npos || text[i] == ';')) i++;
    if (i == text.size()) break;
    if (text[i] != '{') return std::nullopt;
    // The object's end: braces counted outside strings.
    size_t depth = 0, end = i;
    bool in_string = false;
    for (; end < text.size(); end++) {
      const char c = text[end];
      if (in_string) {
        if (c == '\\') end++;
        else if (c == '"') in_string = false;
      } else if (c == '"') {
        in_string = true;
      } else if (c == '{') {
        depth++;
      } else if (c == '}' && --depth == 0) {
        break;
      }
    }
    if (end >= text.size()) return std::nullopt;
    std::string_view object = text.substr(i, end + 1 - i);
    std::optional<ToolCall> call = CallFrom(ParseCall(object));
    if (!call) return std::nullopt;
    calls.push_back(std::move(*call));
    i = end + 1;
  }
  if (calls.empty()) return std::nullopt;
  return calls;
}

}  // namespace

std::string_view ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes: return "hermes";
    case ToolCallFormat::kLlama3Json: return "llama3_json";
    case ToolCallFormat::kNone: break;
  }
  return "none";
}

Result<ToolCallFormat> ParseToolCallFormat(std::string_view name) {
  for (ToolCallFormat f : {ToolCallFormat::kNone, ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json}) {
    if (name == ToolCallFormatName(f)) return f;
  }
  return Error(Code::kInvalidArgument, "tool call format \"{}\" is not one of none, hermes, llama3_json", name);
}

ToolCallFormat DetectToolCallFormat(std::string_view source) {
  if (source.find(kHermesOpen) != std::string_view::npos) return ToolCallFormat::kHermes;
  // Llama 3.1/3.2 tell the model to answer {"name": ..., "parameters": ...} and render earlier
  // calls so (their ipython role carries the results).
  if (source.find("\"parameters\"") != std::string_view::npos &&
      (source.find("ipython") != std::string_view::npos || source.find(kPythonTag) != std::string_view::npos)) {
    return ToolCallFormat::kLlama3Json;
  }
  return ToolCallFormat::kNone;
}

void ToolCallReader::Emit(ToolCallText& out, std::string_view text) {
  // Whitespace at the end is held until more text comes: whitespace that borders a call goes with it.
  const size_t last_visible = text.find_last_not_of(kSpace);
  if (last_visible == std::string_view::npos) {
    held_space_.append(text);
    return;
  }
  out.content += held_space_;
  out.content.append(text.substr(0, last_visible + 1));
  held_space_.assign(text.substr(last_visible + 1));
  after_call_ = false;
}

void ToolCallReader::FeedHermes(ToolCallText& out) {
  for (;;) {
    if (!in_call_) {
      const size_t open = pending_.find(kHermesOpen);
      if (open == std::string::npos) {
        const size_t keep = PartialMarkerAtEnd(pending_, kHermesOpen);
        Emit(out, std::string_view(pending_).substr(0, pending_.size() - keep));
        pending_.erase(0, pending_.size() - keep);
        return;
      }
      Emit(out, std::string_view(pending_).substr(0, open));
      pending_.erase(0, open + kHermesOpen.size());
      in_call_ = true;
      close_scan_ = 0;
    }
    // Each piece is searched once: from where the last search could still have missed the marker.
    const size_t close = pending_.find(kHermesClose, close_scan_);
    if (close == std::string::npos) {
      close_scan_ = pending_.size() >= kHermesClose.size() ? pending_.size() - kHermesClose.size() + 1 : 0;
      return;
    }
    const std::string body = pending_.substr(0, close);
    pending_.erase(0, close + kHermesClose.size());
    in_call_ = false;
    if (std::optional<ToolCall> call = HermesCall(body)) {
      held_space_.clear();  // what separated it from the text before
      after_call_ = true;
      calls_++;
      out.calls.push_back(std::move(*call));
    } else {
      Emit(out, std::string(kHermesOpen) + body + std::string(kHermesClose));
    }
  }
}

void ToolCallReader::FeedLlama(ToolCallText& out) {
  if (!decided_) {
    const size_t first = pending_.find_first_not_of(kSpace);
    if (first == std::string::npos) return;
    const std::string_view start = std::string_view(pending_).substr(first);
    if (start.front() == '{' || start.starts_with(kPythonTag)) {
      whole_answer_ = true;
    } else if (kPythonTag.starts_with(start)) {
      return;  // may still be the tag
    }
    decided_ = true;
  }
  if (whole_answer_) return;  // a call is read whole, at the end
  Emit(out, pending_);
  pending_.clear();
}

ToolCallText ToolCallReader::Feed(std::string_view text) {
  ToolCallText out;
  pending_.append(text);
  switch (format_) {
    case ToolCallFormat::kHermes: FeedHermes(out); break;
    case ToolCallFormat::kLlama3Json: FeedLlama(out); break;
    case ToolCallFormat::kNone:
      out.content = std::move(pending_);
      pending_.clear();
      break;
  }
  return out;
}

ToolCallText ToolCallReader::Finish() {
  ToolCallText out;
  std::optional<std::vector<ToolCall>> calls;
  if (format_ == ToolCallFormat::kLlama3Json && whole_answer_) {
    const size_t first = pending_.find_first_not_of(kSpace);
    calls = LlamaCalls(std::string_view(pending_).substr(first == std::string::npos ? pending_.size() : first));
  }
  if (calls) {
    calls_ += calls->size();
    out.calls = std::move(*calls);
    held_space_.clear();
    after_call_ = true;
  } else if (in_call_) {
    Emit(out, std::string(kHermesOpen) + pending_);  // never closed: the model's text as it wrote it
  } else {
    Emit(out, pending_);
  }
  pending_.clear();
  in_call_ = false;
  // Whitespace held back is the answer's own unless it follows a call.
  if (!after_call_) out.content += held_space_;
  held_space_.clear();
  return out;
}

ToolCallText ReadToolCalls(ToolCallFormat format, std::string_view text) {
  ToolCallReader reader(format);
  ToolCallText out = reader.Feed(text);
  ToolCallText rest = reader.Finish();
  out.content += rest.content;
  for (ToolCall& c : rest.calls) out.calls.push_back(std::move(c));
  return out;
}

}  // namespace warmpool::chat
