// A small Hugging Face model directory for tests: a byte-level tokenizer trained by
// tests/python/tokenizer_reference.py on a text Debian ships, a random checkpoint whose vocabulary
// is the tokenizer's (so every token a random model chooses decodes), and tokenizer_config.json.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "engines/tokenizer/tokenizer.h"
#include "engines/transformer/random_checkpoint.h"

namespace warmpool::testing {

inline void WriteTinyModel(const std::string& directory, transformer::RandomCheckpoint spec = {}) {
  std::filesystem::create_directories(directory);
  const std::string command = fmt::format(
      "{} {}/tests/python/tokenizer_reference.py train /usr/share/common-licenses/GPL-3 --merges 300 --style llama3 "
      "--out {}/tokenizer.json",
      WARMPOOL_PYTHON3, WARMPOOL_SOURCE_DIR, directory);
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  Result<std::unique_ptr<tokenizer::Tokenizer>> t = tokenizer::Tokenizer::Load(directory + "/tokenizer.json");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  spec.vocab_size = (*t)->vocab_size();
  Status written = transformer::WriteRandomCheckpoint(directory, spec);
  ASSERT_TRUE(written.ok()) << written.ToString();
  std::ofstream(directory + "/tokenizer_config.json")
      << R"({"bos_token": "<|begin_of_text|>", "eos_token": "<|end|>"})";
}

// The same with the tokenizer of a model directory that has one (tokenizer.json and
// tokenizer_config.json copied), where Python is not at hand: the GPU check's machine.
inline void WriteTinyModelWithTokenizerOf(const std::string& directory, const std::string& tokenizer_directory,
                                          transformer::RandomCheckpoint spec = {}) {
  std::filesystem::create_directories(directory);
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    std::filesystem::copy_file(tokenizer_directory + "/" + file, directory + "/" + file,
                               std::filesystem::copy_options::overwrite_existing);
  }
  Result<std::unique_ptr<tokenizer::Tokenizer>> t = tokenizer::Tokenizer::Load(directory + "/tokenizer.json");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  spec.vocab_size = (*t)->vocab_size();
  Status written = transformer::WriteRandomCheckpoint(directory, spec);
  ASSERT_TRUE(written.ok()) << written.ToString();
}

// The demo model's directory: WARMPOOL_DEMO_MODEL where the check's bundle carries it, else the
// source tree's.
inline std::string DemoModelDirectory() {
  const char* bundled = std::getenv("WARMPOOL_DEMO_MODEL");
  return bundled != nullptr ? bundled : WARMPOOL_SOURCE_DIR "/demo/license-llama";
}

}  // namespace warmpool::testing
