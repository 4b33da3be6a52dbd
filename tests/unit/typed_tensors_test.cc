// Typed tensors (engine ABI version 5): the rules every layer judges them by (engines/tensors), and
// Engine::Run over the built-in engines and over an engine that breaks the rules on purpose.
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "devmem/host_memory.h"
#include "engines/builtin.h"
#include "engines/catalog/builtin_engines.h"
#include "engines/tensors/tensors.h"
#include "tests/text.h"
#include "tests/unit/dense_reference.h"

namespace warmpool {
namespace {

using warmpool::testing::Contains;
using namespace warmpool::testing;

wp_tensor Tensor(const char* name, wp_dtype dtype, std::vector<int64_t> shape, const void* data, uint64_t bytes) {
  wp_tensor t{name, static_cast<uint32_t>(dtype), static_cast<uint32_t>(shape.size()), {}, data, bytes};
  for (size_t i = 0; i < shape.size() && i < WP_TENSOR_MAX_RANK; i++) t.shape[i] = shape[i];
  return t;
}

// BYTES elements: each a uint32 length, then the bytes.
std::string ByteElements(const std::vector<std::string>& elements) {
  std::string out;
  for (const std::string& e : elements) {
    const auto length = static_cast<uint32_t>(e.size());
    out.append(reinterpret_cast<const char*>(&length), sizeof(length));
    out += e;
  }
  return out;
}

void ExpectInvalid(const wp_tensor& t, const std::string& says) {
  Status s = tensors::CheckTensor(t);
  ASSERT_FALSE(s.ok()) << says;
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), says)) << s.message();
}

TEST(TypedTensors, WellFormedTensorsOfEveryDtypePass) {
  const float f[6] = {1, 2, 3, 4, 5, 6};
  const int64_t i[2] = {7, -8};
  const uint16_t h[3] = {0x3c00, 0x7e00, 0xfc00};  // 1, NaN, -inf: values are the engine's to judge
  const std::string words = ByteElements({"", "héllo", std::string(1, '\0')});
  EXPECT_TRUE(tensors::CheckTensor(Tensor("x", WP_DTYPE_F32, {2, 3}, f, sizeof(f))).ok());
  EXPECT_TRUE(tensors::CheckTensor(Tensor("x", WP_DTYPE_I64, {2}, i, sizeof(i))).ok());
  EXPECT_TRUE(tensors::CheckTensor(Tensor("x", WP_DTYPE_F16, {3}, h, sizeof(h))).ok());
  EXPECT_TRUE(tensors::CheckTensor(Tensor("x", WP_DTYPE_BF16, {1, 3, 1}, h, sizeof(h))).ok());
  EXPECT_TRUE(tensors::CheckTensor(Tensor("x", WP_DTYPE_I32, {}, f, 4)).ok()) << "a scalar";
  EXPECT_TRUE(tensors::CheckTensor(Tensor("x", WP_DTYPE_F32, {0, 5}, nullptr, 0)).ok()) << "empty";
  EXPECT_TRUE(tensors::CheckTensor(Tensor("x", WP_DTYPE_BYTES, {3}, words.data(), words.size())).ok());
  EXPECT_TRUE(tensors::CheckTensor(Tensor(std::string(64, 'n').c_str(), WP_DTYPE_F32, {1}, f, 4)).ok());
}

