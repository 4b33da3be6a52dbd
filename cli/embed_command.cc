#include "cli/embed_command.h"

#include <iostream>

#include "common/utf8.h"
#include "replyjson/reply_json.h"

namespace warmpool::cli {

void AddEmbedOptions(CLI::App* command, EmbedArgs& args, std::string& keep_alive) {
  command->add_option("MODEL", args.model, "language model name")->required();
  command->add_option("TEXT", args.texts, "texts to embed, each on its own (default: each non-empty line of stdin)");
  command->add_option("--deadline-ms", args.deadline_ms, "give up after this many milliseconds");
  command->add_option("--dimensions", args.dimensions,
                      "each embedding's first N values, at unit length again (for a model trained for shorter "
                      "embeddings, e.g. Qwen3-Embedding; default: all)")
      ->check(CLI::PositiveNumber);
  command->add_flag("--json", args.json,
                    "print the reply as JSON (embeddings, dimensions, prompt_tokens, tokens, embed_us)");
  command->add_option("--keep-alive", keep_alive,
                      "keep the model warm this long after this request (0: release it when it ends)");
}

Result<std::string> RunEmbed(client::Client& client, const EmbedArgs& args) {
  v1::EmbedRequest request;
  request.set_model(args.model);
  request.set_deadline_ms(args.deadline_ms);
  request.set_dimensions(args.dimensions);
  if (args.keep_alive_ms) request.set_keep_alive_ms(*args.keep_alive_ms);
  std::vector<std::string> texts = args.texts;
  if (texts.empty()) {
    for (std::string line; std::getline(std::cin, line);) {
      if (!line.empty()) texts.push_back(std::move(line));
    }
  }
  if (texts.empty()) return Error(Code::kInvalidArgument, "nothing to embed: give texts, or lines on stdin");
  for (std::string& text : texts) {
    if (!IsValidUtf8(text)) return Error(Code::kInvalidArgument, "a text to embed is not valid UTF-8");
    request.add_input(std::move(text));
  }
  Result<v1::EmbedReply> reply = client.Embed(std::move(request));
  if (!reply.ok()) return reply.status();
  if (args.json) return replyjson::EmbedReplyJson(*reply).dump(2) + "\n";
  std::string out;
  for (const v1::Embedding& e : reply->embeddings()) {
    out += nlohmann::json(std::vector<float>(e.values().begin(), e.values().end())).dump() + "\n";
  }
  return out;
}

}  // namespace warmpool::cli
