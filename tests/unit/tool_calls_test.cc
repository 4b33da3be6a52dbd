// Tool calls read back out of generated text (engines/chat_template/tool_calls.h): whole and
// streamed in every split, malformed calls kept as text, formats read off real templates.
#include "engines/chat_template/tool_calls.h"

#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace warmpool::chat {
namespace {

using F = ToolCallFormat;

// The text fed in every two-piece split and byte by byte must read as it reads whole.
void ExpectSameStreamed(F format, const std::string& text) {
  const ToolCallText whole = ReadToolCalls(format, text);
  auto check = [&](const std::vector<std::string>& pieces, const std::string& how) {
    ToolCallReader reader(format);
    ToolCallText all;
    for (const std::string& p : pieces) {
      ToolCallText part = reader.Feed(p);
      all.content += part.content;
      all.calls.insert(all.calls.end(), part.calls.begin(), part.calls.end());
    }
    ToolCallText rest = reader.Finish();
    all.content += rest.content;
    all.calls.insert(all.calls.end(), rest.calls.begin(), rest.calls.end());
    EXPECT_EQ(all.content, whole.content) << how;
    EXPECT_EQ(all.calls, whole.calls) << how;
  };
  for (size_t cut = 0; cut <= text.size(); cut++) check({text.substr(0, cut), text.substr(cut)}, "split at " + std::to_string(cut));
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  check(bytes, "byte by byte");
}

TEST(ToolCallsTest, HermesCallsAndTheTextAroundThem) {
  const std::string text =
      "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
  ToolCallText read = ReadToolCalls(F::kHermes, text);
  EXPECT_EQ(read.content, "Let me look.");
  ASSERT_EQ(read.calls.size(), 2u);
  EXPECT_EQ(read.calls[0], (ToolCall{"get_weather", R"({"city":"Paris"})"}));
  EXPECT_EQ(read.calls[1], (ToolCall{"get_time", "{}"}));
  ExpectSameStreamed(F::kHermes, text);
}

TEST(ToolCallsTest, HermesWhatIsNotACallStaysText) {
  for (const char* text : {
           "<tool_call>{not json}</tool_call> after",        // does not parse
           "<tool_call>{\"arguments\": {}}</tool_call>",     // no name
           "<tool_call>{\"name\": \"f\", \"arguments\": 3}</tool_call>",  // arguments not an object
           "text <tool_call>{\"name\": \"f\"",               // never closed
           "a < b and <tool_ca",                             // a marker's beginning, never finished
           "  \n ",                                          // whitespace alone is an answer
       }) {
    ToolCallText read = ReadToolCalls(F::kHermes, text);
    EXPECT_TRUE(read.calls.empty()) << text;
    EXPECT_EQ(read.content, text);
    ExpectSameStreamed(F::kHermes, text);
  }
  // Arguments as a string holding an object (some fine-tunes write them so) are a call.
  ToolCallText read = ReadToolCalls(F::kHermes, R"(<tool_call>{"name": "f", "arguments": "{\"x\": 1}"}</tool_call>)");
  ASSERT_EQ(read.calls.size(), 1u);
  EXPECT_EQ(read.calls[0].arguments, R"({"x":1})");
}

TEST(ToolCallsTest, Llama3JsonAnswers) {
  for (const std::string& text : {std::string(R"({"name": "get_weather", "parameters": {"city": "Paris"}})"),
                                 std::string("<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}"),
                                 std::string(" \n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}\n")}) {
    ToolCallText read = ReadToolCalls(F::kLlama3Json, text);
    EXPECT_EQ(read.content, "") << text;
    ASSERT_EQ(read.calls.size(), 1u) << text;
    EXPECT_EQ(read.calls[0], (ToolCall{"get_weather", R"({"city":"Paris"})"}));
    ExpectSameStreamed(F::kLlama3Json, text);
  }
  const std::string two = R"({"name": "a", "parameters": {"s": "};{"}}; {"name": "b", "parameters": {}})";
  ToolCallText read = ReadToolCalls(F::kLlama3Json, two);
  ASSERT_EQ(read.calls.size(), 2u);
  EXPECT_EQ(read.calls[0], (ToolCall{"a", R"({"s":"};{"})"}));
  EXPECT_EQ(read.calls[1], (ToolCall{"b", "{}"}));
  ExpectSameStreamed(F::kLlama3Json, two);
  // Text, or JSON that is not a call, is the answer as written.
  for (const char* text : {"The weather is fine.", "{\"city\": \"Paris\"}", "{\"name\": \"f\", \"parameters\": {} trailing",
                                 "<|python", "{\"name\": \"f\"} and more"}) {
    ToolCallText plain = ReadToolCalls(F::kLlama3Json, text);
    EXPECT_TRUE(plain.calls.empty()) << text;
    EXPECT_EQ(plain.content, text);
    ExpectSameStreamed(F::kLlama3Json, text);
  }
}

TEST(ToolCallsTest, ArgumentsNestedTooDeepAreNotACall) {
  // Written out again, they would take a stack frame per level: the text stays text.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string hermes = "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": " + deep + "}}</tool_call>";
  ToolCallText read = ReadToolCalls(F::kHermes, hermes);
  EXPECT_TRUE(read.calls.empty());
  EXPECT_EQ(read.content, hermes);
  const std::string llama = "{\"name\": \"f\", \"parameters\": {\"a\": " + deep + "}}";
  EXPECT_TRUE(ReadToolCalls(F::kLlama3Json, llama).calls.empty());
}

TEST(ToolCallsTest, NoFormatPassesEverything) {
  const std::string text = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
  ToolCallText read = ReadToolCalls(F::kNone, text);
  EXPECT_TRUE(read.calls.empty());
  EXPECT_EQ(read.content, text);
}

TEST(ToolCallsTest, FormatNames) {
  for (F f : {F::kNone, F::kHermes, F::kLlama3Json}) EXPECT_EQ(*ParseToolCallFormat(ToolCallFormatName(f)), f);
  EXPECT_EQ(ParseToolCallFormat("mistral").status().code(), Code::kInvalidArgument);
}

TEST(ToolCallsTest, FormatsOfRealTemplates) {
  // tests/data/chat_templates.json: the templates as the models ship them (Qwen2.5 writes Hermes
  // calls; Llama 3.1 JSON ones; the others render no tools).
  std::ifstream file(WARMPOOL_SOURCE_DIR "/tests/data/chat_templates.json");
  ASSERT_TRUE(file);
  size_t hermes = 0, llama = 0;
  for (const nlohmann::json& t : nlohmann::json::parse(file)) {
    const std::string name = t["name"];
    const F format = DetectToolCallFormat(t["template"].get<std::string>());
    const F expected = name.starts_with("qwen2.5/")   ? F::kHermes
                       : name.starts_with("llama3.1/") ? F::kLlama3Json
                                                       : F::kNone;
    EXPECT_EQ(format, expected) << name;
    hermes += format == F::kHermes;
    llama += format == F::kLlama3Json;
  }
  EXPECT_GE(hermes, 2u);
  EXPECT_GE(llama, 2u);
}

}  // namespace
}  // namespace warmpool::chat