TEST(TypedTensors, MalformedTensorsAreRefusedSayingWhy) {
  const float f[4] = {};
  ExpectInvalid(Tensor("", WP_DTYPE_F32, {1}, f, 4), "name of 1 to 64");
  ExpectInvalid(Tensor(nullptr, WP_DTYPE_F32, {1}, f, 4), "name of 1 to 64");
  const std::string long_name(65, 'n');
  ExpectInvalid(Tensor(long_name.c_str(), WP_DTYPE_F32, {1}, f, 4), "name of 1 to 64");
  ExpectInvalid(Tensor("x", static_cast<wp_dtype>(0), {1}, f, 4), "has dtype 0");
  ExpectInvalid(Tensor("x", static_cast<wp_dtype>(7), {1}, f, 4), "has dtype 7");
  wp_tensor deep = Tensor("x", WP_DTYPE_F32, {1}, f, 4);
  deep.rank = 9;
  ExpectInvalid(deep, "9 dimensions");
  ExpectInvalid(Tensor("x", WP_DTYPE_F32, {-1, 1}, f, 4), "negative size");
  // Sizes whose product overflows 64 bits must not wrap to a small count.
  ExpectInvalid(Tensor("x", WP_DTYPE_F32, {int64_t{1} << 40, int64_t{1} << 40}, f, 0), "more than 2^62");
  ExpectInvalid(Tensor("x", WP_DTYPE_I64, {int64_t{1} << 61}, f, 16), "not 2305843009213693952 elements");
  ExpectInvalid(Tensor("x", WP_DTYPE_F32, {2}, f, 12), "holds 12 bytes");
  ExpectInvalid(Tensor("x", WP_DTYPE_F32, {2}, nullptr, 8), "no data");
  const std::string good = ByteElements({"ab", "c"});
  ExpectInvalid(Tensor("x", WP_DTYPE_BYTES, {3}, good.data(), good.size()), "end inside element 2");
  ExpectInvalid(Tensor("x", WP_DTYPE_BYTES, {2}, good.data(), good.size() - 1), "element 1 says 1 bytes, 0 are left");
  ExpectInvalid(Tensor("x", WP_DTYPE_BYTES, {1}, good.data(), good.size()), "5 bytes past its 1 elements");
  const uint32_t huge = 0xffffffffu;
  ExpectInvalid(Tensor("x", WP_DTYPE_BYTES, {1}, &huge, sizeof(huge)), "says 4294967295 bytes");
}

TEST(TypedTensors, ARequestsTensorsHaveDistinctNamesAndAreFew) {
  const float f[1] = {};
  std::vector<wp_tensor> two = {Tensor("a", WP_DTYPE_F32, {1}, f, 4), Tensor("a", WP_DTYPE_F32, {1}, f, 4)};
  Status s = tensors::CheckTensors(two, "input");
  EXPECT_TRUE(Contains(s.message(), "two input tensors are named \"a\"")) << s.message();
  std::vector<std::string> names;
  for (int i = 0; i < 65; i++) names.push_back("t" + std::to_string(i));
  std::vector<wp_tensor> many;
  for (const std::string& n : names) many.push_back(Tensor(n.c_str(), WP_DTYPE_F32, {1}, f, 4));
  EXPECT_TRUE(Contains(tensors::CheckTensors(many, "input").message(), "65 input tensors: at most 64"));
  many.pop_back();
  EXPECT_TRUE(tensors::CheckTensors(many, "input").ok());
}

TEST(TypedTensors, ASignatureNamesWhatIsMissingExtraOrOfTheWrongKind) {
  const std::vector<wp_tensor> signature = {Tensor("ids", WP_DTYPE_I64, {-1}, nullptr, 0),
                                            Tensor("mask", WP_DTYPE_F32, {2, -1}, nullptr, 0)};
  const int64_t ids[3] = {};
  const float mask[6] = {};
  auto check = [&](std::vector<wp_tensor> given) { return tensors::MatchSignature(given, signature, "input"); };
  EXPECT_TRUE(check({Tensor("mask", WP_DTYPE_F32, {2, 3}, mask, 24), Tensor("ids", WP_DTYPE_I64, {3}, ids, 24)}).ok())
      << "any order, any size where the signature says -1";
  Status missing = check({Tensor("ids", WP_DTYPE_I64, {3}, ids, 24)});
  EXPECT_TRUE(Contains(missing.message(), "no input tensor \"mask\": the model takes \"ids\" i64 [-1], \"mask\" f32 [2, -1]"))
      << missing.message();
  Status extra = check({Tensor("ids", WP_DTYPE_I64, {3}, ids, 24), Tensor("mask", WP_DTYPE_F32, {2, 3}, mask, 24),
                        Tensor("other", WP_DTYPE_F32, {1}, mask, 4)});
  EXPECT_TRUE(Contains(extra.message(), "input tensor \"other\" is not one the model takes")) << extra.message();
  Status dtype = check({Tensor("ids", WP_DTYPE_I32, {6}, ids, 24), Tensor("mask", WP_DTYPE_F32, {2, 3}, mask, 24)});
  EXPECT_TRUE(Contains(dtype.message(), "input tensor \"ids\" is i32 [6]: the model takes i64 [-1]")) << dtype.message();
  Status size = check({Tensor("ids", WP_DTYPE_I64, {3}, ids, 24), Tensor("mask", WP_DTYPE_F32, {3, 2}, mask, 24)});
  EXPECT_TRUE(Contains(size.message(), "is f32 [3, 2]: the model takes f32 [2, -1]")) << size.message();
  Status rank = check({Tensor("ids", WP_DTYPE_I64, {1, 3}, ids, 24), Tensor("mask", WP_DTYPE_F32, {2, 3}, mask, 24)});
  EXPECT_TRUE(Contains(rank.message(), "is i64 [1, 3]")) << rank.message();
}

