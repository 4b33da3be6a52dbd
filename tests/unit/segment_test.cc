// The segment layout, and SegmentView over a byte vector (a second view stands in for another
// process). SharedSegment over a real POSIX shared-memory object: shared_segment_test.cc.
#include "shm/segment.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "shm/layout.h"
#include "tests/text.h"

namespace warmpool::shm {
namespace {

using ::warmpool::testing::Contains;

TEST(LayoutTest, VersionStringIsPinned) {
  // Changing any struct below must bump kLayoutVersion and this string together.
  EXPECT_STREQ(kLayoutString,
               "warmpool-shm-v6:hdr256:model512:worker128:inflight32:park:starttime:held16:changes:budgets8:"
               "stats64+1664");
  EXPECT_EQ(kLayoutVersion, 6u);
  EXPECT_EQ(std::string(kMagic, 8), "WARMPOOL");
  EXPECT_EQ(kNil, 0xFFFFFFFFu);
}

TEST(LayoutTest, SizesAndOffsets) {
  EXPECT_EQ(sizeof(SegmentHeader), 256u);
  EXPECT_EQ(offsetof(SegmentHeader, magic), 0u);
  EXPECT_EQ(offsetof(SegmentHeader, layout_version), 8u);
  EXPECT_EQ(offsetof(SegmentHeader, header_size), 12u);
  EXPECT_EQ(offsetof(SegmentHeader, segment_size), 16u);
  EXPECT_EQ(offsetof(SegmentHeader, supervisor_pid), 64u);
  EXPECT_EQ(offsetof(SegmentHeader, lru_head), 76u);
  EXPECT_EQ(offsetof(SegmentHeader, park_used_bytes), 88u);
  EXPECT_EQ(offsetof(SegmentHeader, supervisor_start_ticks), 104u);
  EXPECT_EQ(offsetof(SegmentHeader, changes), 112u);
  EXPECT_EQ(offsetof(SegmentHeader, device_used_bytes), 120u);
  EXPECT_EQ(offsetof(SegmentHeader, device_budget_bytes), 184u);
  EXPECT_EQ(sizeof(ModelRecord), 512u);
  EXPECT_EQ(offsetof(ModelRecord, state), 4u);
  EXPECT_EQ(offsetof(ModelRecord, name), 8u);
  EXPECT_EQ(offsetof(ModelRecord, engine), 72u);
  EXPECT_EQ(offsetof(ModelRecord, path), 88u);
  EXPECT_EQ(offsetof(ModelRecord, weight_bytes), 344u);
  EXPECT_EQ(offsetof(ModelRecord, lru_prev), 392u);
  EXPECT_EQ(offsetof(ModelRecord, last_error), 440u);
  EXPECT_EQ(sizeof(WorkerRecord), 128u);
  EXPECT_EQ(offsetof(WorkerRecord, generation), 12u);
  EXPECT_EQ(offsetof(WorkerRecord, models), 28u);
  EXPECT_EQ(offsetof(WorkerRecord, outstanding), 48u);
  EXPECT_EQ(offsetof(WorkerRecord, held), 56u);
  EXPECT_EQ(sizeof(InflightSlot), 32u);
  EXPECT_EQ(offsetof(InflightSlot, request_id), 8u);
  EXPECT_EQ(offsetof(InflightSlot, model), 16u);
  EXPECT_EQ(offsetof(InflightSlot, started_ns), 24u);
}

TEST(LayoutTest, TagPacking) {
  uint64_t tag = MakeTag(0xABCDEF01u, 0x1234, SlotState::kTaken);
  EXPECT_EQ(tag, 0xABCDEF0112340001ull);
  EXPECT_EQ(TagGeneration(tag), 0xABCDEF01u);
  EXPECT_EQ(TagWorker(tag), 0x1234);
  EXPECT_EQ(TagState(tag), SlotState::kTaken);
  EXPECT_EQ(MakeTag(0, 0, SlotState::kFree), 0u);
}

TEST(SegmentSizeTest, RegionsAre64ByteAligned) {
  // header | models | workers | inflight | stats (64 + 1664 per model)
  EXPECT_EQ(SegmentSize(Limits{1, 1, 1}), 2688u);   // 256 | 768 | 896 | 960 | 2688
  EXPECT_EQ(SegmentSize(Limits{3, 3, 3}), 7360u);   // 256 | 1792 | 2176 | 2304 | 7360
  EXPECT_EQ(SegmentSize(Limits{}), 592192u);        // 256 models, 16 workers, 1024 slots
  for (uint32_t n : {1u, 2u, 5u, 7u, 33u}) {
    EXPECT_EQ(SegmentSize(Limits{n, n, n}) % 64, 0u) << n;
  }
}

class SegmentViewTest : public ::testing::Test {
 protected:
  static constexpr Limits kLimits{4, 2, 8};
  std::vector<std::byte> bytes_ = std::vector<std::byte>(SegmentSize(kLimits));

