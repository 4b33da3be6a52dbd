// A model double that stands for the GPU (engines/transformer/gpu_sequence.h GpuModel) in the
// host-side tests of its continuous batching (gpu_slots_test) and of its KV pool's mirror
// (gpu_kv_mirror_test): its "pool" keeps, per block and position, the token whose keys and values a
// real model would store there, and each run's "logits" name a digest of the tokens it finds
// through the run's table at positions 0 to its last, as attention would read them. So a run
// answered with the digest of its own sequence's tokens was given a table that leads to exactly its
// history. Its pool's region holds the bytes written there (the records' mirror), and a check can
// run after every write into the region or its blocks: that every record the mirror holds then
// claims only tokens the blocks hold — what a reader would find if the process died right there.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engines/transformer/gpu_sequence.h"
#include "engines/transformer/gpu_step_check.h"
#include "engines/transformer/kv_region.h"

namespace warmpool::testing {

using transformer::Config;
using transformer::GpuModel;
using transformer::GpuPlan;
using transformer::GpuRun;
using transformer::kKvBlockTokens;

inline constexpr uint32_t kVocab = 1000;

inline Config SmallConfig() {
  Config c;
  c.vocab_size = kVocab;
  c.hidden_size = 8;
  c.intermediate_size = 16;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  return c;
}

// What a run's logits name: a digest of the tokens at positions 0 .. end - 1, in order.
inline int32_t Digest(std::span<const int32_t> history) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t t : history) h = (h ^ static_cast<uint64_t>(t)) * 1099511628211ull;
  return static_cast<int32_t>(h % kVocab);
}

class DeviceDouble final : public GpuModel {
 public:
  DeviceDouble(uint32_t context, uint32_t sequences, uint32_t blocks)
      : config_(SmallConfig()),
        context_(context),
        plan_(transformer::PlanGpu(config_, context, sequences, blocks)),
        cells_(uint64_t{blocks} * kKvBlockTokens, -1),
        image_(plan_.pool_bytes, 0),
        region_{this, plan_.pool_bytes, -1} {}
  DeviceDouble(const DeviceDouble& other) : DeviceDouble(other.context_, other.plan_.sequences, other.plan_.blocks) {
    cells_ = other.cells_;  // a dead process's pool, as it left it
    image_ = other.image_;
  }
  const Config& config() const override { return config_; }
  uint32_t context() const override { return context_; }
  const GpuPlan& plan() const override { return plan_; }