TEST(TypedTensors, DtypeNamesReadBothSpellings) {
  for (uint32_t d = WP_DTYPE_F32; d <= WP_DTYPE_BYTES; d++) {
    EXPECT_EQ(tensors::DtypeFromName(tensors::DtypeName(d)), static_cast<wp_dtype>(d));
    EXPECT_EQ(tensors::DtypeFromName(tensors::KserveName(d)), static_cast<wp_dtype>(d));
  }
  EXPECT_FALSE(tensors::DtypeFromName("FP64").has_value());
  EXPECT_EQ(tensors::DtypeName(99), "");
}

// ---- Engine::Run over the built-in engines ----

struct Collected {
  std::vector<std::string> names;
  std::vector<std::string> data;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<uint32_t> dtypes;
};
Engine::SinkFn CollectInto(Collected& c) {
  return [&c](const wp_tensor& t) {
    c.names.emplace_back(t.name);
    c.data.emplace_back(static_cast<const char*>(t.data), t.bytes);
    c.shapes.emplace_back(t.shape, t.shape + t.rank);
    c.dtypes.push_back(t.dtype);
    return OkStatus();
  };
}

TEST(TypedTensors, EchoGivesEveryDtypeBackAsItCame) {
  HostMemory memory;
  Result<Engine> engine = Engine::Open(FindBuiltinEngine("echo"), SpecForFile("e", ""), memory.service());
  ASSERT_TRUE(engine.ok() && engine->Load().ok());
  ASSERT_TRUE(engine->runs_tensors());
  EXPECT_FALSE(engine->Signature()->stated) << "echo takes any tensors";
  alignas(8) const int64_t i64[2] = {int64_t{1} << 40, -1};
  alignas(8) const int32_t i32[3] = {1, -2, 3};
  alignas(8) const uint16_t half[2] = {0x3c00, 0x7c00};
  const std::string words = ByteElements({"one", ""});
  const std::vector<wp_tensor> in = {Tensor("a", WP_DTYPE_I64, {2}, i64, 16), Tensor("b", WP_DTYPE_I32, {1, 3}, i32, 12),
                                     Tensor("c", WP_DTYPE_F16, {2}, half, 4), Tensor("d", WP_DTYPE_BF16, {2, 1}, half, 4),
                                     Tensor("e", WP_DTYPE_BYTES, {2}, words.data(), words.size())};
  Collected out;
  ASSERT_TRUE(engine->Run(in, CollectInto(out)).ok());
  ASSERT_EQ(out.names.size(), in.size());
  for (size_t i = 0; i < in.size(); i++) {
    EXPECT_EQ(out.names[i], in[i].name);
    EXPECT_EQ(out.dtypes[i], in[i].dtype);
    EXPECT_EQ(out.shapes[i], std::vector<int64_t>(in[i].shape, in[i].shape + in[i].rank));
    EXPECT_EQ(out.data[i], std::string(static_cast<const char*>(in[i].data), in[i].bytes));
  }
  // Malformed inputs never reach the engine.
  Status bad = engine->Run(std::vector<wp_tensor>{Tensor("a", WP_DTYPE_I64, {3}, i64, 16)}, CollectInto(out));
  EXPECT_EQ(bad.code(), Code::kInvalidArgument);
}

