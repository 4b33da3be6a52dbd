// A model's KV pool as memory another process can map: one memfd holding every block's keys and
// values (engines/transformer/kv_cache.h KvPool), then a header and one record per block saying
// what the block holds — its tokens, how many of its positions are written, and the block before
// it in its sequence. The worker hands the memfd to the supervisor, which keeps it when the worker
// dies; a stream resumed elsewhere (wp_generate_request.kv_source) maps it read-only, finds its
// prompt and the tokens already sent in the records, and copies those positions' keys and values
// instead of computing them again.
//
// Why the records can be believed after a crash: the process that wrote them is dead when another
// reads them, so nothing changes under the reader; what must hold is that every record, at every
// instant, claims only positions whose keys and values are in place. A writer therefore lowers a
// record's count before it writes into the block (KvCache::Prepare: a block taken, rewritten or
// copied into) and raises it only after the whole pass wrote them (KvCache::Commit). Each update
// is bracketed by a version made odd first and even last, so one cut short by the crash leaves an
// odd version, and the reader skips that block. A record names its parent by block and generation
// (kv_blocks.h): a parent that took new content since no longer leads to it.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "engines/transformer/config.h"
#include "engines/transformer/kv_blocks.h"

namespace warmpool::transformer {

// A block whose keys and values, or its prefix's, were copied from a dead worker's region
// (KvCache::Import): they serve their own sequence, and a resume of it, but no prefix cache — an
// instance that adopts the region (KvPool::Adopt) keeps none of them.
inline constexpr uint32_t kKvRecordPrivate = 1;

struct KvRecord {
  std::atomic<uint32_t> version;  // odd while being rewritten
  uint32_t generation;            // the block's, when this was written
  uint32_t parent_block;          // KvLink::kNone: the first block of its sequence
  uint32_t parent_generation;
  uint32_t count;                 // positions 0 .. count - 1 hold `tokens`' keys and values
  uint32_t flags;                 // kKvRecordPrivate
  uint32_t reserved[2];
  int32_t tokens[kKvBlockTokens];
};
static_assert(sizeof(KvRecord) == 288);

class KvRegion {
 public:
  // A new region (a memfd, zero-filled, its pages the system's once first written) for `blocks`
  // blocks of `layers` x keys and values x kKvBlockTokens positions x kv_size elements (f32 or
  // bf16: `element`). Every record claims nothing. RESOURCE_EXHAUSTED when the memory cannot be had.
  static Result<KvRegion> Create(uint32_t layers, uint32_t kv_size, uint32_t blocks, KvElement element);
  // The header and records alone, for a pool whose keys and values live elsewhere in the same
  // layout (a GPU's memory: RowsAt still says where): data() is null. It is never exported itself:
  // its header and records are mirrored into the region that holds the floats (ImageWrites).
  static Result<KvRegion> CreateRecords(uint32_t layers, uint32_t kv_size, uint32_t blocks, KvElement element);
  // The bytes of a whole region (Create's) of this shape: a GPU's pool region is laid out so too.
  static uint64_t WholeBytes(uint32_t layers, uint32_t kv_size, uint32_t blocks, KvElement element);
  // Another process's region, mapped read-only: INVALID_ARGUMENT unless it is sealed against
  // resizing (Create seals it: nobody holding it can shrink it under a reader's mapping), its header
  // says it holds `blocks` blocks of this layout (layers, kv_size, element) — a pool like the
  // reader's own — and its size is what that makes.
  static Result<KvRegion> Open(int handle, uint64_t bytes, uint32_t layers, uint32_t kv_size, uint32_t blocks,
                               KvElement element);
  // The region of an instance of this model that ended cleanly (its model parked, a daemon
  // restarted), checked as Open checks it and mapped to be written: it becomes the caller's pool
  // (KvPool::Adopt), with a descriptor of its own (handle()) to export again.
  static Result<KvRegion> Adopt(int handle, uint64_t bytes, uint32_t layers, uint32_t kv_size, uint32_t blocks,
                                KvElement element);
  KvRegion() = default;
  KvRegion(KvRegion&& other) noexcept { *this = std::move(other); }
  KvRegion& operator=(KvRegion&& other) noexcept;
  ~KvRegion();

