#include "engines/safetensors.h"

#include <sys/stat.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engines/half.h"
#include "tests/unit/temp_dir.h"

namespace warmpool::safetensors {
namespace {

// The bytes of a safetensors file: length prefix, json, then data_bytes of data.
std::vector<uint8_t> RawFile(const std::string& json, uint64_t data_bytes) {
  std::vector<uint8_t> bytes(8);
  const uint64_t length = json.size();
  std::memcpy(bytes.data(), &length, 8);
  bytes.insert(bytes.end(), json.begin(), json.end());
  bytes.resize(bytes.size() + data_bytes, 0xab);
  return bytes;
}

Result<Header> Parse(const std::string& json, uint64_t data_bytes) {
  std::vector<uint8_t> bytes = RawFile(json, data_bytes);
  return ParseHeader(bytes, bytes.size(), "p");
}

#define EXPECT_INVALID(result, substring)                                              \
  do {                                                                                 \
    const auto& r_ = (result);                                                         \
    ASSERT_FALSE(r_.ok());                                                             \
    EXPECT_EQ(r_.status().code(), Code::kInvalidArgument) << r_.status().ToString();   \
    EXPECT_NE(r_.status().message().find(substring), std::string::npos)                \
        << "message: " << r_.status().message();                                       \
  } while (0)

using warmpool::testing::TempDir;

void WriteBytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// ---- malformed files, one case per test ----

TEST(SafetensorsParse, FileShorterThanLengthPrefix) {
  std::vector<uint8_t> bytes(5, 0);
  EXPECT_INVALID(ParseHeader(bytes, bytes.size(), "p"), "too short");
}

TEST(SafetensorsParse, HeaderLengthZero) {
  std::vector<uint8_t> bytes(16, 0);
  EXPECT_INVALID(ParseHeader(bytes, bytes.size(), "p"), "header length is 0");
}

TEST(SafetensorsParse, HeaderLengthOverLimit) {
  std::vector<uint8_t> bytes(8);
  const uint64_t length = kMaxHeaderBytes + 1;
  std::memcpy(bytes.data(), &length, 8);
  EXPECT_INVALID(ParseHeader(bytes, 1ull << 40, "p"), "exceeds");
}

TEST(SafetensorsParse, HeaderLengthBeyondFile) {
  std::vector<uint8_t> bytes = RawFile("{}", 0);
  EXPECT_INVALID(ParseHeader(bytes, 9, "p"), "runs past the end of the 9-byte file");
}

TEST(SafetensorsParse, PrefixTooShortForHeader) {
  std::vector<uint8_t> bytes = RawFile("{}      ", 0);
  EXPECT_INVALID(ParseHeader(std::span(bytes).first(8), bytes.size(), "p"), "the header needs 16");
}

TEST(SafetensorsParse, PrefixTooShortForLength) {
  std::vector<uint8_t> bytes = RawFile("{}", 0);
  EXPECT_INVALID(ParseHeader(std::span(bytes).first(4), bytes.size(), "p"), "the header length needs 8");
}

TEST(SafetensorsParse, NotJson) { EXPECT_INVALID(Parse("{\"a\": ", 0), "not valid JSON"); }

TEST(SafetensorsParse, JsonNotAnObject) { EXPECT_INVALID(Parse("[1, 2]", 0), "must be a JSON object, got array"); }

TEST(SafetensorsParse, MetadataNotAnObject) {
  EXPECT_INVALID(Parse(R"({"__metadata__": "x"})", 0), "__metadata__ must be an object");
}

TEST(SafetensorsParse, MetadataValueNotString) {
  EXPECT_INVALID(Parse(R"({"__metadata__": {"a": 1}})", 0), "__metadata__ \"a\" must be a string");
}

TEST(SafetensorsParse, TensorEntryNotAnObject) {
  EXPECT_INVALID(Parse(R"({"t": [1]})", 0), "tensor \"t\": entry must be an object");
}

TEST(SafetensorsParse, UnknownDType) {
  EXPECT_INVALID(Parse(R"({"t": {"dtype": "F8_E4M3", "shape": [1], "data_offsets": [0, 1]}})", 1),
                 "unknown dtype \"F8_E4M3\"");
}

TEST(SafetensorsParse, DTypeNotAString) {
  EXPECT_INVALID(Parse(R"({"t": {"dtype": 4, "shape": [1], "data_offsets": [0, 4]}})", 4), "unknown dtype 4");
}

TEST(SafetensorsParse, MissingKey) {
  EXPECT_INVALID(Parse(R"({"t": {"dtype": "F32", "data_offsets": [0, 4]}})", 4), "missing \"shape\"");
}

TEST(SafetensorsParse, UnknownKeyInTensorEntry) {
  EXPECT_INVALID(Parse(R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "extra": 1}})", 4),
                 "unknown key \"extra\"");
}