TEST(TypedTensors, DenseRunIsItsInferenceAndItsSignatureNamesTheWidths) {
  TempDir dir;
  const std::string path = dir.File("m.safetensors");
  ReferenceModel model = WriteModel(path, {{0, 10, 20}, {2, 20, 3}}, "tanh");
  HostMemory memory;
  Result<Engine> engine = Engine::Open(FindBuiltinEngine("dense"), Spec(path), memory.service());
  ASSERT_TRUE(engine.ok() && engine->Load().ok());
  Result<Engine::TensorSignature> signature = engine->Signature();
  ASSERT_TRUE(signature.ok() && signature->stated);
  EXPECT_EQ(tensors::ShapeText(tensors::ShapeOf(signature->inputs[0])), "[-1, 10]");
  EXPECT_EQ(tensors::ShapeText(tensors::ShapeOf(signature->outputs[0])), "[-1, 3]");
  std::mt19937 generator(3);
  const std::vector<float> input = RandomValues(7 * 10, 1.0, generator);
  Collected out;
  ASSERT_TRUE(engine->Run(std::vector<wp_tensor>{Tensor("input", WP_DTYPE_F32, {7, 10}, input.data(), 280)},
                          CollectInto(out))
                  .ok());
  std::vector<float> want;
  ASSERT_TRUE(engine->Infer(input, 7, 10, want).ok());
  ASSERT_EQ(out.names, std::vector<std::string>{"output"});
  EXPECT_EQ(out.shapes[0], (std::vector<int64_t>{7, 3}));
  EXPECT_EQ(out.data[0], std::string(reinterpret_cast<const char*>(want.data()), want.size() * sizeof(float)));
  Status wide = engine->Run(std::vector<wp_tensor>{Tensor("input", WP_DTYPE_F32, {2, 35}, input.data(), 280)},
                            CollectInto(out));
  EXPECT_TRUE(Contains(wide.message(), "input tensor \"input\" is f32 [2, 35]: the model takes f32 [-1, 10]"))
      << wide.message();
  // A sink's refusal (a reply too large) stops the run with the sink's own code and words.
  Status refused = engine->Run(std::vector<wp_tensor>{Tensor("input", WP_DTYPE_F32, {7, 10}, input.data(), 280)},
                               [](const wp_tensor&) { return Error(Code::kResourceExhausted, "too large"); });
  EXPECT_EQ(refused.code(), Code::kResourceExhausted);
  EXPECT_EQ(refused.message(), "too large");
}

// ---- an engine that breaks the rules: its mistakes are INTERNAL, never a malformed reply ----

enum class Mistake { kNone, kWrongDtype, kTwice, kUnknownName, kShortData, kNoOutput, kNotUtf8Name };
Mistake g_mistake = Mistake::kNone;
const wp_tensor kSignatureIn = {"x", WP_DTYPE_F32, 1, {-1}, nullptr, 0};
const wp_tensor kSignatureOut = {"y", WP_DTYPE_F32, 1, {-1}, nullptr, 0};

wp_status SloppyRun(wp_engine*, const wp_tensor* inputs, uint32_t, uint64_t, wp_tensor_sink_fn sink, void* ctx,
                    wp_progress_fn, void*, char*, size_t) {
  wp_tensor out = inputs[0];
  out.name = "y";
  switch (g_mistake) {
    case Mistake::kNone: break;
    case Mistake::kWrongDtype: out.dtype = WP_DTYPE_I32; break;
    case Mistake::kTwice:
      if (wp_status s = sink(ctx, &out); s != WP_OK) return s;
      break;
    case Mistake::kUnknownName: out.name = "z"; break;
    case Mistake::kShortData: out.bytes -= 1; break;
    case Mistake::kNoOutput: return WP_OK;
    case Mistake::kNotUtf8Name: out.name = "\xff"; break;
  }
  return sink(ctx, &out);
}
wp_status SloppySignature(wp_engine*, const wp_tensor** in, uint32_t* in_count, const wp_tensor** out,
                          uint32_t* out_count) {
  *in = &kSignatureIn;
  *out = &kSignatureOut;
  *in_count = *out_count = 1;
  return WP_OK;
}

TEST(TypedTensors, AnEnginesBadOutputsAreInternalErrors) {
  wp_engine_vtable sloppy = *FindBuiltinEngine("echo");
  sloppy.name = "sloppy";
  sloppy.run = &SloppyRun;
  sloppy.tensor_signature = &SloppySignature;
  HostMemory memory;
  Result<Engine> engine = Engine::Open(&sloppy, SpecForFile("s", ""), memory.service());
  ASSERT_TRUE(engine.ok() && engine->Load().ok());
  const float x[2] = {1, 2};
  const std::vector<wp_tensor> in = {Tensor("x", WP_DTYPE_F32, {2}, x, 8)};
  Collected out;
  g_mistake = Mistake::kNone;
  ASSERT_TRUE(engine->Run(in, CollectInto(out)).ok());
  const std::pair<Mistake, std::string> cases[] = {
      {Mistake::kWrongDtype, "output tensor \"y\" is i32 [2]: the model takes f32 [-1]"},
      {Mistake::kTwice, "output \"y\" twice"},
      {Mistake::kUnknownName, "output tensor \"z\" is not one the model takes"},
      {Mistake::kShortData, "holds 7 bytes"},
      {Mistake::kNoOutput, "gave no output \"y\""},
      {Mistake::kNotUtf8Name, "name of 1 to 64 bytes of UTF-8"},  // it could not travel in a reply
  };
  for (const auto& [mistake, says] : cases) {
    g_mistake = mistake;
    Status s = engine->Run(in, CollectInto(out));
    EXPECT_EQ(s.code(), Code::kInternal) << says;
    EXPECT_TRUE(Contains(s.message(), says)) << s.message();
  }
  g_mistake = Mistake::kNone;
}

