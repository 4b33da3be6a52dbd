#include "engines/transformer/model_directory.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "common/small_file.h"
#include "common/utf8.h"
#include "engines/json_describe.h"
#include "engines/transformer/embedding_modules.h"

namespace warmpool::transformer {
namespace {

using Json = nlohmann::json;

constexpr uint64_t kMaxConfigBytes = 64u << 20;  // chat templates make tokenizer_config.json big

// The text parsed, or null when the file was absent ("").
Result<Json> ParseJson(const std::string& text, const std::string& path) {
  if (text.empty()) return Json();
  try {
    Json json = Json::parse(text);
    if (!json.is_object()) return Error(Code::kInvalidArgument, "\"{}\": not a JSON object", path);
    return json;
  } catch (const Json::exception& e) {
    return Error(Code::kInvalidArgument, "\"{}\": not JSON: {}", path, e.what());
  }
}

// The file's text, or "" when it does not exist and may be missing. An empty file is not JSON.
Result<std::string> ReadText(int dir, const char* name, const std::string& shown, bool optional,
                             std::vector<FileVersion>* versions) {
  const std::string path = shown + "/" + name;
  FileVersion version;
  Result<std::string> text = ReadSmallFileAt(dir, name, kMaxConfigBytes, path, &version);
  if (!text.ok()) {
    if (optional && text.status().code() == Code::kNotFound) return std::string();
    return text.status();
  }
  if (text->empty()) return Error(Code::kInvalidArgument, "\"{}\": empty", path);
  if (versions != nullptr) versions->push_back(version);
  return text;
}

// A special token as tokenizer_config.json gives it: a string, or an object with its "content".
std::optional<std::string> TokenText(const Json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) return (*it)["content"].get<std::string>();
  return std::nullopt;
}

// The chat template, and (Hugging Face's named templates) the one for chats that offer tools:
// apply_chat_template takes "tool_use" when tools are given and the file has it, else "default".
Status ReadTemplate(const Json& config, const std::string& path, std::string* out, std::string* tools = nullptr) {
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return OkStatus();
  if (it->is_string()) {
    *out = it->get<std::string>();
    return OkStatus();
  }
  if (it->is_array()) {
    for (const Json& named : *it) {
      if (!named.is_object() || !named.contains("template") || !named["template"].is_string()) continue;
      const std::string name = named.value("name", "");
      if (name == "default") *out = named["template"].get<std::string>();
      if (name == "tool_use" && tools != nullptr) *tools = named["template"].get<std::string>();
    }
    if (!out->empty()) return OkStatus();
  }
  return Error(Code::kInvalidArgument, "\"{}\": chat_template is neither a string nor a list naming a \"default\"", path);
}

}  // namespace

std::string ChatTemplateText(const std::string& tokenizer_config) {
  Result<Json> config = ParseJson(tokenizer_config, "tokenizer_config.json");
  std::string text, tools;
  if (config.ok() && !config->is_null() && !ReadTemplate(*config, "tokenizer_config.json", &text, &tools).ok()) {
    return {};
  }
  return tools.empty() ? text : tools;  // what renders a chat that offers tools
}

namespace {

Status ReadGenerationConfig(const Json& g, const std::string& path, uint32_t vocab, ServingFiles* m) {
  if (g.is_null()) return OkStatus();
  try {
  std::vector<int64_t> ends;
  if (auto it = g.find("eos_token_id"); it != g.end() && !it->is_null()) {
    if (it->is_number_integer()) ends.push_back(it->get<int64_t>());
    else if (it->is_array()) for (const Json& id : *it) ends.push_back(id.is_number_integer() ? id.get<int64_t>() : -1);
    else ends.push_back(-1);
  }
  for (int64_t id : ends) {
    if (id < 0 || id >= vocab) {
      return Error(Code::kInvalidArgument, "\"{}\": eos_token_id {} is not a token of the model", path, id);
    }
    m->end_tokens.push_back(static_cast<int32_t>(id));
  }
  if (auto it = g.find("bos_token_id"); it != g.end() && it->is_number_integer()) {
    if (it->get<int64_t>() < 0 || it->get<int64_t>() >= vocab) {
      return Error(Code::kInvalidArgument, "\"{}\": bos_token_id {} is not a token of the model", path, DescribeJson(*it));
    }
    m->bos = it->get<int32_t>();
  }
  // Sampling only where the model's authors asked for it; the numbers they chose with it.
  const bool sample = g.value("do_sample", false);
  m->sampling.temperature = sample ? g.value("temperature", 1.0) : 0.0;
  m->sampling.top_p = g.value("top_p", 1.0);
  // generate()'s defaults where the file is silent: top_k 50 (GenerationConfig's own default).
  m->sampling.top_k = sample ? 50 : 0;
  if (auto it = g.find("top_k"); it != g.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0) {
      return Error(Code::kInvalidArgument, "\"{}\": top_k {} is not a whole number of tokens", path, DescribeJson(*it));
    }
    m->sampling.top_k = static_cast<uint32_t>(std::min<int64_t>(it->get<int64_t>(), INT32_MAX));
  }
  m->sampling.min_p = g.value("min_p", 0.0);
  m->sampling.repetition_penalty = g.value("repetition_penalty", 1.0);
  } catch (const Json::exception& e) {
    return Error(Code::kInvalidArgument, "\"{}\": a field has the wrong type: {}", path, e.what());
  }
  if (Status s = CheckSamplingOptions(m->sampling); !s.ok()) return Error(Code::kInvalidArgument, "\"{}\": {}", path, s.message());
  return OkStatus();
}