TEST(SafetensorsParse, ShapeNotAnArray) {
  EXPECT_INVALID(Parse(R"({"t": {"dtype": "F32", "shape": 3, "data_offsets": [0, 12]}})", 12),
                 "shape must be an array");
}

TEST(SafetensorsParse, NegativeDimension) {
  EXPECT_INVALID(Parse(R"({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4),
                 "non-negative integers, got -1");
}

TEST(SafetensorsParse, FractionalDimension) {
  EXPECT_INVALID(Parse(R"({"t": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4),
                 "non-negative integers, got 1.5");
}

TEST(SafetensorsParse, ShapeByteSizeOverflows) {
  EXPECT_INVALID(Parse(R"({"t": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 4]}})", 4),
                 "overflows 64 bits");
}

TEST(SafetensorsParse, DeeplyNestedShapeIsRejectedWithoutRecursing) {
  const std::string nested = std::string(200000, '[') + std::string(200000, ']');
  EXPECT_INVALID(Parse(R"({"t": {"dtype": "F32", "shape": [)" + nested + R"(], "data_offsets": [0, 4]}})", 4),
                 "non-negative integers, got array");
}

TEST(SafetensorsParse, LongValuesAreShortenedInMessages) {
  Result<Header> header = Parse(R"({"t": {"dtype": ")" + std::string(1000, 'X') + R"(", "shape": [1], "data_offsets": [0, 4]}})", 4);
  EXPECT_INVALID(header, "XXX...");
  EXPECT_LT(header.status().message().size(), 300u);
}

TEST(SafetensorsParse, DataOffsetsNotAPair) {
  EXPECT_INVALID(Parse(R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [4]}})", 4),
                 "data_offsets must be [begin, end]");
}

TEST(SafetensorsParse, DataOffsetsNegative) {
  EXPECT_INVALID(Parse(R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", 4),
                 "data_offsets must be [begin, end]");
}

TEST(SafetensorsParse, DataOffsetsReversed) {
  EXPECT_INVALID(Parse(R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})", 4),
                 "end before they begin");
}

