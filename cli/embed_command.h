// `warmpool embed MODEL [TEXT...]`: embeddings from a language model, one per text (or per
// non-empty line of stdin when no text is given), printed one JSON array per line in order, or the
// whole reply as JSON (--json).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "client/client.h"

namespace warmpool::cli {

struct EmbedArgs {
  std::string model;
  std::vector<std::string> texts;  // empty: the lines of stdin
  uint32_t deadline_ms = 0;
  uint32_t dimensions = 0;  // 0: the whole embedding
  std::optional<int64_t> keep_alive_ms;
  bool json = false;
};

// The command's options; `keep_alive` is parsed by the caller.
void AddEmbedOptions(CLI::App* command, EmbedArgs& args, std::string& keep_alive);

// What to print, or the error.
Result<std::string> RunEmbed(client::Client& client, const EmbedArgs& args);

}  // namespace warmpool::cli