  int handle() const { return handle_; }  // -1 for an opened one (the caller keeps its own)
  uint64_t bytes() const { return bytes_; }
  uint32_t blocks() const { return blocks_; }
  KvElement element() const { return element_; }
  uint32_t element_bytes() const { return KvElementBytes(element_); }
  // The keys and values, elements of element(): null for a records-only region. Untyped, so that
  // nobody indexes it as floats where it holds bf16 (or bytes where it holds either).
  void* data() { return data_; }
  const void* data() const { return data_; }
  // Elements of one block (every layer's keys and values), and where a layer's keys (half 0) or
  // values (half 1) at `offset` in it begin, in elements: rows of kv_size, a position's after
  // another's.
  uint64_t BlockElements() const { return uint64_t{layers_} * 2 * kKvBlockTokens * kv_size_; }
  uint64_t RowsAt(uint32_t block, uint32_t layer, uint32_t half, uint32_t offset) const {
    return block * BlockElements() + ((uint64_t{layer} * 2 + half) * kKvBlockTokens + offset) * kv_size_;
  }

  // A records-only region (CreateRecords) is mirrored into the memory that holds its floats (a GPU's
  // pool region, which the supervisor keeps when this process dies): its header and records at the
  // offsets a whole region has them (ImageSpan). Describe marks what changed; ImageWrites says what
  // to write there, in this order, for the mirror to hold what the records say now — the header
  // once, then for each record changed its version made odd, its fields, and its version even
  // again, each step for every record before the next. A writer cut short anywhere in that order
  // leaves every mirrored record either as it was, as it is here, or odd (a reader skips it), so
  // the mirror keeps the promise the records keep: a record written out before a block is written
  // (KvCache::Prepare) claims only positions in place there. The pointers are into this region,
  // valid until the next Describe; ImageWritten says they are all in place.
  struct ImageWrite {
    uint64_t offset;  // in the whole region
    const void* bytes;
    uint64_t size;
  };
  std::vector<ImageWrite> ImageWrites() const;
  void ImageWritten();
  // Every record says it holds nothing (and is marked for the mirror).
  void ClaimNothing();
  // Where a whole region of this shape keeps its header and records: the span a mirror holds them
  // in, and FromImage reads them back from.
  struct Span {
    uint64_t offset;
    uint64_t bytes;
  };
  static Span ImageSpan(uint32_t layers, uint32_t kv_size, uint32_t blocks, KvElement element);
  // The header and records read back from such a mirror (ImageSpan's bytes, from another process's
  // pool region): a records-only region to find a sequence's blocks in (Longest). INVALID_ARGUMENT
  // when its size or header is not a pool of this shape's.
  static Result<KvRegion> FromImage(std::span<const uint8_t> image, uint32_t layers, uint32_t kv_size,
                                    uint32_t blocks, KvElement element);

  // The writer's side: block `self` holds `tokens` (at most kKvBlockTokens) at its first positions,
  // after `parent` in its sequence; `flags` kKvRecordPrivate when no prefix cache may keep it.
  void Describe(KvLink self, KvLink parent, std::span<const int32_t> tokens, uint32_t flags = 0);

  // A block's record as it stands, unless it claims nothing or was being rewritten when its writer
  // died.
  struct Standing {
    uint32_t block;
    uint32_t generation;
    KvLink parent;
    uint32_t count;
    uint32_t flags;
    std::span<const int32_t> tokens;  // count of them, in the vector Records returns them with
  };
  std::vector<Standing> Records(std::vector<int32_t>& tokens) const;

  struct Extent {
    uint32_t block;
    uint32_t count;  // positions of it taken
  };
  // The reader's side: the longest run of blocks, a sequence's from its first, that holds the first
  // positions of `tokens` (at most `most` of them): each but the last block full, the last maybe a
  // part of one. Records being rewritten when their writer died are skipped.
  std::vector<Extent> Longest(std::span<const int32_t> tokens, uint32_t most) const;

 private:
  static Result<KvRegion> Make(uint32_t layers, uint32_t kv_size, uint32_t blocks, KvElement element,
                               bool with_elements);
  static Result<KvRegion> Map(int handle, uint64_t bytes, uint32_t layers, uint32_t kv_size, uint32_t blocks,
                              KvElement element, bool writable);
  // Whether a header read from a region or an image says this shape.
  bool HeaderMatches(const void* header) const;
  static uint64_t RecordsOffset(uint64_t kv_bytes);
  KvRecord* records() const;
  int handle_ = -1;
  uint8_t* base_ = nullptr;
  uint64_t bytes_ = 0;
  uint8_t* data_ = nullptr;
  uint64_t kv_bytes_ = 0;
  uint32_t layers_ = 0;
  uint32_t kv_size_ = 0;
  uint32_t blocks_ = 0;
  KvElement element_ = KvElement::kF32;
  // Records-only: those changed since the mirror was last written (ImageWrites), and whether the
  // mirror has the header yet.
  std::vector<uint32_t> changed_;
  std::vector<uint8_t> is_changed_;
  bool header_written_ = false;
};

}  // namespace warmpool::transformer