TEST(SafetensorsParse, DataOffsetsDisagreeWithShape) {
  Result<Header> header = Parse(R"({"0.weight": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 40]}})", 40);
  ASSERT_FALSE(header.ok());
  EXPECT_EQ(header.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(header.status().message(),
            "model file \"p\": tensor \"0.weight\": data_offsets [0, 40) hold 40 bytes but shape [3, 4] of F32 needs 48");
}

TEST(SafetensorsParse, DataOffsetsBeyondFile) {
  EXPECT_INVALID(Parse(R"({"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 12),
                 "run past the end of the 12-byte data area");
}

TEST(SafetensorsParse, TensorsOverlap) {
  EXPECT_INVALID(Parse(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                           "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 12),
                 "tensor \"b\": data_offsets [4, 12) overlap tensor \"a\" [0, 8)");
}

TEST(SafetensorsParse, HoleInDataArea) {
  EXPECT_INVALID(Parse(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                           "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})", 12),
                 "leave a hole after byte 4");
}

TEST(SafetensorsParse, TrailingBytesAfterTensors) {
  EXPECT_INVALID(Parse(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 8),
                 "trailing bytes");
}

// ---- well-formed headers ----

TEST(SafetensorsParse, ValidHeaderIsSortedAndSized) {
  Result<Header> header = Parse(R"({"__metadata__": {"activation": "gelu", "note": ""},
      "late": {"dtype": "BF16", "shape": [3], "data_offsets": [8, 14]},
      "early": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "empty": {"dtype": "U8", "shape": [0, 5], "data_offsets": [14, 14]},
      "scalar": {"dtype": "I64", "shape": [], "data_offsets": [14, 22]}})", 22);
  ASSERT_TRUE(header.ok()) << header.status().ToString();
  ASSERT_EQ(header->tensors.size(), 4u);
  EXPECT_EQ(header->tensors[0].name, "early");
  EXPECT_EQ(header->tensors[1].name, "late");
  EXPECT_EQ(header->data_bytes, 22u);
  EXPECT_EQ(header->data_offset, 8 + header->header_len);
  EXPECT_EQ(header->metadata.at("activation"), "gelu");
  EXPECT_EQ(header->metadata.at("note"), "");
  const TensorInfo* late = header->Find("late");
  ASSERT_NE(late, nullptr);
  EXPECT_EQ(late->dtype, DType::BF16);
  EXPECT_EQ(late->shape, std::vector<uint64_t>{3});
  EXPECT_EQ(late->numel(), 3u);
  EXPECT_EQ(header->Find("scalar")->numel(), 1u);
  EXPECT_EQ(header->Find("empty")->numel(), 0u);
  EXPECT_EQ(header->Find("missing"), nullptr);
}

TEST(SafetensorsParse, HeaderPaddedWithSpaces) {
  Result<Header> header = Parse(R"({"t": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}}     )", 4);
  ASSERT_TRUE(header.ok()) << header.status().ToString();
  EXPECT_EQ(header->tensors.size(), 1u);
}

TEST(SafetensorsParse, EmptyFileHeaderHasNoTensors) {
  Result<Header> header = Parse("{}", 0);
  ASSERT_TRUE(header.ok()) << header.status().ToString();
  EXPECT_TRUE(header->tensors.empty());
  EXPECT_EQ(header->data_bytes, 0u);
}

TEST(SafetensorsDType, NamesAndSizes) {
  EXPECT_EQ(DTypeName(DType::BF16), "BF16");
  EXPECT_EQ(DTypeSize(DType::F64), 8u);
  EXPECT_EQ(DTypeSize(DType::F16), 2u);
  EXPECT_EQ(DTypeSize(DType::BOOL), 1u);
  EXPECT_EQ(DTypeFromName("I32"), DType::I32);
  EXPECT_EQ(DTypeFromName("f32"), std::nullopt);
}

// ---- files on disk ----

TEST(SafetensorsFile, MissingFileIsNotFound) {
  Result<Header> header = ReadHeader("/nonexistent/model.safetensors");
  ASSERT_FALSE(header.ok());
  EXPECT_EQ(header.status().code(), Code::kNotFound);
  EXPECT_NE(header.status().message().find("/nonexistent/model.safetensors"), std::string::npos);
}

TEST(SafetensorsFile, DirectoryIsRejected) {
  TempDir dir;
  std::filesystem::create_directory(dir.File("d"));
  EXPECT_INVALID(ReadHeader(dir.File("d")), "not a regular file");
}

TEST(SafetensorsFile, ShortFileOnDisk) {
  TempDir dir;
  WriteBytes(dir.File("short"), {1, 2, 3});
  EXPECT_INVALID(ReadHeader(dir.File("short")), "file is 3 bytes, too short");
}

TEST(SafetensorsFile, GarbageLengthIsRejectedWithoutReadingIt) {
  TempDir dir;
  std::vector<uint8_t> bytes(64, 0xff);
  WriteBytes(dir.File("garbage"), bytes);
  EXPECT_INVALID(ReadHeader(dir.File("garbage")), "exceeds");
}

TEST(SafetensorsFile, TruncatedFileOnDisk) {
  TempDir dir;
  std::vector<uint8_t> bytes = RawFile(R"({"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 16);
  bytes.resize(bytes.size() - 4);
  WriteBytes(dir.File("truncated"), bytes);
  EXPECT_INVALID(ReadHeader(dir.File("truncated")), "file truncated?");
}

TEST(SafetensorsFile, WriteThenReadRoundTrip) {
  TempDir dir;
  std::vector<float> weights = {1.0f, -2.5f, 3.25f, 0.0f, 7.0f, -1.0f};
  std::vector<uint8_t> weight_bytes(weights.size() * 4);
  std::memcpy(weight_bytes.data(), weights.data(), weight_bytes.size());
  std::vector<TensorToWrite> tensors = {
      {"0.weight", DType::F32, {2, 3}, weight_bytes},
      {"0.bias", DType::F16, {3}, std::vector<uint8_t>(6, 0x11)},
      {"flag", DType::BOOL, {1}, {1}},
  };
  const std::string path = dir.File("model.safetensors");
  ASSERT_TRUE(WriteFile(path, tensors, {{"activation", "tanh"}, {"engine", "dense"}}).ok());

  Result<Header> header = ReadHeader(path);
  ASSERT_TRUE(header.ok()) << header.status().ToString();
  EXPECT_EQ(header->data_offset % 8, 0u) << "header is padded to 8-byte alignment";
  EXPECT_EQ(header->data_bytes, 24u + 6u + 1u);
  EXPECT_EQ(header->file_size, header->data_offset + header->data_bytes);
  EXPECT_EQ(header->metadata, (std::map<std::string, std::string>{{"activation", "tanh"}, {"engine", "dense"}}));
  ASSERT_EQ(header->tensors.size(), 3u);
  EXPECT_EQ(header->tensors[0].name, "0.weight");  // written order is offset order
  EXPECT_EQ(header->tensors[1].name, "0.bias");
  EXPECT_EQ(header->Find("0.bias")->dtype, DType::F16);
  EXPECT_EQ(header->Find("0.weight")->shape, (std::vector<uint64_t>{2, 3}));

  std::ifstream in(path, std::ios::binary);
  std::vector<char> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const TensorInfo* weight = header->Find("0.weight");
  std::vector<float> read_back(weights.size());
  std::memcpy(read_back.data(), file.data() + header->data_offset + weight->begin, weight->bytes());
  EXPECT_EQ(read_back, weights);
}

TEST(SafetensorsFile, WriteWithoutMetadataOmitsIt) {
  TempDir dir;
  const std::string path = dir.File("plain.safetensors");
  ASSERT_TRUE(WriteFile(path, {{"x", DType::I32, {1}, {1, 0, 0, 0}}}, {}).ok());
  Result<Header> header = ReadHeader(path);
  ASSERT_TRUE(header.ok()) << header.status().ToString();
  EXPECT_TRUE(header->metadata.empty());
}

TEST(SafetensorsFile, WriteRejectsDataOfWrongSize) {
  TempDir dir;
  Status status = WriteFile(dir.File("bad"), {{"x", DType::F32, {2}, {0, 0, 0, 0}}}, {});
  EXPECT_EQ(status.code(), Code::kInvalidArgument);
  EXPECT_NE(status.message().find("has 4 bytes of data but shape [2] of F32 needs 8"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir.File("bad")));
}

TEST(SafetensorsFile, WriteRejectsDuplicateNames) {
  TempDir dir;
  Status status = WriteFile(dir.File("bad"), {{"x", DType::U8, {1}, {0}}, {"x", DType::U8, {1}, {0}}}, {});
  EXPECT_EQ(status.code(), Code::kInvalidArgument);
  EXPECT_NE(status.message().find("appears twice"), std::string::npos);
}

TEST(SafetensorsFile, WriteIntoMissingDirectoryFails) {
  Status status = WriteFile("/nonexistent/dir/x.safetensors", {}, {});
  EXPECT_EQ(status.code(), Code::kNotFound);
}

// ---- 16-bit float conversions ----

// Strict UTF-8, as protobuf checks string fields when it parses them.
bool IsValidUtf8(const std::string& text) {
  for (size_t i = 0; i < text.size();) {
    const auto lead = static_cast<unsigned char>(text[i]);
    const size_t n = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3 : (lead >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > text.size()) return false;
    uint32_t cp = n == 1 ? lead : n == 2 ? lead & 0x1Fu : n == 3 ? lead & 0x0Fu : lead & 0x07u;
    for (size_t k = 1; k < n; k++) {
      const auto c = static_cast<unsigned char>(text[i + k]);
      if ((c >> 6) != 0x2) return false;
      cp = cp << 6 | (c & 0x3Fu);
    }
    const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

// Found by fuzz_safetensors: the JSON parser's message quotes the bytes it stopped at, here a lone
// 0x84 in a key. Refusals become a model's last_error, which clients receive in protobuf strings;
// one invalid byte there made every models, ps and status reply unreadable.
TEST(SafetensorsParse, InvalidUtf8InHeaderGivesAValidUtf8Message) {
  const std::string json = "{\"0.weight\":{\"dtype\":\"F8\",\"sh\x84pe\":[1],\"data_offsets\":[0,1]}}";
  Result<Header> header = Parse(json, 1);
  EXPECT_INVALID(header, "header is not valid JSON");
  EXPECT_TRUE(IsValidUtf8(header.status().message())) << header.status().message();
  EXPECT_NE(header.status().message().find("last read: '\"sh?'"), std::string::npos)
      << header.status().message();
}

// Shortening a long value must not cut a character in two.
TEST(SafetensorsParse, ShortenedValuesStayValidUtf8) {
  std::string e_acute = "\xc3\xa9";
  std::string dtype = "x";  // puts the 61-byte cut in the middle of an e-acute
  for (int i = 0; i < 100; i++) dtype += e_acute;
  Result<Header> header = Parse(R"({"t": {"dtype": ")" + dtype + R"(", "shape": [1], "data_offsets": [0, 4]}})", 4);
  EXPECT_INVALID(header, "unknown dtype");
  EXPECT_TRUE(IsValidUtf8(header.status().message())) << header.status().message();
  EXPECT_NE(header.status().message().find(e_acute + "?..."), std::string::npos) << header.status().message();
  // Valid UTF-8 in names is quoted as it is.
  header = Parse("{\"\xc3\xa9t\xc3\xa9\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 4]}}", 4);
  EXPECT_INVALID(header, "tensor \"\xc3\xa9t\xc3\xa9\": data_offsets [0, 4) hold 4 bytes");
}

// Registered paths are resolved once: what is found there later must be the file itself. A
// symlink swapped in is refused, and a FIFO neither blocks the reader in open nor is read.
TEST(SafetensorsRead, RefusesASymlinkAndAFifoWithoutBlocking) {
  TempDir dir;
  WriteBytes(dir.File("real.safetensors"), RawFile("{}", 0));
  ASSERT_TRUE(ReadHeader(dir.File("real.safetensors")).ok());
  std::filesystem::create_symlink(dir.File("real.safetensors"), dir.File("link.safetensors"));
  auto link = ReadHeader(dir.File("link.safetensors"));
  ASSERT_FALSE(link.ok());
  EXPECT_NE(link.status().message().find("is a symlink now"), std::string::npos)
      << link.status().ToString();
  ASSERT_EQ(mkfifo(dir.File("fifo").c_str(), 0600), 0);
  EXPECT_INVALID(ReadHeader(dir.File("fifo")), "not a regular file");
}

}  // namespace
}  // namespace warmpool::safetensors