// A signature is held to the rules of a request's tensors (sizes may be -1): an engine that states
// a broken one serves no typed request, with an INTERNAL error naming it.
const wp_tensor kBadSignatures[][2] = {
    {{"x", WP_DTYPE_F32, 1, {-2}, nullptr, 0}, kSignatureOut},
    {{nullptr, WP_DTYPE_F32, 1, {-1}, nullptr, 0}, kSignatureOut},
    {{"x", 9, 1, {-1}, nullptr, 0}, kSignatureOut},
    {{"x", WP_DTYPE_F32, 9, {-1}, nullptr, 0}, kSignatureOut},
    {kSignatureIn, {"x", WP_DTYPE_F32, 1, {-1}, nullptr, 0}},  // fine alone; paired below with a twin
};
int g_bad = 0;
wp_status BadSignature(wp_engine*, const wp_tensor** in, uint32_t* in_count, const wp_tensor** out, uint32_t* out_count) {
  *in = &kBadSignatures[g_bad][0];
  *in_count = g_bad == 4 ? 2 : 1;  // the last: two inputs named "x"
  *out = &kSignatureOut;
  *out_count = 1;
  return WP_OK;
}

TEST(TypedTensors, AnEnginesBrokenSignatureIsAnInternalError) {
  wp_engine_vtable broken = *FindBuiltinEngine("echo");
  broken.name = "broken";
  broken.run = &SloppyRun;
  broken.tensor_signature = &BadSignature;
  HostMemory memory;
  Result<Engine> engine = Engine::Open(&broken, SpecForFile("b", ""), memory.service());
  ASSERT_TRUE(engine.ok() && engine->Load().ok());
  const char* says[] = {"a size of -2", "name of 1 to 64", "has dtype 9", "9 dimensions", "two inputs are named \"x\""};
  for (g_bad = 0; g_bad < 5; g_bad++) {
    Result<Engine::TensorSignature> s = engine->Signature();
    ASSERT_FALSE(s.ok()) << says[g_bad];
    EXPECT_EQ(s.status().code(), Code::kInternal);
    EXPECT_TRUE(Contains(s.status().message(), says[g_bad])) << s.status().message();
  }
  g_bad = 0;
  EXPECT_TRUE(tensors::CheckTensor(Tensor("\xc3\x28", WP_DTYPE_F32, {}, "abcd", 4)).code() == Code::kInvalidArgument)
      << "a name that is not UTF-8";
}

// Outputs a reply could not hold are refused before they are computed (a narrow input may ask for
// a wide output), with the code a client can act on.
TEST(TypedTensors, ARunWhoseOutputsWouldNotFitAReplyIsRefusedBeforeItRuns) {
  TempDir dir;
  const std::string path = dir.File("wide.safetensors");
  WriteModel(path, {{0, 4, 4096}}, "none");
  HostMemory memory;
  Result<Engine> engine = Engine::Open(FindBuiltinEngine("dense"), Spec(path), memory.service());
  ASSERT_TRUE(engine.ok() && engine->Load().ok());
  const std::vector<float> rows(1000 * 4, 1.0f);
  bool sunk = false;
  Status refused = engine->Run(std::vector<wp_tensor>{Tensor("input", WP_DTYPE_F32, {1000, 4}, rows.data(), 16000)},
                               [&](const wp_tensor&) {
                                 sunk = true;
                                 return OkStatus();
                               },
                               /*max_output_bytes=*/1 << 20);
  EXPECT_EQ(refused.code(), Code::kResourceExhausted) << refused.ToString();
  EXPECT_TRUE(Contains(refused.message(), "send fewer rows")) << refused.message();
  EXPECT_FALSE(sunk);
}

}  // namespace
}  // namespace warmpool
