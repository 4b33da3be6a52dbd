// Everything a Hugging Face model directory says about serving it, read and checked together: the
// checkpoint (config.json and the weights), the tokenizer (tokenizer.json), the chat template and
// special tokens (tokenizer_config.json), and the generation defaults (generation_config.json,
// optional). Each file is checked against the others: the tokenizer's ids must fit the model's
// vocabulary, the end tokens must be tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/file_version.h"
#include "common/status.h"
#include "engines/chat_template/chat_template.h"
#include "engines/tokenizer/tokenizer.h"
#include "engines/transformer/checkpoint.h"
#include "engines/transformer/sampler.h"

namespace warmpool::transformer {

// The files of a model directory that are not weights, as read (an absent optional file is "").
// The served model keeps them in its weights region (engines/transformer/packed_model.h), so that
// a model attached or unparked has them without the directory.
struct TextFiles {
  std::string tokenizer;          // tokenizer.json
  std::string tokenizer_config;   // tokenizer_config.json, optional
  std::string generation_config;  // generation_config.json, optional

  // Through the directory held open as `dir`, following no symlink; `versions` gets the version
  // of every file read.
  static Result<TextFiles> Read(int dir, const std::string& shown, std::vector<FileVersion>* versions);
};

// What serving a model needs beside its weights.
struct ServingFiles {
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::string chat_template;        // tokenizer_config.json's ("default" of several); "" when none
  std::shared_ptr<const chat::ChatTemplate> chat;  // it, parsed; null when there is none
  // The named "tool_use" template, for chats that offer tools ("" and null when there is none).
  std::string tools_template;
  std::shared_ptr<const chat::ChatTemplate> chat_tools;
  std::string bos_text, eos_text;   // the special tokens' text, as templates use them
  std::optional<int32_t> bos;       // the beginning-of-sequence token, where the model has one
  std::vector<int32_t> end_tokens;  // generation stops at any of these
  SamplingOptions sampling;         // the model's defaults: greedy unless generation_config samples

  // Checked against the model's vocabulary (config.json's vocab_size); `shown` is the directory.
  static Result<ServingFiles> Parse(const TextFiles& files, uint32_t vocab_size, const std::string& shown);
};

// tokenizer_config.json's chat template for chats with tools (its "tool_use" one where it names
// one, else its template) as text ("" when it has none or does not parse).
std::string ChatTemplateText(const std::string& tokenizer_config);

struct ModelDirectory : ServingFiles {
  std::unique_ptr<Checkpoint> checkpoint;

  // Errors name the file and what is wrong with it.
  static Result<ModelDirectory> Open(const std::string& directory);
};

}  // namespace warmpool::transformer
