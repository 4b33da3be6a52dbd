// CheckRequest: every check a client request can fail before it touches daemon state, judged from
// the envelope alone.
#include "supervisor/core/request_check.h"

#include <cstdint>
#include <string>

#include <gtest/gtest.h>

#include "ipc/fault_spec.h"
#include "ipc/framing.h"
#include "ipc/warmpool.pb.h"
#include "tests/text.h"

namespace warmpool::supervisor {
namespace {

using ::warmpool::testing::Contains;

#define EXPECT_REFUSED(envelope, code_, substring)                                 \
  do {                                                                             \
    Status s_ = CheckRequest(envelope);                                            \
    EXPECT_EQ(s_.code(), code_) << s_.ToString();                                  \
    EXPECT_TRUE(Contains(s_.message(), substring)) << "message: " << s_.message(); \
  } while (0)

#define EXPECT_ACCEPTED(envelope)                         \
  do {                                                    \
    Status s_ = CheckRequest(envelope);                   \
    EXPECT_TRUE(s_.ok()) << s_.ToString();                \
  } while (0)

v1::Envelope Infer(const std::string& model, uint32_t rows, uint32_t cols, size_t bytes) {
  v1::Envelope e;
  e.set_request_id(7);
  v1::InferRequest* infer = e.mutable_infer();
  infer->set_model(model);
  infer->mutable_input()->set_rows(rows);
  infer->mutable_input()->set_cols(cols);
  infer->mutable_input()->set_data(std::string(bytes, '\0'));
  return e;
}

TEST(CheckRequest, EveryWellFormedRequestIsAccepted) {
  v1::Envelope e;
  e.set_protocol_version(ipc::kProtocolVersion);
  e.mutable_load()->set_model("mlp");
  e.mutable_load()->set_replicas(2);
  e.mutable_load()->set_keep_alive_ms(-1);
  EXPECT_ACCEPTED(e);
  e.Clear();
  e.mutable_unload()->set_model("mlp-v1.2_b");
  e.mutable_unload()->set_park(true);
  EXPECT_ACCEPTED(e);
  e.Clear();
  e.mutable_unload()->set_all(true);  // no model needed
  EXPECT_ACCEPTED(e);
  EXPECT_ACCEPTED(Infer("mlp", 2, 3, 24));
  e.Clear();
  e.mutable_pin()->set_model("mlp");
  EXPECT_ACCEPTED(e);
  e.Clear();
  e.mutable_models();
  EXPECT_ACCEPTED(e);
  e.Clear();
  e.mutable_ps();
  EXPECT_ACCEPTED(e);
  e.Clear();
  e.mutable_status();
  EXPECT_ACCEPTED(e);
  e.Clear();
  e.mutable_fault_clear();
  EXPECT_ACCEPTED(e);
  e.Clear();
  e.mutable_fault_arm()->set_point("infer.mid");
  e.mutable_fault_arm()->set_action("exit:3");
  EXPECT_ACCEPTED(e);
  e.mutable_fault_arm()->set_model("mlp");
  e.mutable_fault_arm()->set_action("delay:250");
  EXPECT_ACCEPTED(e);
}

TEST(CheckRequest, UnknownButValidModelNameIsNotItsBusiness) {
  v1::Envelope e;
  e.mutable_load()->set_model("never-registered");
  EXPECT_ACCEPTED(e);
  EXPECT_ACCEPTED(Infer("never-registered", 1, 1, 4));
}

TEST(CheckRequest, ProtocolVersion) {
  v1::Envelope e;
  e.mutable_status();
  e.set_protocol_version(0);
  EXPECT_ACCEPTED(e);
  e.set_protocol_version(ipc::kProtocolVersion);
  EXPECT_ACCEPTED(e);
  e.set_protocol_version(ipc::kProtocolVersion + 1);
  EXPECT_REFUSED(e, Code::kFailedPrecondition,
                 "client speaks protocol version 2, this daemon speaks 1: use a client of the "
                 "same release");
  e.set_protocol_version(UINT32_MAX);
  EXPECT_REFUSED(e, Code::kFailedPrecondition, "protocol version 4294967295");
}

TEST(CheckRequest, ProtocolVersionIsJudgedBeforeTheBody) {
  v1::Envelope e;
  e.set_protocol_version(9);
  e.mutable_load()->set_model("");
  EXPECT_REFUSED(e, Code::kFailedPrecondition, "protocol version 9");
}

TEST(CheckRequest, NoBody) {
  v1::Envelope e;
  e.set_request_id(42);
  EXPECT_REFUSED(e, Code::kInvalidArgument, "request 42 carries no request this daemon understands (body 0)");
}

TEST(CheckRequest, ReplyBodiesAreNotRequests) {
  v1::Envelope e;
  e.set_request_id(3);
  e.mutable_load_reply()->set_model("mlp");
  EXPECT_REFUSED(e, Code::kInvalidArgument, "carries no request this daemon understands (body 12)");
  e.mutable_error()->set_code(v1::INTERNAL);
  EXPECT_REFUSED(e, Code::kInvalidArgument, "(body 10)");
  e.mutable_pin_reply();
  EXPECT_REFUSED(e, Code::kInvalidArgument, "(body 28)");
  e.mutable_unload_reply();
  EXPECT_REFUSED(e, Code::kInvalidArgument, "(body 14)");
  e.mutable_infer_reply();
  EXPECT_REFUSED(e, Code::kInvalidArgument, "(body 16)");
  e.mutable_models_reply();
  EXPECT_REFUSED(e, Code::kInvalidArgument, "(body 18)");
  e.mutable_ps_reply();
  EXPECT_REFUSED(e, Code::kInvalidArgument, "(body 20)");
  e.mutable_status_reply();
  EXPECT_REFUSED(e, Code::kInvalidArgument, "(body 22)");
  e.mutable_fault_arm_reply();
  EXPECT_REFUSED(e, Code::kInvalidArgument, "(body 24)");
  e.mutable_fault_clear_reply();
  EXPECT_REFUSED(e, Code::kInvalidArgument, "(body 26)");
}

TEST(CheckRequest, InvalidModelNames) {
  for (const std::string& name : {std::string(), std::string(".hidden"), std::string("a/b"),
                                  std::string("../etc"), std::string(64, 'x'), std::string("sp ace"),
                                  std::string("nul\0x", 5), std::string("\xc3\xa9t\xc3\xa9")}) {
    SCOPED_TRACE(name);
    v1::Envelope e;
    e.mutable_load()->set_model(name);
    EXPECT_REFUSED(e, Code::kInvalidArgument, "must be 1 to 63 characters");
    e.mutable_unload()->set_model(name);
    EXPECT_REFUSED(e, Code::kInvalidArgument, "must be 1 to 63 characters");
    e.mutable_pin()->set_model(name);
    EXPECT_REFUSED(e, Code::kInvalidArgument, "must be 1 to 63 characters");
    EXPECT_REFUSED(Infer(name, 1, 1, 4), Code::kInvalidArgument, "must be 1 to 63 characters");
    if (!name.empty()) {  // an empty fault model means any model
      e.mutable_fault_arm()->set_point("load.begin");
      e.mutable_fault_arm()->set_action("kill");
      e.mutable_fault_arm()->set_model(name);
      EXPECT_REFUSED(e, Code::kInvalidArgument, "must be 1 to 63 characters");
    }
  }
  v1::Envelope e;
  e.mutable_load()->set_model(std::string(63, 'x'));
  EXPECT_ACCEPTED(e);
}

TEST(CheckRequest, UnloadAllIgnoresTheModel) {
  v1::Envelope e;
  e.mutable_unload()->set_all(true);
  e.mutable_unload()->set_model("not/a name");
  EXPECT_ACCEPTED(e);
}

TEST(CheckRequest, InferShape) {
  const char* kShape = "input must be a non-empty rows x cols matrix of f32";
  EXPECT_ACCEPTED(Infer("m", 1, 1, 4));
  EXPECT_ACCEPTED(Infer("m", 3, 5, 60));
  EXPECT_REFUSED(Infer("m", 0, 3, 0), Code::kInvalidArgument, "(got 0 x 3 with 0 bytes)");
  EXPECT_REFUSED(Infer("m", 3, 0, 0), Code::kInvalidArgument, kShape);
  EXPECT_REFUSED(Infer("m", 2, 3, 23), Code::kInvalidArgument, "(got 2 x 3 with 23 bytes)");
  EXPECT_REFUSED(Infer("m", 2, 3, 28), Code::kInvalidArgument, kShape);
  EXPECT_REFUSED(Infer("m", 2, 3, 20), Code::kInvalidArgument, kShape);
  EXPECT_REFUSED(Infer("m", 4, 1, 12), Code::kInvalidArgument, kShape);  // 3 floats, 4 rows
  EXPECT_REFUSED(Infer("m", 2, 2, 12), Code::kInvalidArgument, kShape);  // 3 floats in 2 rows
  // rows * cols overflows 32 bits (and 64 bits times 4) but the data is small: refused, by division.
  EXPECT_REFUSED(Infer("m", 0x10000, 0x10000, 4), Code::kInvalidArgument, kShape);
  EXPECT_REFUSED(Infer("m", UINT32_MAX, UINT32_MAX, 16), Code::kInvalidArgument, kShape);
  // No input at all.
  v1::Envelope e;
  e.mutable_infer()->set_model("m");
  EXPECT_REFUSED(e, Code::kInvalidArgument, "(got 0 x 0 with 0 bytes)");
}

TEST(CheckRequest, InferShapeIsJudgedBeforeTheName) {
  EXPECT_REFUSED(Infer("", 0, 0, 0), Code::kInvalidArgument, "rows x cols");
}

TEST(CheckRequest, Replicas) {
  v1::Envelope e;
  e.mutable_load()->set_model("mlp");
  e.mutable_load()->set_replicas(0);
  EXPECT_ACCEPTED(e);
  e.mutable_load()->set_replicas(kMaxRequestReplicas);
  EXPECT_ACCEPTED(e);
  e.mutable_load()->set_replicas(kMaxRequestReplicas + 1);
  EXPECT_REFUSED(e, Code::kInvalidArgument, "replicas 1025 is more than 1024");
  e.mutable_load()->set_replicas(UINT32_MAX);
  EXPECT_REFUSED(e, Code::kInvalidArgument, "replicas 4294967295");
}

TEST(CheckRequest, FaultPointAndAction) {
  v1::Envelope e;
  v1::FaultArmRequest* arm = e.mutable_fault_arm();
  for (const char* point : ipc::kFaultPoints) {
    arm->set_point(point);
    for (const char* action : {"kill", "segv", "abort", "hang", "exit:0", "exit:255", "delay:0"}) {
      arm->set_action(action);
      EXPECT_ACCEPTED(e);
    }
  }
  arm->set_point("infer.nowhere");
  arm->set_action("kill");
  EXPECT_REFUSED(e, Code::kInvalidArgument, "unknown fault point \"infer.nowhere\" (known: load.begin");
  arm->set_point("");
  EXPECT_REFUSED(e, Code::kInvalidArgument, "unknown fault point \"\"");
  arm->set_point("infer.mid");
  for (const char* action : {"", "explode", "exit:256", "exit:", "exit:-1", "delay:", "delay:x",
                             "delay:99999999999", "KILL"}) {
    arm->set_action(action);
    EXPECT_REFUSED(e, Code::kInvalidArgument, "unknown fault action");
  }
}

}  // namespace
}  // namespace warmpool::supervisor