  Status Step(std::span<const int32_t> tokens, std::span<const GpuRun> runs, std::span<float> out,
              std::span<int32_t> argmax) override {
    // What the real model refuses: the host never asks it.
    if (Status s = transformer::CheckGpuStep(config_, plan_, context_, tokens, runs, out, argmax); !s.ok()) {
      ADD_FAILURE() << "a step the model refuses: " << s.ToString();
      return s;
    }
    if (fail_steps) return Status(Code::kInternal, "the device double fails its steps");
    steps++;
    // As the device: every row's keys and values stored, then every row's attention.
    uint64_t row = 0;
    for (const GpuRun& run : runs) {
      EXPECT_GE(run.table.size(), transformer::KvBlocksOf(run.start + run.rows)) << "a table short of the run";
      for (uint32_t p = run.start; p < run.start + run.rows; ++p) Cell(run.table, p) = tokens[row++];
    }
    for (size_t i = 0; i < runs.size(); ++i) {
      const GpuRun& run = runs[i];
      const uint32_t end = run.start + run.rows;
      std::vector<int32_t> seen;
      for (uint32_t p = 0; p < end; ++p) seen.push_back(Cell(run.table, p));
      const int32_t digest = Digest(seen);
      // A token this double takes for a model gone wrong: no logit that is a number.
      if (run.want == GpuRun::Want::kArgMax) argmax[i] = seen.back() == kBroken ? -1 : digest;
      if (run.want == GpuRun::Want::kLogits) {
        std::fill_n(out.begin() + i * kVocab, kVocab, 0.0f);
        out[i * kVocab + digest] = 1.0f;
      }
      if (run.want == GpuRun::Want::kHidden) out[i * config_.hidden_size] = static_cast<float>(digest);
    }
    EXPECT_EQ(row, tokens.size());
    CheckMirror("a step");
    return OkStatus();
  }
  Status CopyBlock(uint32_t from, uint32_t to) override {
    if (fail_copies) return Status(Code::kInternal, "the device double fails its copies");
    copies++;
    std::copy_n(cells_.begin() + uint64_t{from} * kKvBlockTokens, kKvBlockTokens,
                cells_.begin() + uint64_t{to} * kKvBlockTokens);
    CheckMirror("a block's copy");
    return OkStatus();
  }
  const wp_region& pool() const override { return region_; }
  Status WriteToPool(std::span<const transformer::KvRegion::ImageWrite> writes) override {
    if (fail_writes) return Status(Code::kInternal, "the device double fails its writes");
    for (const transformer::KvRegion::ImageWrite& w : writes) {
      // A call that fails part way: the writes before it landed.
      if (writes_before_failing == 0) return Status(Code::kInternal, "the device double fails its writes now");
      if (writes_before_failing > 0) writes_before_failing--;
      EXPECT_LE(w.offset + w.size, image_.size()) << "a write past the pool's region";
      if (w.offset + w.size > image_.size()) return Status(Code::kInternal, "a write past the region");
      // A copy the process dies in may land in part, in any order: its first half alone, or its
      // second, the mirror checked as a death there would leave it; then the whole, and checked.
      uint8_t* at = image_.data() + w.offset;
      const auto* bytes = static_cast<const uint8_t*>(w.bytes);
      if (w.size > sizeof(uint32_t)) {
        const std::vector<uint8_t> before(at, at + w.size);
        const uint64_t half = w.size / 2;
        std::memcpy(at, bytes, half);
        CheckMirror("the first half of a write into the records' mirror");
        std::memcpy(at, before.data(), w.size);
        std::memcpy(at + half, bytes + half, w.size - half);
        CheckMirror("the second half of a write into the records' mirror");
      }
      std::memcpy(at, bytes, w.size);
      // Into the blocks (a parked pool written back): the first float of a position's keys in
      // layer 0 stands for its token.
      const uint64_t kv_bytes = uint64_t{plan_.blocks} * plan_.block_floats * sizeof(float);
      if (w.offset < kv_bytes) {
        if (w.offset != 0 || w.size != kv_bytes) {
          ADD_FAILURE() << "the blocks are written whole";
          return Status(Code::kInternal, "a part of the blocks written");
        }
        const auto* floats = static_cast<const float*>(w.bytes);
        for (uint64_t cell = 0; cell < cells_.size(); ++cell) {
          cells_[cell] = static_cast<int32_t>(floats[TokenAt(cell / kKvBlockTokens, cell % kKvBlockTokens)]);
        }
        CheckMirror("the blocks written back");
      }
      region_writes++;
      CheckMirror("a write into the records' mirror");  // a death after any one write
    }
    return OkStatus();
  }
  // `source` is another double's pool() (a dead worker's): its cells at the rows' positions.
  Status CopyFromPool(const wp_region& source, std::span<const transformer::KvCache::Rows> rows) override {
    const auto& dead = *static_cast<const DeviceDouble*>(source.ptr);
    const uint64_t kv_size = config_.kv_size();
    for (const transformer::KvCache::Rows& r : rows) {
      EXPECT_EQ(r.from % kv_size, 0u);
      EXPECT_EQ(r.from % plan_.block_floats, r.to % plan_.block_floats) << "the same offsets in both blocks";
      const uint64_t offset = r.from % plan_.block_floats / kv_size % kKvBlockTokens;
      // Rows of one layer's keys or values, or a whole block (every layer's: its 64 positions).
      const uint64_t positions = r.elements == plan_.block_floats ? kKvBlockTokens : r.elements / kv_size;
      EXPECT_LE(offset + positions, kKvBlockTokens) << "rows within one block";
      for (uint64_t p = 0; p < positions; ++p) {
        cells_[r.to / plan_.block_floats * kKvBlockTokens + offset + p] =
            dead.cells_[r.from / plan_.block_floats * kKvBlockTokens + offset + p];
      }
    }
    rows_copied += rows.size();
    CheckMirror("a copy from a dead pool");
    return OkStatus();
  }
  // Where, in a whole region's floats, the double keeps a position's token (KvRegion::RowsAt).
  uint64_t TokenAt(uint64_t block, uint32_t offset) const {
    return block * plan_.block_floats + uint64_t{offset} * config_.kv_size();  // layer 0's keys
  }
  int32_t cell(uint64_t block, uint32_t offset) const { return cells_[block * kKvBlockTokens + offset]; }
  // The header and records of the pool region's mirror, as another process would read them.
  Result<transformer::KvRegion> Mirror() const {
    return transformer::KvRegion::FromImage(MirrorBytes(), config_.num_hidden_layers, config_.kv_size(), plan_.blocks,
                                            transformer::KvElement::kF32);
  }
  std::span<const uint8_t> MirrorBytes() const {
    const auto span = transformer::KvRegion::ImageSpan(config_.num_hidden_layers, config_.kv_size(), plan_.blocks,
                                                       transformer::KvElement::kF32);
    return {image_.data() + span.offset, span.bytes};
  }
  // Every record of the mirror claims only tokens its block holds (once the header is there).
  void CheckMirror(const char* after) {
    if (!check_mirror) return;
    Result<transformer::KvRegion> mirror = Mirror();
    if (!mirror.ok()) return;  // no header yet: a reader finds no pool, and reads nothing
    std::vector<int32_t> held;
    for (const transformer::KvRegion::Standing& s : mirror->Records(held)) {
      for (uint32_t i = 0; i < s.count; ++i) {
        if (cells_[uint64_t{s.block} * kKvBlockTokens + i] != s.tokens[i]) {
          ADD_FAILURE() << "after " << after << ", the mirror's record of block " << s.block << " claims token "
                        << s.tokens[i] << " at " << i << ", where the block holds "
                        << cells_[uint64_t{s.block} * kKvBlockTokens + i];
          mirror_violations++;
          return;
        }
      }
    }
  }
  std::string Describe() const override { return "the device double"; }

  int steps = 0;
  int copies = 0;
  int region_writes = 0;
  uint64_t rows_copied = 0;
  int mirror_violations = 0;
  bool fail_steps = false;
  bool fail_copies = false;
  bool fail_writes = false;
  int writes_before_failing = -1;  // >= 0: single writes into the region that land before all fail
  bool check_mirror = true;
  static constexpr int32_t kBroken = kVocab - 1;

 private:
  int32_t& Cell(std::span<const uint32_t> table, uint32_t position) {
    return cells_[uint64_t{table[position / kKvBlockTokens]} * kKvBlockTokens + position % kKvBlockTokens];
  }
  Config config_;
  uint32_t context_;
  GpuPlan plan_;
  std::vector<int32_t> cells_;
  std::vector<uint8_t> image_;  // the pool region's bytes as written (its floats stand in cells_)
  wp_region region_;
};

inline std::vector<int32_t> Tokens(uint32_t count, int32_t seed) {
  std::vector<int32_t> t(count);
  for (uint32_t i = 0; i < count; ++i) t[i] = static_cast<int32_t>((seed * 7919 + i * 104729) % kVocab);
  return t;
}

}  // namespace warmpool::testing
