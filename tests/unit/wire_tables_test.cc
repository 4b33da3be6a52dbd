// Every table that says what a code, an exit status or a message means on some boundary agrees with
// the one in ipc/: the codes' table (ipc/codes.h) against the proto's enum (by its descriptor, both
// ways), CodeName, the HTTP statuses, the wire conversions and the engine ABI; the children's exit
// statuses (ipc/exit_status.h) against the command line's; the descriptor rule (ipc/descriptors.h)
// message by message. The Python side is tests/python/test_wire_tables.py, against the same proto.
#include <map>
#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <gtest/gtest.h>

#include "common/command_line.h"
#include "common/status.h"
#include "engines/include/warmpool/engine.h"
#include "http/response.h"
#include "ipc/child_arguments.h"
#include "ipc/codes.h"
#include "ipc/descriptors.h"
#include "ipc/error_proto.h"
#include "ipc/exit_status.h"
#include "ipc/warmpool.pb.h"
#include "ipc/owner.pb.h"
#include "ipc/worker.pb.h"
#include "shm/stats.h"

namespace warmpool::ipc {
namespace {

// The segment keeps one counter per code (shm/stats.h): a new code changes the layout.
static_assert(shm::kCodes == kCodeTable.size(), "shm::kCodes must count every code (and bump the layout)");
// Engines return wp_status, read with CodeFromInt (engines/builtin.cc): the values they share agree.
static_assert(WP_OK == static_cast<int>(Code::kOk) && WP_NOT_FOUND == static_cast<int>(Code::kNotFound) &&
              WP_INVALID_ARGUMENT == static_cast<int>(Code::kInvalidArgument) &&
              WP_RESOURCE_EXHAUSTED == static_cast<int>(Code::kResourceExhausted) &&
              WP_UNAVAILABLE == static_cast<int>(Code::kUnavailable) &&
              WP_FAILED_PRECONDITION == static_cast<int>(Code::kFailedPrecondition) &&
              WP_INTERNAL == static_cast<int>(Code::kInternal));

TEST(CodeTableTest, EveryRowIsTheProtoValueOfTheSameNumberAndName) {
  const google::protobuf::EnumDescriptor* proto = v1::Code_descriptor();
  for (const CodeRow& row : kCodeTable) {
    const int number = static_cast<int>(row.code);
    SCOPED_TRACE(std::string(row.name));
    ASSERT_TRUE(v1::Code_IsValid(number));
    EXPECT_EQ(v1::Code_Name(static_cast<v1::Code>(number)), row.name);
    const google::protobuf::EnumValueDescriptor* value = proto->FindValueByName(std::string(row.name));
    ASSERT_NE(value, nullptr) << "no v1::Code value named " << row.name;
    EXPECT_EQ(value->number(), number);
  }
}

TEST(CodeTableTest, EveryProtoValueHasARow) {
  const google::protobuf::EnumDescriptor* proto = v1::Code_descriptor();
  EXPECT_EQ(static_cast<size_t>(proto->value_count()), kCodeTable.size());
  for (int i = 0; i < proto->value_count(); i++) {
    const google::protobuf::EnumValueDescriptor* value = proto->value(i);
    SCOPED_TRACE(value->name());
    const CodeRow& row = RowOf(static_cast<Code>(value->number()));
    EXPECT_EQ(static_cast<int>(row.code), value->number()) << "v1::Code has a value without a row";
    EXPECT_EQ(row.name, value->name());
  }
}

TEST(CodeTableTest, NamesAreCodeName) {
  std::set<std::string_view> seen;
  for (const CodeRow& row : kCodeTable) {
    EXPECT_EQ(CodeName(row.code), row.name);
    EXPECT_TRUE(seen.insert(row.name).second) << "two codes named " << row.name;
    if (row.code != Code::kOk) {
      EXPECT_EQ(Status(row.code, "why").ToString(), std::string(row.name) + ": why");
    }
  }
}

TEST(CodeTableTest, HttpStatusesAreTheTables) {
  for (const CodeRow& row : kCodeTable) {
    SCOPED_TRACE(std::string(row.name));
    EXPECT_EQ(http::StatusFor(row.code), row.http_status);
    EXPECT_NE(http::Reason(row.http_status), "Unknown") << "no reason phrase for " << row.http_status;
    EXPECT_EQ(row.http_status >= 400, row.code != Code::kOk);
  }
}

TEST(CodeTableTest, CliExitSaysOnlySuccessWithZero) {
  for (const CodeRow& row : kCodeTable) {
    EXPECT_EQ(row.cli_exit == 0, row.code == Code::kOk) << row.name;
    EXPECT_TRUE(row.cli_exit == 0 || row.cli_exit == 1 || row.cli_exit == 2) << row.name;
  }
  // A caller's mistake exits like a usage error (common/command_line.h).
  EXPECT_EQ(CliExitOf(Code::kInvalidArgument), 2);
}

// Pinned, like the segment's layout version: each column is a contract with scripts, HTTP clients
// and the documentation (docs/protocol.md). Changing one is a protocol change: say so there too.
TEST(CodeTableTest, TableIsPinned) {
  std::string text;
  for (const CodeRow& row : kCodeTable) {
    text += std::to_string(static_cast<int>(row.code)) + " " + std::string(row.name) + " " +
            std::to_string(row.http_status) + " " + std::to_string(row.cli_exit) + "\n";
  }
  EXPECT_EQ(text,
            "0 OK 200 0\n"
            "1 NOT_FOUND 404 1\n"
            "2 INVALID_ARGUMENT 400 2\n"
            "3 RESOURCE_EXHAUSTED 429 1\n"
            "4 UNAVAILABLE 503 1\n"
            "5 DEADLINE_EXCEEDED 504 1\n"
            "6 FAILED_PRECONDITION 409 1\n"
            "7 PERMISSION_DENIED 403 1\n"
            "8 INTERNAL 500 1\n");
}

TEST(CodeTableTest, EveryCodeRoundTripsThroughTheWire) {
  for (const CodeRow& row : kCodeTable) {
    v1::Envelope sent;
    SetError(sent.mutable_error(), Status(row.code, "m"));
    v1::Envelope received;
    ASSERT_TRUE(received.ParseFromString(sent.SerializeAsString()));
    EXPECT_EQ(v1::Code_Name(received.error().code()), row.name);
    const Status status = StatusFromError(received.error());
    EXPECT_EQ(status.code(), row.code);
    EXPECT_EQ(status.message(), "m");
  }
}

TEST(CodeTableTest, AnUnknownValueReadsAsInternal) {
  for (int value : {-1, static_cast<int>(kCodeTable.size()), 1000}) {
    EXPECT_EQ(CodeFromInt(value), Code::kInternal) << value;
    EXPECT_EQ(RowOf(static_cast<Code>(value)).name, "INTERNAL") << value;
  }
  // A newer peer's code survives parsing (proto3 enums are open) and reads as INTERNAL here.
  v1::Error error;
  error.set_code(static_cast<v1::Code>(42));
  v1::Error parsed;
  ASSERT_TRUE(parsed.ParseFromString(error.SerializeAsString()));
  EXPECT_EQ(StatusFromError(parsed).code(), Code::kInternal);
}

TEST(ChildExitTest, FatalOnlyByStatusNeverBySignal) {
  EXPECT_TRUE(IsFatalExit(kChildFatal, 0));
  EXPECT_FALSE(IsFatalExit(kChildFailed, 0));
  EXPECT_FALSE(IsFatalExit(kChildStopped, 0));
  EXPECT_FALSE(IsFatalExit(kChildFatal, 9));  // a status of 2 next to a signal is no status
  EXPECT_FALSE(IsFatalExit(0, 11));
}

// Parses a command line with the child's own declarations, as its main() does.
template <typename Arguments, typename Declare>
int ParseAs(Declare declare, std::vector<std::string> words, Arguments& into) {
  CLI::App app{"child"};
  declare(app, into);
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  return ParseCommandLine(app, static_cast<int>(argv.size()), argv.data());
}

// A child started with a command line it does not take (a supervisor and a child of different
// versions) must not be started again and again: its usage error is kChildFatal.
TEST(ChildExitTest, AUsageErrorIsFatal) {
  WorkerArguments worker;
  EXPECT_EQ(ParseAs(DeclareWorkerArguments, {"warmpool-worker", "--no-such-option"}, worker), kChildFatal);
  EXPECT_EQ(ParseAs(DeclareWorkerArguments, {"warmpool-worker"}, worker), kChildFatal);  // no --slot
  OwnerArguments owner;
  EXPECT_EQ(ParseAs(DeclareOwnerArguments, {"warmpool-owner", "--no-such-option"}, owner), kChildFatal);
}

// What the supervisor writes, the child reads back field for field: every field away from its
// default, so that a flag the encoder forgot (or spells differently) leaves one unequal.
TEST(ChildArgumentsTest, TheWorkersCommandLineRoundTrips) {
  WorkerArguments sent;
  sent.channel_fd = 7;
  sent.slot = 5;
  sent.generation = 9;
  sent.device = 2;
  sent.instance = "test instance";
  sent.budget_bytes = (5ull << 30) + 1;
  sent.max_frame_bytes = 12345;
  sent.parent = 4242;
  sent.engine_dir = "/engines with spaces";
  sent.backend = Backend::kCuda;
  sent.sharing = "legacy";
  sent.threads = 3;
  sent.tf32 = true;
  WorkerArguments got;
  ASSERT_EQ(ParseAs(DeclareWorkerArguments, WorkerCommandLine("warmpool-worker", sent), got), -1);
  EXPECT_EQ(got.channel_fd, sent.channel_fd);
  EXPECT_EQ(got.slot, sent.slot);
  EXPECT_EQ(got.generation, sent.generation);
  EXPECT_EQ(got.device, sent.device);
  EXPECT_EQ(got.instance, sent.instance);
  EXPECT_EQ(got.budget_bytes, sent.budget_bytes);
  EXPECT_EQ(got.max_frame_bytes, sent.max_frame_bytes);
  EXPECT_EQ(got.parent, sent.parent);
  EXPECT_EQ(got.engine_dir, sent.engine_dir);
  EXPECT_EQ(got.backend, sent.backend);
  EXPECT_EQ(got.sharing, sent.sharing);
  EXPECT_EQ(got.threads, sent.threads);
  EXPECT_EQ(got.tf32, sent.tf32);

  // And the defaults, read as the child reads them (into a fresh struct): an empty engine
  // directory stays empty, no --tf32 means off.
  WorkerArguments defaults, read;
  ASSERT_EQ(ParseAs(DeclareWorkerArguments, WorkerCommandLine("warmpool-worker", defaults), read), -1);
  EXPECT_EQ(read.engine_dir, "");
  EXPECT_FALSE(read.tf32);
  EXPECT_EQ(read.backend, Backend::kHost);
}

TEST(ChildArgumentsTest, TheOwnersCommandLineRoundTrips) {
  OwnerArguments sent;
  sent.channel_fd = 6;
  sent.device = 3;
  sent.sharing = "legacy";
  sent.parent = 99;
  OwnerArguments got;
  ASSERT_EQ(ParseAs(DeclareOwnerArguments, OwnerCommandLine("warmpool-owner", sent), got), -1);
  EXPECT_EQ(got.channel_fd, sent.channel_fd);
  EXPECT_EQ(got.device, sent.device);
  EXPECT_EQ(got.sharing, sent.sharing);
  EXPECT_EQ(got.parent, sent.parent);
  EXPECT_FALSE(got.probe);

  OwnerArguments probe, read;
  probe.probe = true;
  ASSERT_EQ(ParseAs(DeclareOwnerArguments, OwnerCommandLine("warmpool-owner", probe), read), -1);
  EXPECT_TRUE(read.probe);
}

TEST(DescriptorRuleTest, ClientRequests) {
  v1::Envelope m;
  EXPECT_EQ(DescriptorsCarried(m), 0);
  m.mutable_region()->set_bytes(4096);
  EXPECT_EQ(DescriptorsCarried(m), 1);
  m.mutable_region()->set_remove(7);
  EXPECT_EQ(DescriptorsCarried(m), 0);
  m.mutable_takeover();
  EXPECT_EQ(DescriptorsCarried(m), 1);
  m.mutable_infer()->mutable_input_region()->set_region(1);  // the region was registered before
  EXPECT_EQ(DescriptorsCarried(m), 0);
  m.mutable_load()->set_model("x");
  EXPECT_EQ(DescriptorsCarried(m), 0);
}

TEST(DescriptorRuleTest, SupervisorToWorker) {
  v1::WorkerEnvelope m;
  m.mutable_load()->set_model(1);
  EXPECT_EQ(DescriptorsCarried(m), 0);  // a model without a file (echo)
  m.mutable_load()->set_path("tiny.safetensors");
  EXPECT_EQ(DescriptorsCarried(m), 1);
  m.mutable_attach()->set_model(1);
  EXPECT_EQ(DescriptorsCarried(m), 0);
  m.mutable_attach()->mutable_weights()->set_weight_bytes(64);
  EXPECT_EQ(DescriptorsCarried(m), 1);
  m.mutable_allocated()->set_grant(3);
  EXPECT_EQ(DescriptorsCarried(m), 1);
  m.mutable_allocated()->mutable_error()->set_code(v1::RESOURCE_EXHAUSTED);
  EXPECT_EQ(DescriptorsCarried(m), 0);
  m.mutable_offer()->set_job(5);
  EXPECT_EQ(DescriptorsCarried(m), 1);
  m.mutable_infer()->set_job(6);
  EXPECT_EQ(DescriptorsCarried(m), 0);
  m.mutable_infer()->mutable_output_region()->set_region(2);
  EXPECT_EQ(DescriptorsCarried(m), 1);
  m.mutable_infer()->mutable_input_region()->set_region(1);
  EXPECT_EQ(DescriptorsCarried(m), 2);
}

TEST(DescriptorRuleTest, WorkerToSupervisor) {
  v1::WorkerEnvelope m;
  m.mutable_load_done()->set_job(1);
  EXPECT_EQ(DescriptorsCarried(m), 0);  // a failed load, or an engine without a region (echo)
  m.mutable_load_done()->set_weights_shared(true);
  EXPECT_EQ(DescriptorsCarried(m), 1);
  m.mutable_park_done()->set_job(2);
  EXPECT_EQ(DescriptorsCarried(m), 0);
  m.mutable_park_done()->set_copy_shared(true);
  EXPECT_EQ(DescriptorsCarried(m), 1);
}

TEST(DescriptorRuleTest, OwnerToSupervisor) {
  v1::OwnerEnvelope m;
  m.mutable_hello();
  EXPECT_EQ(DescriptorsCarried(m), 0);
  m.mutable_allocated()->set_id(1);
  EXPECT_EQ(DescriptorsCarried(m), 1);  // vmm: the exported allocation
  m.mutable_allocated()->set_ipc_handle("legacy handle");
  EXPECT_EQ(DescriptorsCarried(m), 0);  // legacy: the handle is named in the message
  m.mutable_allocated()->clear_ipc_handle();
  m.mutable_allocated()->mutable_error()->set_code(v1::RESOURCE_EXHAUSTED);
  EXPECT_EQ(DescriptorsCarried(m), 0);
  m.mutable_allocate();
  EXPECT_EQ(DescriptorsCarried(m), 0);
  m.mutable_release();
  EXPECT_EQ(DescriptorsCarried(m), 0);
}

// Each body of each envelope, set empty through reflection: the count the rule gives it. A body
// added to an envelope fails here until it is placed (and in ipc/descriptors.h when it carries
// one); an empty region request (remove 0) and an empty grant (no error, no legacy handle) do.
template <typename Envelope>
void ExpectEmptyBodies(const std::map<std::string, int>& carrying, int bodies) {
  const google::protobuf::OneofDescriptor* body = Envelope::descriptor()->FindOneofByName("body");
  ASSERT_NE(body, nullptr);
  EXPECT_EQ(body->field_count(), bodies) << Envelope::descriptor()->name()
                                         << " has a new body: place it in the descriptor rule";
  for (int i = 0; i < body->field_count(); i++) {
    const google::protobuf::FieldDescriptor* field = body->field(i);
    Envelope m;
    m.GetReflection()->MutableMessage(&m, field);
    const auto it = carrying.find(field->name());
    EXPECT_EQ(DescriptorsCarried(m), it == carrying.end() ? 0 : it->second)
        << Envelope::descriptor()->name() << "." << field->name();
  }
}

TEST(DescriptorRuleTest, EveryBodyIsPlaced) {
  ExpectEmptyBodies<v1::Envelope>({{"region", 1}, {"takeover", 1}}, 30);
  ExpectEmptyBodies<v1::WorkerEnvelope>({{"allocated", 1}, {"offer", 1}}, 20);
  ExpectEmptyBodies<v1::OwnerEnvelope>({{"allocated", 1}}, 4);
}

}  // namespace
}  // namespace warmpool::ipc
