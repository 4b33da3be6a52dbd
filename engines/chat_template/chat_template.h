// A model's chat template (tokenizer_config.json's "chat_template"): the conversation as the
// prompt text the model was trained on. A Jinja subset, rendered as Hugging Face's
// apply_chat_template renders it (trim_blocks, lstrip_blocks, loop controls, raise_exception,
// tojson as json.dumps with ensure_ascii=False) and checked against Jinja itself in the tests.
//
// A template is a model file's, so it is bounded like input: nesting, the steps a rendering takes
// and the text it makes are limited, and every failure is INVALID_ARGUMENT naming the line
// (raise_exception's message as the template gives it).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace warmpool::chat {

struct Node;

struct RenderLimits {
  uint64_t max_output_bytes = 16u << 20;
  uint64_t max_steps = 4'000'000;  // statements run, loop iterations, filter items
};

class ChatTemplate {
 public:
  static Result<ChatTemplate> Parse(const std::string& source);

  // context: the template's variables; Hugging Face passes messages (a list of {"role",
  // "content", ...}), add_generation_prompt, bos_token, eos_token and, where given, tools.
  Result<std::string> Render(const nlohmann::ordered_json& context, const RenderLimits& limits = {}) const;

 private:
  std::shared_ptr<const std::vector<Node>> body_;
};

}  // namespace warmpool::chat
