#include "cli/generate_command.h"

#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "cli/chat_files.h"
#include "common/utf8.h"
#include "ipc/codes.h"
#include "replyjson/reply_json.h"

namespace warmpool::cli {
namespace {

int Fail(const Status& status) {
  std::fprintf(stderr, "error: %s\n", status.ToString().c_str());
  return ipc::CliExitOf(status.code());
}

using Conversation = std::vector<std::pair<std::string, std::string>>;  // role, content

// A prompt, or (messages not empty) a conversation for the model's chat template.
v1::GenerateRequest RequestOf(const GenerateArgs& args, const std::string& prompt, const Conversation& messages = {}) {
  v1::GenerateRequest r;
  r.set_model(args.model);
  if (messages.empty()) r.set_prompt(prompt);
  for (const auto& [role, content] : messages) {
    v1::ChatMessage* m = r.add_messages();
    m->set_role(role);
    m->set_content(content);
  }
  r.set_max_tokens(args.max_tokens);
  if (args.temperature) r.set_temperature(*args.temperature);
  if (args.top_k) r.set_top_k(*args.top_k);
  if (args.top_p) r.set_top_p(*args.top_p);
  if (args.min_p) r.set_min_p(*args.min_p);
  if (args.repetition_penalty) r.set_repetition_penalty(*args.repetition_penalty);
  if (args.seed) r.set_seed(*args.seed);
  for (const std::string& stop : args.stop) r.add_stop(stop);
  r.set_stream(!args.no_stream);
  r.set_deadline_ms(args.deadline_ms);
  if (args.keep_alive_ms) r.set_keep_alive_ms(*args.keep_alive_ms);
  r.set_logprobs(args.logprobs || args.top_logprobs > 0);
  r.set_top_logprobs(args.top_logprobs);
  return r;
}

void PrintLine(const nlohmann::json& line) {
  const std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

// A line per call: "tool call ID: NAME ARGUMENTS" (the arguments' JSON).
void PrintToolCalls(const google::protobuf::RepeatedPtrField<v1::ToolCall>& calls) {
  for (const v1::ToolCall& call : calls) {
    std::fprintf(stdout, "tool call %s: %s %s\n", call.id().c_str(), call.name().c_str(), call.arguments().c_str());
  }
}

// Generates and prints; `text` gets what was generated. Returns the exit status.
int GenerateOne(client::Client& client, const GenerateArgs& args, v1::GenerateRequest request,
                std::string* text = nullptr, Status* failure = nullptr) {
  std::string generated;
  google::protobuf::RepeatedPtrField<v1::ToolCall> calls;  // the model's, in text mode
  Result<v1::GenerateReply> reply = client.Generate(std::move(request), [&](const v1::GenerateChunk& chunk) {
    generated += chunk.text();
    if (args.json) {
      PrintLine(replyjson::GenerateChunkJson(chunk));
    } else {
      std::fwrite(chunk.text().data(), 1, chunk.text().size(), stdout);
      calls.MergeFrom(chunk.tool_calls());  // printed after the text
      std::fflush(stdout);
    }
  });
  if (!reply.ok()) {
    // The text streamed ends its line; the calls streamed before the failure follow, each a line.
    const bool printed_calls = !args.json && !calls.empty();
    if (printed_calls) {
      std::fputc('\n', stdout);
      PrintToolCalls(calls);
    }
    if (failure != nullptr) *failure = reply.status();
    if (failure != nullptr && reply.status().code() == Code::kFailedPrecondition) return 1;  // the caller decides
    if (!args.json && !printed_calls) std::fputc('\n', stdout);
    return Fail(reply.status());
  }
  generated += reply->text();
  if (text != nullptr) *text = std::move(generated);
  if (args.json) {
    PrintLine(replyjson::GenerateReplyJson(*reply));
  } else {
    std::fwrite(reply->text().data(), 1, reply->text().size(), stdout);
    std::fputc('\n', stdout);
    calls.MergeFrom(reply->tool_calls());
    PrintToolCalls(calls);
    std::fflush(stdout);
  }
  if (args.verbose) {
    const double seconds = reply->generate_us() / 1e6;
    const double decode_seconds = (reply->generate_us() - reply->first_token_us()) / 1e6;
    std::fprintf(stderr,
                 "finish: %s; prompt %u tokens (%u from the prefix cache), completion %u tokens; first token %.1f ms; "
                 "%.1f tokens/s\n",
                 reply->finish_reason().c_str(), reply->prompt_tokens(), reply->cached_prompt_tokens(),
                 reply->completion_tokens(),
                 reply->first_token_us() / 1e3,
                 reply->completion_tokens() > 1 && decode_seconds > 0
                     ? (reply->completion_tokens() - 1) / decode_seconds
                     : (seconds > 0 ? reply->completion_tokens() / seconds : 0.0));
  }
  return 0;
}

std::string ReadAll(std::istream& in) { return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()}; }

}  // namespace

void AddGenerateOptions(CLI::App* command, GenerateArgs& args, std::string& keep_alive) {
  command->add_option("MODEL", args.model, "a language model (a registered model directory)")->required();
  command->add_option("PROMPT", args.prompt, "the text to continue (default: standard input)");
  command->add_option("--max-tokens", args.max_tokens, "generate at most this many tokens (default: until an end "
                                                        "token or the end of the context)");
  command->add_option("--temperature", args.temperature, "0 is greedy (default: the model's own)")
      ->check(CLI::Range(0.0, 100.0));
  command->add_option("--top-k", args.top_k, "sample from the K most likely tokens (0: all)");
  command->add_option("--top-p", args.top_p, "sample from the fewest tokens holding P of the probability")
      ->check(CLI::Range(0.0, 1.0));
  command->add_option("--min-p", args.min_p, "drop tokens less likely than P x the most likely")
      ->check(CLI::Range(0.0, 1.0));
  command->add_option("--repetition-penalty", args.repetition_penalty, "above 1 makes repeating less likely");
  command->add_option("--seed", args.seed, "the same seed, prompt and options give the same text");
  command->add_option("--stop", args.stop, "end the text before this string (repeatable; at most 16)");
  command->add_option("--deadline-ms", args.deadline_ms, "stop after this many milliseconds (default: none)");
  command->add_flag("--logprobs", args.logprobs, "with --json: each token's log-probability in its line");
  command->add_option("--top-logprobs", args.top_logprobs,
                      "with --logprobs: the log-probabilities of the N most likely tokens at each step too (0 to 20)");
  command->add_option("--keep-alive", keep_alive, "keep the model warm this long after this request");
  command->add_flag("--json", args.json, "NDJSON: a line per chunk, then the final reply (\"done\": true)");
  command->add_flag("--no-stream", args.no_stream, "wait for the whole text instead of streaming it");
  command->add_flag("--verbose", args.verbose, "print token counts, time to first token and tokens/s to stderr");
  command->add_option("--tools", args.tools,
                      "a JSON file: an array of tools the model may call (OpenAI's shape); the prompt becomes a "
                      "chat's user turn, and each call is printed on a line of its own (with --json, in the lines' "
                      "\"tool_calls\")")
      ->type_name("FILE");
  command->add_option("--messages", args.messages,
                      "a JSON file: the chat to carry on instead of a prompt, an array of {\"role\", \"content\"} "
                      "(an assistant's \"tool_calls\" as --json prints them; a tool's \"tool_call_id\")")
      ->type_name("FILE");
}

int RunGenerate(client::Client& client, const GenerateArgs& args) {
  if (!args.messages.empty() && !args.prompt.empty()) {
    return Fail(Error(Code::kInvalidArgument, "give a PROMPT or --messages, not both"));
  }
  // The files first, so that a bad one is told before standard input is read.
  v1::GenerateRequest files;
  if (!args.messages.empty()) {
    if (Status s = ReadMessages(args.messages, files); !s.ok()) return Fail(s);
  }
  if (!args.tools.empty()) {
    if (Status s = ReadTools(args.tools, files); !s.ok()) return Fail(s);
  }
  std::string prompt;
  if (args.messages.empty()) {
    prompt = args.prompt.empty() ? ReadAll(std::cin) : args.prompt;
    if (!IsValidUtf8(prompt)) return Fail(Error(Code::kInvalidArgument, "the prompt is not valid UTF-8"));
  }
  // Tools need a chat: the prompt is its user's turn.
  v1::GenerateRequest request =
      args.tools.empty() || !args.messages.empty() ? RequestOf(args, prompt) : RequestOf(args, "", {{"user", prompt}});
  if (!args.messages.empty()) request.clear_prompt();
  request.MergeFrom(files);  // the messages and the tools
  return GenerateOne(client, args, std::move(request));
}

int RunInteractive(client::Client& client, GenerateArgs args) {
  if (!args.prompt.empty() || !args.tools.empty() || !args.messages.empty() || !isatty(STDIN_FILENO)) {
    return RunGenerate(client, args);
  }
  // A chat through the model's template, the conversation so far sent each turn; a model without
  // one completes each line alone.
  Conversation conversation;
  bool chat = true;
  std::string line;
  for (;;) {
    std::fputs(">>> ", stdout);
    std::fflush(stdout);
    if (!std::getline(std::cin, line) || line == "/bye") break;
    if (line.empty()) continue;
    if (!IsValidUtf8(line)) {
      std::fprintf(stderr, "error: INVALID_ARGUMENT: the line is not valid UTF-8\n");
      continue;
    }
    if (chat) {
      conversation.emplace_back("user", line);
      std::string answer;
      Status failure;
      int rc = GenerateOne(client, args, RequestOf(args, "", conversation), &answer, &failure);
      if (rc == 0) {
        conversation.emplace_back("assistant", answer);
        continue;
      }
      conversation.pop_back();
      const bool no_template =
          failure.code() == Code::kFailedPrecondition && failure.message().find("chat template") != std::string::npos;
      if (!no_template) {  // told already, but for FAILED_PRECONDITION, which GenerateOne leaves to us
        if (failure.code() == Code::kFailedPrecondition) std::fprintf(stderr, "error: %s\n", failure.ToString().c_str());
        continue;
      }
      std::fprintf(stderr, "(%s has no chat template: each line is a prompt of its own)\n", args.model.c_str());
      chat = false;
    }
    if (int rc = GenerateOne(client, args, RequestOf(args, line)); rc != 0 && rc != 1) return rc;
  }
  std::fputc('\n', stdout);
  return 0;
}

}  // namespace warmpool::cli
