// Chat templates (engines/chat_template/) against Jinja itself: every case of
// tests/data/chat_templates.json (the templates of the families warmpool serves, conversations with
// system prompts, tools and tool calls, thinking, a template that raises, and hostile ones) is
// rendered here and by tests/python/jinja_reference.py, and must come out byte for byte the same,
// or fail in both.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "engines/chat_template/chat_template.h"
#include "tests/text.h"

namespace warmpool::chat {
namespace {

using Json = nlohmann::ordered_json;
using warmpool::testing::Contains;

std::string CasesPath() { return std::string(WARMPOOL_SOURCE_DIR) + "/tests/data/chat_templates.json"; }

// What Jinja renders, by case name: {"output"} or {"error"}.
std::map<std::string, Json> JinjaRenders() {
  const std::string command =
      fmt::format("{} {}/tests/python/jinja_reference.py {}", WARMPOOL_PYTHON3, WARMPOOL_SOURCE_DIR, CasesPath());
  FILE* pipe = popen(command.c_str(), "r");
  EXPECT_NE(pipe, nullptr) << command;
  std::string text;
  char buf[4096];
  for (size_t n; pipe != nullptr && (n = fread(buf, 1, sizeof(buf), pipe)) > 0;) text.append(buf, n);
  EXPECT_EQ(pipe != nullptr ? pclose(pipe) : -1, 0) << command;
  std::map<std::string, Json> out;
  for (const Json& r : Json::parse(text)) out[r["name"].get<std::string>()] = r;
  return out;
}

TEST(ChatTemplateTest, EveryCaseRendersAsJinjaRendersIt) {
  std::ifstream in(CasesPath());
  const Json cases = Json::parse(in);
  const std::map<std::string, Json> jinja = JinjaRenders();
  ASSERT_EQ(jinja.size(), cases.size());
  int compared = 0, failed_in_both = 0;
  for (const Json& c : cases) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    const Json& expected = jinja.at(name);
    Result<ChatTemplate> parsed = ChatTemplate::Parse(c["template"].get<std::string>());
    Result<std::string> rendered = parsed.ok() ? parsed->Render(c["context"]) : Result<std::string>(parsed.status());
    if (expected.contains("error")) {
      EXPECT_FALSE(rendered.ok()) << "Jinja: " << expected["error"] << "; here: " << (rendered.ok() ? *rendered : "");
      if (!rendered.ok()) EXPECT_EQ(rendered.status().code(), Code::kInvalidArgument);
      failed_in_both++;
      continue;
    }
    EXPECT_TRUE(rendered.ok()) << rendered.status().ToString();
    if (!rendered.ok()) continue;
    EXPECT_EQ(*rendered, expected["output"].get<std::string>());
    compared++;
  }
  EXPECT_GE(compared, 20);
  EXPECT_GE(failed_in_both, 8);
}

TEST(ChatTemplateTest, RaiseExceptionIsTheTemplatesOwnMessage) {
  Result<ChatTemplate> t = ChatTemplate::Parse("{{ raise_exception('Only user and assistant roles are supported!') }}");
  ASSERT_TRUE(t.ok());
  Result<std::string> out = t->Render(Json::object());
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(out.status().message(), "Only user and assistant roles are supported!")) << out.status().message();
}

TEST(ChatTemplateTest, HostileTemplatesAreBoundedNotFollowedForever) {
  auto fails = [](const std::string& source, const char* says, RenderLimits limits = {}) {
    Result<ChatTemplate> t = ChatTemplate::Parse(source);
    Result<std::string> out = t.ok() ? t->Render(Json::object(), limits) : Result<std::string>(t.status());
    ASSERT_FALSE(out.ok()) << source;
    EXPECT_EQ(out.status().code(), Code::kInvalidArgument);
    EXPECT_TRUE(Contains(out.status().message(), says)) << out.status().message();
  };
  fails("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", "steps",
        RenderLimits{.max_steps = 200000});
  fails("{{ 'x' * 100000000 }}", "bytes");
  fails("{% for a in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "bytes", RenderLimits{.max_output_bytes = 1 << 20});
  fails("{{ " + std::string(200, '(') + "1" + std::string(200, ')') + " }}", "deeper");
  fails("{{ [[[[" + std::string(200, '[') + " }}", "");
  fails("{{ 1 ", "never ends");
  fails("{{ }}", "missing");
  fails("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "deep");
  fails("{{ range(10**9) }}", "at most");
  fails("{{ 'a' ~ }}", "");
  fails("{{ '\\ud800' }}", "surrogate");
  std::string nested;
  for (int i = 0; i < 100; i++) nested += "{% if true %}";
  fails(nested, "nested");
}

TEST(ChatTemplateTest, ContextValuesComeInAsJsonAndOutAsPython) {
  Result<ChatTemplate> t = ChatTemplate::Parse("{{ a }} {{ b }} {{ c }} {{ d }} {{ e }} {{ f | tojson }}");
  ASSERT_TRUE(t.ok());
  Result<std::string> out = t->Render(Json{{"a", true}, {"b", nullptr}, {"c", 2.5}, {"d", Json::array({1, "x"})},
                                           {"e", Json{{"k", "v"}}}, {"f", Json{{"é", "\n"}}}});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(*out, "True None 2.5 [1, 'x'] {'k': 'v'} {\"é\": \"\\n\"}");
}

}  // namespace
}  // namespace warmpool::chat