Result<ServingFiles> ParseFiles(const TextFiles& files, uint32_t vocab, const std::string& directory) {
  ServingFiles m;
  m.sampling.temperature = 0;  // greedy unless generation_config.json asks to sample (do_sample)
  const std::string tokenizer_path = directory + "/tokenizer.json";
  Result<std::unique_ptr<tokenizer::Tokenizer>> tokenizer = tokenizer::Tokenizer::Parse(files.tokenizer, tokenizer_path);
  if (!tokenizer.ok()) return tokenizer.status();
  m.tokenizer = std::move(*tokenizer);
  if (m.tokenizer->vocab_size() > vocab) {
    return Error(Code::kInvalidArgument, "\"{}\": token ids reach {}, past the model's vocabulary of {} (config.json)",
                 tokenizer_path, m.tokenizer->vocab_size() - 1, vocab);
  }

  const std::string config_path = directory + "/tokenizer_config.json";
  Result<Json> config = ParseJson(files.tokenizer_config, config_path);
  if (!config.ok()) return config.status();
  if (!config->is_null()) {
    if (Status s = ReadTemplate(*config, config_path, &m.chat_template, &m.tools_template); !s.ok()) return s;
    for (const char* key : {"bos_token", "eos_token"}) {
      std::optional<std::string> text = TokenText(*config, key);
      if (!text) continue;
      std::optional<int32_t> id = m.tokenizer->TokenId(*text);
      if (!id) return Error(Code::kInvalidArgument, "\"{}\": {} \"{}\" is not a token", config_path, key, *text);
      if (key == std::string("bos_token")) m.bos = *id, m.bos_text = *text;
      else m.end_tokens.push_back(*id), m.eos_text = *text;
    }
    if (!m.chat_template.empty()) {  // refused now, naming the file, rather than at a chat
      Result<chat::ChatTemplate> parsed = chat::ChatTemplate::Parse(m.chat_template);
      if (!parsed.ok()) return Error(Code::kInvalidArgument, "\"{}\": {}", config_path, parsed.status().message());
      m.chat = std::make_shared<const chat::ChatTemplate>(std::move(*parsed));
    }
    if (!m.tools_template.empty()) {
      Result<chat::ChatTemplate> parsed = chat::ChatTemplate::Parse(m.tools_template);
      if (!parsed.ok()) return Error(Code::kInvalidArgument, "\"{}\" (tool_use): {}", config_path, parsed.status().message());
      m.chat_tools = std::make_shared<const chat::ChatTemplate>(std::move(*parsed));
    }
  }
  const std::string generation_path = directory + "/generation_config.json";
  Result<Json> generation = ParseJson(files.generation_config, generation_path);
  if (!generation.ok()) return generation.status();
  if (!generation->is_null() && generation->contains("eos_token_id")) m.end_tokens.clear();  // it says all of them
  if (Status s = ReadGenerationConfig(*generation, generation_path, vocab, &m); !s.ok()) return s;
  if (m.end_tokens.empty()) {
    return Error(Code::kInvalidArgument,
                 "\"{}\": no end token: neither generation_config.json's eos_token_id nor tokenizer_config.json's "
                 "eos_token says where a generation ends",
                 directory);
  }
  return m;
}

Result<TextFiles> ReadFiles(int dir, const std::string& shown, std::vector<FileVersion>* versions) {
  TextFiles files;
  Result<std::string> tokenizer = ReadText(dir, "tokenizer.json", shown, /*optional=*/false, versions);
  if (!tokenizer.ok()) return tokenizer.status();
  files.tokenizer = std::move(*tokenizer);
  Result<std::string> config = ReadText(dir, "tokenizer_config.json", shown, /*optional=*/true, versions);
  if (!config.ok()) return config.status();
  files.tokenizer_config = std::move(*config);
  Result<std::string> generation = ReadText(dir, "generation_config.json", shown, /*optional=*/true, versions);
  if (!generation.ok()) return generation.status();
  files.generation_config = std::move(*generation);
  if (Status s = CheckEmbeddingModules(dir, shown, versions); !s.ok()) return s;
  return files;
}

}  // namespace

Result<TextFiles> TextFiles::Read(int dir, const std::string& shown, std::vector<FileVersion>* versions) {
  Result<TextFiles> files = ReadFiles(dir, shown, versions);
  if (!files.ok()) return ValidUtf8(files.status());
  return files;
}

Result<ServingFiles> ServingFiles::Parse(const TextFiles& files, uint32_t vocab_size, const std::string& shown) {
  Result<ServingFiles> parsed = ParseFiles(files, vocab_size, shown);
  if (!parsed.ok()) return ValidUtf8(parsed.status());
  return parsed;
}

Result<ModelDirectory> ModelDirectory::Open(const std::string& directory) {
  const int dir = open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) {
    const int err = errno;
    return ValidUtf8(Status(CodeForErrno(err), fmt::format("\"{}\": {}", directory, std::strerror(err))));
  }
  ModelDirectory m;
  Result<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::OpenAt(dir, directory);
  Result<TextFiles> files = checkpoint.ok() ? TextFiles::Read(dir, directory, nullptr) : checkpoint.status();
  close(dir);
  if (!files.ok()) return files.status();
  Result<ServingFiles> serving = ServingFiles::Parse(*files, (*checkpoint)->config().vocab_size, directory);
  if (!serving.ok()) return serving.status();
  static_cast<ServingFiles&>(m) = std::move(*serving);
  m.checkpoint = std::move(*checkpoint);
  return m;
}

}  // namespace warmpool::transformer
