// `warmpool generate` and `warmpool run`: text from a language model, streamed to the terminal as
// it is generated (or as NDJSON with --json).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "client/client.h"

namespace warmpool::cli {

struct GenerateArgs {
  std::string model;
  std::string prompt;  // empty: from stdin (or, for run on a terminal, one prompt per line)
  uint32_t max_tokens = 0;
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<uint32_t> top_k;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool logprobs = false;      // each token's log-probability in the --json lines ...
  uint32_t top_logprobs = 0;  // ... and the most likely tokens' 
  uint32_t deadline_ms = 0;
  std::optional<int64_t> keep_alive_ms;
  bool json = false;       // NDJSON: a line per chunk, then the final reply
  bool no_stream = false;  // one reply with all the text
  bool verbose = false;    // the final reply's figures on stderr
  std::string tools;       // a JSON file of tools the chat offers (cli/chat_files.h)
  std::string messages;    // a JSON file of the conversation to carry on, instead of a prompt
};

// The options both commands take; `keep_alive` is parsed by the caller.
void AddGenerateOptions(CLI::App* command, GenerateArgs& args, std::string& keep_alive);

// generate: one prompt (args.prompt, else all of stdin), or a chat: args.messages' conversation,
// or with args.tools the prompt as the user's turn. Returns the exit status.
int RunGenerate(client::Client& client, const GenerateArgs& args);
// run: the prompt when one is given; else on a terminal a prompt per line read (">>> "), until end
// of input or /bye; else all of stdin. With --tools or --messages, as generate.
int RunInteractive(client::Client& client, GenerateArgs args);

}  // namespace warmpool::cli