  SegmentView MustFormat() {
    Result<SegmentView> v = SegmentView::Format(bytes_, kLimits, {1 << 20, 2 << 20}, 4242);
    EXPECT_TRUE(v.ok()) << v.status().ToString();
    return v.ok() ? *v : SegmentView();
  }
  Status AttachStatus(std::span<std::byte> span) {
    return SegmentView::Attach(span, "warmpool.test").status();
  }
};

TEST_F(SegmentViewTest, FormatWritesHeaderAndEmptyTables) {
  std::fill(bytes_.begin(), bytes_.end(), std::byte{0x5A});
  SegmentView v = MustFormat();
  ASSERT_TRUE(v.valid());
  const SegmentHeader& h = v.header();
  EXPECT_EQ(std::memcmp(h.magic, "WARMPOOL", 8), 0);
  EXPECT_EQ(h.layout_version, kLayoutVersion);
  EXPECT_EQ(h.header_size, 256u);
  EXPECT_EQ(h.segment_size, 9536u);
  EXPECT_EQ(h.max_models, 4u);
  EXPECT_EQ(h.max_workers, 2u);
  EXPECT_EQ(h.max_inflight, 8u);
  EXPECT_EQ(h.device_count, 2u);
  EXPECT_EQ(h.models_offset, 256u);
  EXPECT_EQ(h.workers_offset, 256u + 4 * 512);
  EXPECT_EQ(h.inflight_offset, 256u + 4 * 512 + 2 * 128);
  EXPECT_EQ(h.stats_offset, 256u + 4 * 512 + 2 * 128 + 8 * 32);
  EXPECT_EQ(h.supervisor_pid, 4242);
  EXPECT_EQ(h.lru_head, kNil);
  EXPECT_EQ(h.lru_tail, kNil);
  EXPECT_EQ(h.lru_length, 0u);
  EXPECT_EQ(h.device_budget_bytes[0], 1u << 20);
  EXPECT_EQ(h.device_budget_bytes[1], 2u << 20);
  EXPECT_EQ(h.device_budget_bytes[2], 0u);
  for (uint64_t used : h.device_used_bytes) EXPECT_EQ(used, 0u);
  for (uint32_t i = 0; i < 4; i++) {
    EXPECT_EQ(v.model(i).state, 0u);
    EXPECT_EQ(v.model(i).worker_slot, kNil);
    EXPECT_EQ(v.model(i).lru_prev, kNil);
    EXPECT_EQ(v.model(i).lru_next, kNil);
    EXPECT_EQ(v.model(i).name[0], '\0');
  }
  for (uint32_t i = 0; i < 2; i++) EXPECT_EQ(v.worker(i).last_exit, -1);
  for (uint32_t i = 0; i < 8; i++) EXPECT_EQ(v.inflight(i).tag, 0u);
  EXPECT_EQ(reinterpret_cast<std::byte*>(&v.inflight(7)) + sizeof(InflightSlot),
            bytes_.data() + 256 + 4 * 512 + 2 * 128 + 8 * 32);
}

TEST_F(SegmentViewTest, SecondViewSeesWritesOfTheFirst) {
  SegmentView writer = MustFormat();
  Result<SegmentView> reader = SegmentView::Attach(bytes_, "warmpool.test");
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ(reader->max_models(), 4u);
  EXPECT_EQ(reader->max_workers(), 2u);
  EXPECT_EQ(reader->max_inflight(), 8u);
  EXPECT_EQ(reader->header().supervisor_pid, 4242);

  std::strcpy(writer.model(2).name, "llama");
  writer.model(2).weight_bytes = 123456;
  writer.worker(1).pid = 999;
  writer.inflight(5).tag = MakeTag(3, 1, SlotState::kTaken);
  writer.header().lru_length = 7;
  EXPECT_STREQ(reader->model(2).name, "llama");
  EXPECT_EQ(reader->model(2).weight_bytes, 123456u);
  EXPECT_EQ(reader->worker(1).pid, 999);
  EXPECT_EQ(reader->inflight(5).tag, MakeTag(3, 1, SlotState::kTaken));
  EXPECT_EQ(reader->header().lru_length, 7u);
  EXPECT_EQ(&reader->model(3), &writer.model(3));
}

TEST_F(SegmentViewTest, FormatIntoLargerBufferRecordsItsSize) {
  bytes_.resize(12288);
  SegmentView v = MustFormat();
  EXPECT_EQ(v.header().segment_size, 12288u);
  EXPECT_TRUE(SegmentView::Attach(bytes_, "warmpool.test").ok());
}

TEST_F(SegmentViewTest, FormatRejectsBadLimits) {
  std::vector<std::byte> big(1 << 16);
  auto format = [&](Limits l, uint32_t devices = 1) {
    return SegmentView::Format(big, l, std::vector<uint64_t>(devices, 0), 1).status();
  };
  EXPECT_EQ(format({0, 1, 1}).code(), Code::kInvalidArgument);
  EXPECT_EQ(format({kNil, 1, 1}).code(), Code::kInvalidArgument);
  EXPECT_EQ(format({1, 0, 1}).code(), Code::kInvalidArgument);
  EXPECT_EQ(format({1, 1, 0}).code(), Code::kInvalidArgument);
  Status wide = format({1, 0x10000, 1});
  EXPECT_EQ(wide.code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(wide.message(), "max_workers 65536 (1..65535)")) << wide.message();
  EXPECT_EQ(format({1, 1, 1}, 0).code(), Code::kInvalidArgument);
  Status devices = format({1, 1, 1}, kMaxDevices + 1);
  EXPECT_EQ(devices.code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(devices.message(), "device count 9 out of range 1..8")) << devices.message();
  EXPECT_TRUE(format({1, 1, 1}, kMaxDevices).ok());
  EXPECT_TRUE(format({1, 1, 1}, 1).ok());
}

TEST_F(SegmentViewTest, FormatRejectsTooFewBytes) {
  std::vector<std::byte> small(SegmentSize(kLimits) - 1);
  Status s = SegmentView::Format(small, kLimits, {0}, 1).status();
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "9535 bytes is smaller than the 9536 needed")) << s.message();
}

