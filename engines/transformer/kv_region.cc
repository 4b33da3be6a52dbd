#include "engines/transformer/kv_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <functional>
#include <map>
#include <utility>

#include "common/huge_pages.h"

namespace warmpool::transformer {

namespace {

constexpr uint64_t kMagic = 0x4c4f4f50564b5057ull;  // "WPKVPOOL"
// 2: the element's size in the header (a region of layout 1 held f32 and is refused: its pool's
// prefixes are computed again).
constexpr uint32_t kLayout = 2;

struct Header {
  uint64_t magic;
  uint32_t layout;
  uint32_t block_tokens;
  uint32_t layers;
  uint32_t kv_size;
  uint32_t blocks;
  uint32_t record_bytes;
  uint32_t element_bytes;
  uint8_t reserved[28];
};
static_assert(sizeof(Header) == 64);

uint64_t TotalBytes(uint64_t kv_bytes, uint32_t blocks) {
  return ((kv_bytes + 63) & ~uint64_t{63}) + sizeof(Header) + uint64_t{blocks} * sizeof(KvRecord);
}

}  // namespace

uint64_t KvRegion::RecordsOffset(uint64_t kv_bytes) { return ((kv_bytes + 63) & ~uint64_t{63}) + sizeof(Header); }

uint64_t KvRegion::WholeBytes(uint32_t layers, uint32_t kv_size, uint32_t blocks, KvElement element) {
  return TotalBytes(uint64_t{blocks} * layers * 2 * kKvBlockTokens * kv_size * KvElementBytes(element), blocks);
}

KvRegion::Span KvRegion::ImageSpan(uint32_t layers, uint32_t kv_size, uint32_t blocks, KvElement element) {
  const uint64_t kv_bytes = uint64_t{blocks} * layers * 2 * kKvBlockTokens * kv_size * KvElementBytes(element);
  const uint64_t header = RecordsOffset(kv_bytes) - sizeof(Header);
  return {header, TotalBytes(kv_bytes, blocks) - header};
}

KvRecord* KvRegion::records() const { return reinterpret_cast<KvRecord*>(base_ + RecordsOffset(kv_bytes_)); }

Result<KvRegion> KvRegion::Create(uint32_t layers, uint32_t kv_size, uint32_t blocks, KvElement element) {
  return Make(layers, kv_size, blocks, element, /*with_elements=*/true);
}

Result<KvRegion> KvRegion::CreateRecords(uint32_t layers, uint32_t kv_size, uint32_t blocks, KvElement element) {
  return Make(layers, kv_size, blocks, element, /*with_elements=*/false);
}

bool KvRegion::HeaderMatches(const void* bytes) const {
  Header header;
  std::memcpy(&header, bytes, sizeof(header));
  return header.magic == kMagic && header.layout == kLayout && header.block_tokens == kKvBlockTokens &&
         header.layers == layers_ && header.kv_size == kv_size_ && header.blocks == blocks_ &&
         header.record_bytes == sizeof(KvRecord) && header.element_bytes == element_bytes();
}

Result<KvRegion> KvRegion::Make(uint32_t layers, uint32_t kv_size, uint32_t blocks, KvElement element,
                                bool with_elements) {
  KvRegion r;
  r.layers_ = layers;
  r.kv_size_ = kv_size;
  r.blocks_ = blocks;
  r.element_ = element;
  r.kv_bytes_ = with_elements ? blocks * r.BlockElements() * r.element_bytes() : 0;
  r.bytes_ = TotalBytes(r.kv_bytes_, blocks);
  r.handle_ = memfd_create("warmpool-kv-cache", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (r.handle_ < 0 || ftruncate(r.handle_, static_cast<off_t>(r.bytes_)) != 0 ||
      fcntl(r.handle_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return Error(Code::kResourceExhausted, "no memory for a KV cache of {} blocks ({} bytes): {}", blocks, r.bytes_,
                 std::strerror(errno));
  }
  // A memfd's pages are the system's once first written (free blocks are taken lowest first, so a
  // lightly used pool touches its start only); admission counts the whole pool either way.
  void* base = MapShared(r.handle_, r.bytes_, PROT_READ | PROT_WRITE);
  if (base == MAP_FAILED) {
    return Error(Code::kResourceExhausted, "no address space for a KV cache of {} bytes", r.bytes_);
  }
  r.base_ = static_cast<uint8_t*>(base);
  r.data_ = with_elements ? r.base_ : nullptr;
  Header* header = reinterpret_cast<Header*>(r.base_ + RecordsOffset(r.kv_bytes_) - sizeof(Header));
  *header = Header{kMagic, kLayout, kKvBlockTokens, layers, kv_size, blocks, sizeof(KvRecord), r.element_bytes(), {}};
  // Zero-filled records claim nothing (count 0, version 0).
  if (!with_elements) r.is_changed_.assign(blocks, 0);
  return r;
}

std::vector<KvRegion::ImageWrite> KvRegion::ImageWrites() const {
  std::vector<ImageWrite> writes;
  if (data_ != nullptr || base_ == nullptr) return writes;  // a whole region is its own image
  const Span span = ImageSpan(layers_, kv_size_, blocks_, element_);
  const uint64_t records_at = span.offset + sizeof(Header);
  if (!header_written_) writes.push_back({span.offset, base_ + RecordsOffset(kv_bytes_) - sizeof(Header), sizeof(Header)});
  static constexpr uint32_t kOdd = 1;
  for (uint32_t b : changed_) writes.push_back({records_at + uint64_t{b} * sizeof(KvRecord), &kOdd, sizeof(kOdd)});
  constexpr uint64_t kFields = sizeof(KvRecord) - sizeof(uint32_t);  // all but the version, which leads
  static_assert(offsetof(KvRecord, generation) == sizeof(uint32_t));
  for (uint32_t b : changed_) {
    writes.push_back({records_at + uint64_t{b} * sizeof(KvRecord) + sizeof(uint32_t), &records()[b].generation, kFields});
  }
  for (uint32_t b : changed_) {
    writes.push_back({records_at + uint64_t{b} * sizeof(KvRecord), &records()[b].version, sizeof(uint32_t)});
  }
  return writes;
}

void KvRegion::ClaimNothing() {
  for (uint32_t b = 0; b < blocks_; ++b) Describe({b, 0}, {KvLink::kNone, 0}, {});
}

void KvRegion::ImageWritten() {
  header_written_ = true;
  for (uint32_t b : changed_) is_changed_[b] = 0;
  changed_.clear();
}

Result<KvRegion> KvRegion::FromImage(std::span<const uint8_t> image, uint32_t layers, uint32_t kv_size,
                                     uint32_t blocks, KvElement element) {
  if (image.size() != ImageSpan(layers, kv_size, blocks, element).bytes) {
    return Error(Code::kInvalidArgument, "a KV region's records of {} bytes are not {} blocks' of this model's",
                 image.size(), blocks);
  }
  Result<KvRegion> r = Make(layers, kv_size, blocks, element, /*with_elements=*/false);
  if (!r.ok()) return r.status();
  if (!r->HeaderMatches(image.data())) {
    return Error(Code::kInvalidArgument, "the KV region is not this model's (its header differs)");
  }
  std::memcpy(r->base_ + RecordsOffset(0) - sizeof(Header), image.data(), image.size());
  r->is_changed_.clear();  // read back to be read, never mirrored again
  return r;
}

Result<KvRegion> KvRegion::Open(int handle, uint64_t bytes, uint32_t layers, uint32_t kv_size, uint32_t blocks,
                                KvElement element) {
  return Map(handle, bytes, layers, kv_size, blocks, element, /*writable=*/false);
}

Result<KvRegion> KvRegion::Adopt(int handle, uint64_t bytes, uint32_t layers, uint32_t kv_size, uint32_t blocks,
                                 KvElement element) {
  return Map(handle, bytes, layers, kv_size, blocks, element, /*writable=*/true);
}

Result<KvRegion> KvRegion::Map(int handle, uint64_t bytes, uint32_t layers, uint32_t kv_size, uint32_t blocks,
                               KvElement element, bool writable) {
  KvRegion r;
  r.layers_ = layers;
  r.kv_size_ = kv_size;
  r.element_ = element;
  const uint64_t block_bytes = r.BlockElements() * r.element_bytes();
  // As many blocks as the reader's own pool: what it reads is bounded by what it holds itself.
  if (TotalBytes(blocks * block_bytes, blocks) != bytes) {
    return Error(Code::kInvalidArgument, "a KV region of {} bytes is not {} blocks of this model's", bytes, blocks);
  }
  // Read past its end, a mapping faults (SIGBUS): the file must be as large as said.
  struct stat st{};
  if (fstat(handle, &st) != 0 || static_cast<uint64_t>(st.st_size) != bytes) {
    return Error(Code::kInvalidArgument, "the KV region's file is not the {} bytes said", bytes);
  }
  const int seals = fcntl(handle, F_GET_SEALS);
  if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
    return Error(Code::kInvalidArgument, "the KV region can be resized under its readers (it is not sealed)");
  }
  void* base = MapShared(handle, bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ);
  if (base == MAP_FAILED) return Error(Code::kInvalidArgument, "cannot map a KV region: {}", std::strerror(errno));
  r.base_ = static_cast<uint8_t*>(base);
  r.bytes_ = bytes;
  r.blocks_ = blocks;
  r.kv_bytes_ = blocks * block_bytes;
  r.data_ = r.base_;
  if (!r.HeaderMatches(r.base_ + RecordsOffset(r.kv_bytes_) - sizeof(Header))) {
    return Error(Code::kInvalidArgument, "the KV region is not this model's (its header differs)");
  }
  if (writable) {
    r.handle_ = fcntl(handle, F_DUPFD_CLOEXEC, 0);
    if (r.handle_ < 0) return Error(Code::kResourceExhausted, "no descriptor for a KV region: {}", std::strerror(errno));
  }
  return r;
}

KvRegion& KvRegion::operator=(KvRegion&& other) noexcept {
  if (this == &other) return *this;
  // What this one holds let go by hand: not by its destructor, after which no member may be
  // assigned (the vectors below would free their buffers twice).
  if (base_ != nullptr) munmap(base_, bytes_);
  if (handle_ >= 0) close(handle_);
  handle_ = std::exchange(other.handle_, -1);
  base_ = std::exchange(other.base_, nullptr);
  bytes_ = std::exchange(other.bytes_, 0);
  data_ = std::exchange(other.data_, nullptr);
  kv_bytes_ = other.kv_bytes_;
  changed_ = std::move(other.changed_);
  is_changed_ = std::move(other.is_changed_);
  header_written_ = other.header_written_;
  layers_ = other.layers_;
  kv_size_ = other.kv_size_;
  blocks_ = other.blocks_;
  element_ = other.element_;
  return *this;
}

KvRegion::~KvRegion() {
  if (base_ != nullptr) munmap(base_, bytes_);
  if (handle_ >= 0) close(handle_);
  base_ = nullptr;
  handle_ = -1;
}

void KvRegion::Describe(KvLink self, KvLink parent, std::span<const int32_t> tokens, uint32_t flags) {
  KvRecord& r = records()[self.block];
  const uint32_t version = r.version.load(std::memory_order_relaxed);
  // Said already (a decoding sequence's block, lowered before a step to the positions it holds):
  // nothing to write, here or into a mirror. Only this process writes its records.
  if (version % 2 == 0 && r.generation == self.generation && r.parent_block == parent.block &&
      r.parent_generation == parent.generation && r.count == tokens.size() && r.flags == flags &&
      std::equal(tokens.begin(), tokens.end(), r.tokens)) {
    return;
  }
  r.version.store(version | 1u, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);  // odd before any field changes
  r.generation = self.generation;
  r.parent_block = parent.block;
  r.parent_generation = parent.generation;
  r.count = static_cast<uint32_t>(tokens.size());
  r.flags = flags;
  std::copy(tokens.begin(), tokens.end(), r.tokens);
  r.version.store((version | 1u) + 1, std::memory_order_release);
  // A record lowered before a write into its block must be in memory before that write is.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (self.block < is_changed_.size() && !is_changed_[self.block]) {
    is_changed_[self.block] = 1;
    changed_.push_back(self.block);
  }
}

std::vector<KvRegion::Standing> KvRegion::Records(std::vector<int32_t>& tokens) const {
  std::vector<Standing> standing;
  tokens.assign(uint64_t{blocks_} * kKvBlockTokens, 0);
  for (uint32_t b = 0; b < blocks_; ++b) {
    const KvRecord& r = records()[b];
    const uint32_t before = r.version.load(std::memory_order_acquire);
    if (before % 2 != 0) continue;  // its writer died rewriting it
    const uint32_t count = std::min<uint32_t>(r.count, kKvBlockTokens);
    if (count == 0) continue;
    Standing seen{b, r.generation, {r.parent_block, r.parent_generation}, count, r.flags, {}};
    int32_t* mine = tokens.data() + uint64_t{b} * kKvBlockTokens;
    std::copy(r.tokens, r.tokens + count, mine);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (r.version.load(std::memory_order_relaxed) != before) continue;
    seen.tokens = std::span<const int32_t>(mine, count);
    standing.push_back(seen);
  }
  return standing;
}

std::vector<KvRegion::Extent> KvRegion::Longest(std::span<const int32_t> tokens, uint32_t most) const {
  most = static_cast<uint32_t>(std::min<uint64_t>(most, tokens.size()));
  // Each block's record as it stands, by the link it names: a block's children, from the root.
  std::vector<int32_t> held;
  std::multimap<std::pair<uint32_t, uint32_t>, Standing> children;
  for (const Standing& s : Records(held)) children.emplace(std::pair{s.parent.block, s.parent.generation}, s);
  // The longest run from the root: several blocks may hold the same tokens after the same parent
  // (sequences that computed one prefix each), and only one of them may lead on, so every match
  // is followed. A block sits at one depth (its record names one parent): its best is kept.
  std::vector<int64_t> best_from(blocks_, -1);  // positions from a block on, its own included
  std::vector<uint32_t> next(blocks_, KvLink::kNone);
  auto matched = [&](const Standing& s, uint32_t at) {
    const uint32_t want = std::min(s.count, most - at);
    const int32_t* mine = s.tokens.data();
    uint32_t same = 0;
    // A position's keys and values depend on the tokens up to it alone: the block's first `same`
    // are this run's even where its later ones are not.
    while (same < want && mine[same] == tokens[at + same]) same++;
    return same;
  };
  std::function<uint32_t(std::pair<uint32_t, uint32_t>, uint32_t, uint32_t*)> longest =
      [&](std::pair<uint32_t, uint32_t> parent, uint32_t at, uint32_t* chosen) -> uint32_t {
    uint32_t best = 0;
    *chosen = KvLink::kNone;
    if (at >= most) return 0;
    auto [first, last] = children.equal_range(parent);
    for (auto it = first; it != last; ++it) {
      const Standing& s = it->second;
      if (best_from[s.block] < 0) {
        const uint32_t own = matched(s, at);
        uint32_t after = 0;
        if (own == kKvBlockTokens) after = longest({s.block, s.generation}, at + own, &next[s.block]);
        best_from[s.block] = own == 0 ? 0 : own + after;
      }
      if (static_cast<uint32_t>(best_from[s.block]) > best) {
        best = static_cast<uint32_t>(best_from[s.block]);
        *chosen = s.block;
      }
    }
    return best;
  };
  std::vector<Extent> run;
  uint32_t block = KvLink::kNone;
  uint32_t total = longest({KvLink::kNone, 0}, 0, &block);
  for (uint32_t at = 0; block != KvLink::kNone && at < total; block = next[block]) {
    const uint32_t count = std::min<uint32_t>(kKvBlockTokens, total - at);
    run.push_back({block, count});
    at += count;
  }
  return run;
}

}  // namespace warmpool::transformer