namespace warmpool::supervisor {
namespace {

v1::Envelope Register(const std::string& model, const std::string& path, bool remove = false) {
  v1::Envelope e;
  e.mutable_register_model()->set_model(model);
  e.mutable_register_model()->set_path(path);
  e.mutable_register_model()->set_remove(remove);
  return e;
}

TEST(CheckRequestTest, RegisterNeedsAGoodNameAndAnAbsolutePath) {
  EXPECT_ACCEPTED(Register("m", "/var/lib/warmpool/models/m.safetensors"));
  EXPECT_ACCEPTED(Register("m", "", /*remove=*/true));
  EXPECT_REFUSED(Register("m", "models/m.safetensors"), Code::kInvalidArgument, "must be absolute");
  EXPECT_REFUSED(Register("m", ""), Code::kInvalidArgument, "must be absolute");
  EXPECT_REFUSED(Register("m", std::string("/a\0b", 4)), Code::kInvalidArgument, "must be absolute");
  EXPECT_REFUSED(Register("../x", "/m.safetensors"), Code::kInvalidArgument, "model name");
  EXPECT_REFUSED(Register("", "", /*remove=*/true), Code::kInvalidArgument, "model name");
  v1::Envelope reply;
  reply.mutable_register_model_reply()->set_model("m");
  EXPECT_REFUSED(reply, Code::kInvalidArgument, "no request this daemon understands");
}

// Tensors in a client's region: the slice holds exactly rows x cols floats, at an offset a float
// may start at, and a hostile offset + bytes cannot wrap around.
TEST(CheckRequest, TensorsInRegionsAreCheckedLikeTensorsInFrames) {
  auto in_region = [](uint32_t rows, uint32_t cols, uint64_t offset, uint64_t bytes) {
    v1::Envelope e = Infer("m", rows, cols, 0);
    v1::RegionSlice* in = e.mutable_infer()->mutable_input_region();
    in->set_region(1);
    in->set_offset(offset);
    in->set_bytes(bytes);
    return e;
  };
  EXPECT_ACCEPTED(in_region(2, 3, 0, 24));
  EXPECT_REFUSED(in_region(2, 3, 0, 20), Code::kInvalidArgument, "rows x cols x 4");
  EXPECT_REFUSED(in_region(2, 3, 2, 24), Code::kInvalidArgument, "multiple of 4");
  EXPECT_REFUSED(in_region(0, 3, 0, 0), Code::kInvalidArgument, "input_region");
  EXPECT_REFUSED(in_region(1, 1, UINT64_MAX - 3, 4), Code::kInvalidArgument, "input_region");
  v1::Envelope with_data = in_region(1, 1, 0, 4);
  with_data.mutable_infer()->mutable_input()->set_data(std::string(4, '\0'));
  EXPECT_REFUSED(with_data, Code::kInvalidArgument, "no data in the frame");
  v1::Envelope no_region = in_region(1, 1, 0, 4);
  no_region.mutable_infer()->mutable_input_region()->set_region(0);
  EXPECT_REFUSED(no_region, Code::kInvalidArgument, "registered region");
  v1::Envelope out = Infer("m", 1, 1, 4);
  out.mutable_infer()->mutable_output_region()->set_region(1);
  out.mutable_infer()->mutable_output_region()->set_offset(6);
  out.mutable_infer()->mutable_output_region()->set_bytes(4);
  EXPECT_REFUSED(out, Code::kInvalidArgument, "output_region");
  v1::Envelope region;
  region.mutable_region();
  EXPECT_REFUSED(region, Code::kInvalidArgument, "bytes > 0");
  region.mutable_region()->set_bytes(1);
  EXPECT_ACCEPTED(region);
}

// Tools and tool calls are JSON a daemon parses and writes out again: objects, bounded in size,
// count and depth (a hundred thousand brackets would overflow a stack when written out), UTF-8.
TEST(CheckRequest, ToolsAndToolCallsAreBoundedJsonObjects) {
  auto chat = [] {
    v1::Envelope e;
    e.set_protocol_version(ipc::kProtocolVersion);
    v1::GenerateRequest* g = e.mutable_generate();
    g->set_model("lm");
    v1::ChatMessage* m = g->add_messages();
    m->set_role("user");
    m->set_content("hi");
    return e;
  };
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  v1::Envelope good = chat();
  good.mutable_generate()->add_tools(R"({"type": "function", "function": {"name": "f"}})");
  v1::ToolCall* call = good.mutable_generate()->add_messages()->add_tool_calls();
  good.mutable_generate()->mutable_messages(1)->set_role("assistant");
  call->set_id("c1");
  call->set_name("f");
  call->set_arguments(R"({"x": [1, {"y": 2}]})");
  EXPECT_ACCEPTED(good);
  for (const std::string& tool : {std::string("[1]"), std::string("not json"), "{\"a\": " + deep + "}",
                                  "{\"a\": \"" + std::string(70000, 'x') + "\"}", std::string("{\"a\": \"\xff\"}")}) {
    v1::Envelope bad = chat();
    bad.mutable_generate()->add_tools(tool);
    EXPECT_REFUSED(bad, Code::kInvalidArgument, "a tool");
  }
  v1::Envelope many = chat();
  for (int i = 0; i <= kMaxTools; i++) many.mutable_generate()->add_tools("{}");
  EXPECT_REFUSED(many, Code::kInvalidArgument, "tools: at most");
  v1::Envelope deep_arguments = good;
  deep_arguments.mutable_generate()->mutable_messages(1)->mutable_tool_calls(0)->set_arguments("{\"a\": " + deep + "}");
  EXPECT_REFUSED(deep_arguments, Code::kInvalidArgument, "arguments");
  v1::Envelope nameless = good;
  nameless.mutable_generate()->mutable_messages(1)->mutable_tool_calls(0)->clear_name();
  EXPECT_REFUSED(nameless, Code::kInvalidArgument, "needs a name");
  v1::Envelope prompt;
  prompt.set_protocol_version(ipc::kProtocolVersion);
  prompt.mutable_generate()->set_model("lm");
  prompt.mutable_generate()->set_prompt("hi");
  prompt.mutable_generate()->add_tools("{}");
  EXPECT_REFUSED(prompt, Code::kInvalidArgument, "send messages");
}

}  // namespace
}  // namespace warmpool::supervisor