TEST_F(SegmentViewTest, AttachRefusesBadMagic) {
  MustFormat();
  bytes_[3] = std::byte{'X'};
  Status s = AttachStatus(bytes_);
  EXPECT_EQ(s.code(), Code::kFailedPrecondition);
  EXPECT_TRUE(Contains(s.message(), "segment warmpool.test is not a warmpool segment (bad magic)"))
      << s.message();
  EXPECT_TRUE(Contains(s.message(), "pass another --instance")) << s.message();
}

TEST_F(SegmentViewTest, AttachRefusesOtherLayoutVersion) {
  SegmentView v = MustFormat();
  v.header().layout_version = kLayoutVersion + 1;
  Status s = AttachStatus(bytes_);
  EXPECT_EQ(s.code(), Code::kFailedPrecondition);
  EXPECT_TRUE(Contains(s.message(), fmt::format("made by layout {}, this binary expects {}",
                                                kLayoutVersion + 1, kLayoutVersion)))
      << s.message();
  EXPECT_TRUE(Contains(s.message(), "stop the old daemon or use binaries of the same version"))
      << s.message();

  v.header().layout_version = kLayoutVersion;
  v.header().header_size = 200;
  EXPECT_EQ(AttachStatus(bytes_).code(), Code::kFailedPrecondition);
  v.header().header_size = sizeof(SegmentHeader);
  EXPECT_TRUE(AttachStatus(bytes_).ok());
}

TEST_F(SegmentViewTest, AttachRefusesTruncatedBytes) {
  MustFormat();
  for (size_t n : {size_t{0}, size_t{100}, sizeof(SegmentHeader) - 1}) {
    Status s = AttachStatus(std::span<std::byte>(bytes_.data(), n));
    EXPECT_EQ(s.code(), Code::kFailedPrecondition) << n;
    EXPECT_TRUE(Contains(s.message(), "is " + std::to_string(n) + " bytes, too small")) << s.message();
    EXPECT_TRUE(Contains(s.message(), "rm /dev/shm/warmpool.test")) << s.message();
  }
}

TEST_F(SegmentViewTest, AttachRefusesSizeMismatch) {
  SegmentView v = MustFormat();
  Status s = AttachStatus(std::span<std::byte>(bytes_.data(), 1024));
  EXPECT_EQ(s.code(), Code::kFailedPrecondition);
  EXPECT_TRUE(Contains(s.message(), "inconsistent sizes (header says 9536 bytes, mapped 1024)"))
      << s.message();
  EXPECT_TRUE(Contains(s.message(), "remove /dev/shm/warmpool.test")) << s.message();

  // A header claiming more tables than the mapping holds.
  v.header().max_inflight = 1000;
  EXPECT_EQ(AttachStatus(bytes_).code(), Code::kFailedPrecondition);
  v.header().max_inflight = 8;
  v.header().workers_offset += 64;
  EXPECT_EQ(AttachStatus(bytes_).code(), Code::kFailedPrecondition);
  v.header().workers_offset -= 64;
  v.header().device_count = 0;
  EXPECT_EQ(AttachStatus(bytes_).code(), Code::kFailedPrecondition);
  v.header().device_count = 2;
  EXPECT_TRUE(AttachStatus(bytes_).ok());
}

}  // namespace
}  // namespace warmpool::shm
