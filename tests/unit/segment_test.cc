// The segment layout, SegmentView over a byte vector (a second view stands in for another process),
// and SharedSegment over a real POSIX shared-memory object.
#include "shm/segment.h"

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

namespace warmpool::shm {
namespace {

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST(LayoutTest, VersionStringIsPinned) {
  // Changing any struct below must bump kLayoutVersion and this string together.
  EXPECT_STREQ(kLayoutString, "warmpool-shm-v1:hdr192:model512:worker64:inflight32");
  EXPECT_EQ(kLayoutVersion, 1u);
  EXPECT_EQ(std::string(kMagic, 8), "WARMPOOL");
  EXPECT_EQ(kNil, 0xFFFFFFFFu);
}

TEST(LayoutTest, SizesAndOffsets) {
  EXPECT_EQ(sizeof(SegmentHeader), 192u);
  EXPECT_EQ(offsetof(SegmentHeader, magic), 0u);
  EXPECT_EQ(offsetof(SegmentHeader, layout_version), 8u);
  EXPECT_EQ(offsetof(SegmentHeader, header_size), 12u);
  EXPECT_EQ(offsetof(SegmentHeader, segment_size), 16u);
  EXPECT_EQ(offsetof(SegmentHeader, supervisor_pid), 64u);
  EXPECT_EQ(offsetof(SegmentHeader, lru_head), 76u);
  EXPECT_EQ(offsetof(SegmentHeader, device_budget_bytes), 88u);
  EXPECT_EQ(offsetof(SegmentHeader, device_used_bytes), 96u);
  EXPECT_EQ(sizeof(ModelRecord), 512u);
  EXPECT_EQ(offsetof(ModelRecord, state), 4u);
  EXPECT_EQ(offsetof(ModelRecord, name), 8u);
  EXPECT_EQ(offsetof(ModelRecord, engine), 72u);
  EXPECT_EQ(offsetof(ModelRecord, path), 88u);
  EXPECT_EQ(offsetof(ModelRecord, weight_bytes), 344u);
  EXPECT_EQ(offsetof(ModelRecord, lru_prev), 396u);
  EXPECT_EQ(offsetof(ModelRecord, last_error), 440u);
  EXPECT_EQ(sizeof(WorkerRecord), 64u);
  EXPECT_EQ(offsetof(WorkerRecord, generation), 12u);
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
  EXPECT_EQ(SegmentSize(Limits{1, 1, 1}), 832u);    // 192 | 704 | 768 | 800 -> 832
  EXPECT_EQ(SegmentSize(Limits{3, 3, 3}), 2048u);   // 192 | 1728 | 1920 | 2016 -> 2048
  EXPECT_EQ(SegmentSize(Limits{}), 165056u);        // 256 models, 16 workers, 1024 slots
  for (uint32_t n : {1u, 2u, 5u, 7u, 33u}) {
    EXPECT_EQ(SegmentSize(Limits{n, n, n}) % 64, 0u) << n;
  }
}

class SegmentViewTest : public ::testing::Test {
 protected:
  static constexpr Limits kLimits{4, 2, 8};
  std::vector<std::byte> bytes_ = std::vector<std::byte>(SegmentSize(kLimits));

  SegmentView MustFormat() {
    Result<SegmentView> v = SegmentView::Format(bytes_, kLimits, 2, 1 << 20, 4242);
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
  EXPECT_EQ(h.layout_version, 1u);
  EXPECT_EQ(h.header_size, 192u);
  EXPECT_EQ(h.segment_size, 2048u);
  EXPECT_EQ(h.max_models, 4u);
  EXPECT_EQ(h.max_workers, 2u);
  EXPECT_EQ(h.max_inflight, 8u);
  EXPECT_EQ(h.device_count, 2u);
  EXPECT_EQ(h.models_offset, 192u);
  EXPECT_EQ(h.workers_offset, 192u + 4 * 512);
  EXPECT_EQ(h.inflight_offset, 192u + 4 * 512 + 2 * 64);
  EXPECT_EQ(h.supervisor_pid, 4242);
  EXPECT_EQ(h.lru_head, kNil);
  EXPECT_EQ(h.lru_tail, kNil);
  EXPECT_EQ(h.lru_length, 0u);
  EXPECT_EQ(h.device_budget_bytes, 1u << 20);
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
            bytes_.data() + 192 + 4 * 512 + 2 * 64 + 8 * 32);
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
  bytes_.resize(4096);
  SegmentView v = MustFormat();
  EXPECT_EQ(v.header().segment_size, 4096u);
  EXPECT_TRUE(SegmentView::Attach(bytes_, "warmpool.test").ok());
}

