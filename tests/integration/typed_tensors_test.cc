// Typed tensors through warmpoold (InferRequest.inputs, engine ABI version 5): every dtype through
// the echo engine, a dense model's run equal to its inference, a language model's logits; bad
// tensors refused with typed errors before any worker, or by the engine's signature, while every
// model keeps serving; outputs too large for a reply; a worker killed mid-run, the request retried.
#include <cstring>
#include <map>

#include "client/typed_tensors.h"
#include <nlohmann/json.hpp>

#include "tests/integration/daemon_fixture.h"
#include "tests/integration/http_exchange.h"
#include "tests/text.h"
#include "tests/unit/tiny_model.h"

namespace warmpool::testing {
namespace {

class TypedTensorsTest : public DaemonTest {};

v1::NamedTensor Raw(const std::string& name, v1::DType dtype, std::vector<int64_t> shape, std::string data) {
  v1::NamedTensor t;
  t.set_name(name);
  t.set_dtype(dtype);
  for (int64_t s : shape) t.add_shape(s);
  t.set_data(std::move(data));
  return t;
}

// What the daemon itself answers, past the client's own checks.
Status SendRaw(client::Client& c, const std::string& model, std::vector<v1::NamedTensor> inputs) {
  v1::Envelope e;
  e.mutable_infer()->set_model(model);
  for (v1::NamedTensor& t : inputs) *e.mutable_infer()->add_inputs() = std::move(t);
  return c.Call(std::move(e)).status();
}

TEST_F(TypedTensorsTest, EveryDtypeRoundTripsAndEachEngineRunsItsOwn) {
  MakeModel("mlp", "16,32,4", "gelu");
  WriteTinyModel(models_dir_ + "/tiny");
  StartDaemon("[[models]]\nname = \"echo\"\nengine = \"echo\"\n");
  auto c = Connect();
  const std::string word = std::string("\x03\0\0\0abc", 7);
  std::vector<v1::NamedTensor> all = {
      Raw("f32", v1::DTYPE_F32, {2}, std::string("\0\0\x80\x3f\0\0\xc0\x7f", 8)),  // 1, NaN
      Raw("f16", v1::DTYPE_F16, {1, 1}, std::string("\0\x7c", 2)),                 // inf
      Raw("bf16", v1::DTYPE_BF16, {}, std::string("\x80\x3f", 2)),
      Raw("i32", v1::DTYPE_I32, {0, 3}, ""),
      Raw("i64", v1::DTYPE_I64, {1}, std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8)),
      Raw("bytes", v1::DTYPE_BYTES, {1}, word),
  };
  Result<v1::InferReply> echoed = c->InferTensors("echo", all);
  ASSERT_TRUE(echoed.ok()) << echoed.status().ToString();
  ASSERT_EQ(echoed->outputs_size(), static_cast<int>(all.size()));
  for (size_t i = 0; i < all.size(); i++) {
    EXPECT_EQ(echoed->outputs(i).SerializeAsString(), all[i].SerializeAsString()) << all[i].name();
  }

  std::vector<float> rows(3 * 16);
  for (size_t i = 0; i < rows.size(); i++) rows[i] = static_cast<float>(i % 7) - 3;
  Result<v1::InferReply> ran =
      c->InferTensors("mlp", {client::TensorOf<float>("input", {3, 16}, rows)});
  ASSERT_TRUE(ran.ok()) << ran.status().ToString();
  Result<client::Matrix> inferred = c->Infer("mlp", client::Matrix{3, 16, rows});
  ASSERT_TRUE(inferred.ok());
  ASSERT_EQ(ran->outputs_size(), 1);
  EXPECT_EQ(ran->outputs(0).name(), "output");
  EXPECT_EQ(*client::ValuesOf<float>(ran->outputs(0)), inferred->data);

  const std::vector<int64_t> ids = {1, 2, 3, 4, 5};
  Result<v1::InferReply> logits = c->InferTensors("tiny", {client::TensorOf<int64_t>("input_ids", {5}, ids)});
  ASSERT_TRUE(logits.ok()) << logits.status().ToString();
  ASSERT_EQ(logits->outputs_size(), 1);
  EXPECT_EQ(logits->outputs(0).name(), "logits");
  EXPECT_GT(logits->outputs(0).shape(0), 100) << "the vocabulary's size";
  Result<v1::InferReply> again = c->InferTensors("tiny", {client::TensorOf<int64_t>("input_ids", {5}, ids)});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->outputs(0).data(), logits->outputs(0).data()) << "a pure function of the ids";

  // What each takes, as its worker said when it opened it: `models` lists it.
  auto models = c->Models();
  ASSERT_TRUE(models.ok());
  std::map<std::string, v1::ModelInfo> by_name;
  for (const v1::ModelInfo& m : models->models()) by_name[m.name()] = m;
  const v1::ModelInfo& mlp = by_name["mlp"];
  ASSERT_TRUE(mlp.runs_tensors());
  ASSERT_EQ(mlp.inputs_size(), 1);
  EXPECT_EQ(mlp.inputs(0).name(), "input");
  EXPECT_EQ(mlp.inputs(0).dtype(), v1::DTYPE_F32);
  EXPECT_EQ(std::vector<int64_t>(mlp.inputs(0).shape().begin(), mlp.inputs(0).shape().end()),
            (std::vector<int64_t>{-1, 16}));
  EXPECT_EQ(std::vector<int64_t>(mlp.outputs(0).shape().begin(), mlp.outputs(0).shape().end()),
            (std::vector<int64_t>{-1, 4}));
  EXPECT_EQ(by_name["tiny"].inputs(0).name(), "input_ids");
  EXPECT_EQ(by_name["tiny"].outputs(0).shape(0), logits->outputs(0).shape(0));
  EXPECT_TRUE(by_name["echo"].runs_tensors() && by_name["echo"].inputs_size() == 0) << "echo takes any";
  ExpectQuiescentAndValid();
}

TEST_F(TypedTensorsTest, BadTensorsGetTypedErrorsAndEveryModelKeepsServing) {
  MakeModel("mlp", "16,32,4", "gelu");
  WriteTinyModel(models_dir_ + "/tiny");
  StartDaemon("[[models]]\nname = \"echo\"\nengine = \"echo\"\n");
  auto c = Connect();
  struct Case {
    std::string model;
    std::vector<v1::NamedTensor> inputs;
    Code code;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"echo", {Raw("x", v1::DTYPE_F32, {3}, "12345678")}, Code::kInvalidArgument, "holds 8 bytes, not 3 elements"},
      {"echo", {Raw("x", v1::DTYPE_UNSPECIFIED, {1}, "1234")}, Code::kInvalidArgument, "has dtype 0"},
      {"echo", {Raw("x", static_cast<v1::DType>(42), {1}, "1234")}, Code::kInvalidArgument, "has dtype 42"},
      {"echo", {Raw("", v1::DTYPE_F32, {1}, "1234")}, Code::kInvalidArgument, "a name of 1 to 64"},
      {"echo", {Raw(std::string("a\0b", 3), v1::DTYPE_F32, {1}, "1234")}, Code::kInvalidArgument, "NUL byte"},
      {"echo", {Raw("x", v1::DTYPE_F32, {-4}, "")}, Code::kInvalidArgument, "negative size"},
      {"echo", {Raw("x", v1::DTYPE_F32, {1, 1, 1, 1, 1, 1, 1, 1, 1}, "1234")}, Code::kInvalidArgument, "9 dimensions"},
      {"echo", {Raw("x", v1::DTYPE_F32, {1ll << 40, 1ll << 40}, "")}, Code::kInvalidArgument, "more than 2^62"},
      {"echo", {Raw("x", v1::DTYPE_BYTES, {2}, std::string("\x03\0\0\0abc", 7))}, Code::kInvalidArgument, "element 1"},
      {"echo", {Raw("x", v1::DTYPE_F32, {1}, "1234"), Raw("x", v1::DTYPE_F32, {1}, "1234")}, Code::kInvalidArgument,
       "two input tensors are named \"x\""},
      {"mlp", {Raw("input", v1::DTYPE_F32, {1, 8}, std::string(32, '\0'))}, Code::kInvalidArgument,
       "the model takes f32 [-1, 16]"},
      {"mlp", {Raw("rows", v1::DTYPE_F32, {1, 16}, std::string(64, '\0'))}, Code::kInvalidArgument,
       "no input tensor \"input\""},
      {"tiny", {Raw("input_ids", v1::DTYPE_I64, {1}, std::string("\xff\xff\xff\xff\xff\xff\xff\xff", 8))},
       Code::kInvalidArgument, "input_ids[0] is -1"},
      {"nope", {Raw("x", v1::DTYPE_F32, {1}, "1234")}, Code::kNotFound, "not registered"},
  };
  for (const Case& k : cases) {
    Status s = SendRaw(*c, k.model, k.inputs);
    EXPECT_EQ(s.code(), k.code) << k.says << ": " << s.ToString();
    EXPECT_TRUE(Contains(s.message(), k.says)) << s.message();
  }
  // A matrix and typed tensors at once; a language model sent a matrix.
  v1::Envelope both;
  both.mutable_infer()->set_model("echo");
  *both.mutable_infer()->add_inputs() = Raw("x", v1::DTYPE_F32, {1}, "1234");
  both.mutable_infer()->mutable_input()->set_rows(1);
  EXPECT_TRUE(Contains(c->Call(both).status().message(), "not both"));
  Result<client::Matrix> matrix = c->Infer("tiny", client::Matrix{1, 2, {1, 2}});
  EXPECT_TRUE(Contains(matrix.status().message(), "typed tensors (inputs)")) << matrix.status().ToString();
  // Everyone still served.
  EXPECT_TRUE(c->InferTensors("echo", {Raw("x", v1::DTYPE_F32, {1}, "1234")}).ok());
  EXPECT_TRUE(c->Infer("mlp", client::Matrix{1, 16, std::vector<float>(16, 1)}).ok());
  const std::vector<int64_t> ids = {1};
  EXPECT_TRUE(c->InferTensors("tiny", {client::TensorOf<int64_t>("input_ids", {1}, ids)}).ok());
  ExpectQuiescentAndValid();
}

TEST_F(TypedTensorsTest, OutputsTooLargeForAReplyAreRefusedAndAKilledWorkersRunIsRetried) {
  MakeModel("wide", "4,4096", "relu");
  StartDaemon("[limits]\nmax_frame_bytes = \"64KiB\"\n[[models]]\nname = \"echo\"\nengine = \"echo\"\n",
              {"--enable-fault-injection"});
  auto c = Connect();
  const std::vector<float> eight_rows(8 * 4, 0.5f);  // 8 x 4096 f32 out: 128 KiB
  Result<v1::InferReply> big = c->InferTensors("wide", {client::TensorOf<float>("input", {8, 4}, eight_rows)});
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), Code::kResourceExhausted) << big.status().ToString();
  EXPECT_TRUE(Contains(big.status().message(), "send fewer rows")) << big.status().message();
  const std::vector<float> one_row(4, 0.5f);
  Result<v1::InferReply> fits = c->InferTensors("wide", {client::TensorOf<float>("input", {1, 4}, one_row)});
  ASSERT_TRUE(fits.ok()) << fits.status().ToString();

  // Pure, like an inference: the run a worker died in runs again on its respawn.
  // JSON's numbers may be shorter than their binary form: a body well within the HTTP limit that
  // would not fit its worker's frame is refused before any worker (none killed, nothing retried).
  std::string zeros;
  for (int i = 0; i < 20000; i++) zeros += i == 0 ? "0" : ",0";
  const std::string body = R"({"inputs": [{"name": "x", "shape": [20000], "datatype": "INT64", "data": [)" + zeros + "]}]}";
  ASSERT_LT(body.size(), 64u * 1024);
  std::vector<Response> grown = Split(Exchange(ConnectUnix(socket_), HttpPost("/v2/models/echo/infer", body, true)));
  ASSERT_EQ(grown.size(), 1u);
  EXPECT_EQ(grown[0].status, 400) << grown[0].body;
  EXPECT_TRUE(Contains(grown[0].body, "max_frame_bytes")) << grown[0].body;
  auto status = c->GetStatus();
  ASSERT_TRUE(status.ok());
  for (const v1::WorkerStatus& w : status->workers()) EXPECT_EQ(w.last_exit(), "") << "worker " << w.slot();

  ASSERT_TRUE(c->ArmFault(client::FaultSpec{"infer.mid", "kill", "wide", 0, 1}).ok());
  Result<v1::InferReply> retried = c->InferTensors("wide", {client::TensorOf<float>("input", {1, 4}, one_row)});
  ASSERT_TRUE(retried.ok()) << retried.status().ToString();
  EXPECT_EQ(retried->outputs(0).data(), fits->outputs(0).data());
  ExpectQuiescentAndValid();
}

// The same tensors as KServe v2 JSON: POST /v2/models/NAME/infer, and `warmpool infer --tensors`.
TEST_F(TypedTensorsTest, KserveJsonOverHttpAndTheCliCarriesEveryDtype) {
  using nlohmann::json;
  WriteTinyModel(models_dir_ + "/tiny");
  StartDaemon("[[models]]\nname = \"echo\"\nengine = \"echo\"\n");
  auto post = [&](const std::string& path, const json& body) {
    std::vector<Response> r = Split(Exchange(ConnectUnix(socket_), HttpPost(path, body.dump(), true)));
    EXPECT_EQ(r.size(), 1u);
    return r.empty() ? Response{} : r[0];
  };
  const json inputs = json::parse(R"([
    {"name": "f", "shape": [2, 2], "datatype": "FP32", "data": [[1.5, -2], [3, 4.25]]},
    {"name": "h", "shape": [1], "datatype": "FP16", "data": [0.333251953125]},
    {"name": "b", "shape": [1], "datatype": "BF16", "data": [-2.5]},
    {"name": "i", "shape": [3], "datatype": "INT32", "data": [2147483647, -2147483648, 0]},
    {"name": "l", "shape": [1], "datatype": "INT64", "data": [9007199254740993]},
    {"name": "s", "shape": [2], "datatype": "BYTES", "data": ["h\u00e9llo", ""]}])");
  Response echoed = post("/v2/models/echo/infer", {{"id", "7"}, {"inputs", inputs}});
  ASSERT_EQ(echoed.status, 200) << echoed.body;
  const json doc = json::parse(echoed.body);
  EXPECT_EQ(doc["model_name"], "echo");
  EXPECT_EQ(doc["id"], "7");
  json want = inputs;
  want[0]["data"] = json::array({1.5, -2.0, 3.0, 4.25});  // flat, as KServe writes outputs
  EXPECT_EQ(doc["outputs"], want);

  Response logits = post("/v2/models/tiny/infer",
                         {{"inputs", json::array({{{"name", "input_ids"}, {"shape", {3}}, {"datatype", "INT64"},
                                                   {"data", {1, 2, 3}}}})},
                          {"parameters", {{"deadline_ms", 60000}}}});
  ASSERT_EQ(logits.status, 200) << logits.body;
  const json out = json::parse(logits.body)["outputs"][0];
  EXPECT_EQ(out["name"], "logits");
  EXPECT_EQ(out["data"].size(), out["shape"][0].get<size_t>());

  // Its metadata as the v2 protocol's clients ask for it; the CLI's models --json says the same.
  std::vector<Response> meta = Split(Exchange(ConnectUnix(socket_), HttpGet("/v2/models/tiny", true)));
  ASSERT_EQ(meta.size(), 1u);
  ASSERT_EQ(meta[0].status, 200) << meta[0].body;
  const json metadata = json::parse(meta[0].body);
  EXPECT_EQ(metadata["platform"], "warmpool-transformer");
  EXPECT_EQ(metadata["inputs"], json::parse(R"([{"name": "input_ids", "datatype": "INT64", "shape": [-1]}])"));
  EXPECT_EQ(metadata["outputs"][0]["shape"], json::array({out["shape"][0]}));
  std::string listed, listed_err;
  ASSERT_EQ(Cli({"models", "--json"}, &listed, &listed_err), 0) << listed_err;
  for (const json& m : json::parse(listed)) {
    if (m["name"] == "tiny") {
      EXPECT_EQ(m["tensors"]["inputs"], metadata["inputs"]);
    }
  }
  std::vector<Response> unknown = Split(Exchange(ConnectUnix(socket_), HttpGet("/v2/models/nope", true)));
  ASSERT_EQ(unknown.size(), 1u);
  EXPECT_EQ(unknown[0].status, 404);
  EXPECT_TRUE(Contains(json::parse(unknown[0].body)["error"].get<std::string>(), "not registered"));

  struct Bad {
    std::string path;
    json body;
    int status;
    std::string says;
  };
  const std::vector<Bad> bad = {
      {"/v2/models/echo/infer", {{"inputs", json::array({{{"name", "x"}, {"shape", {1}}, {"datatype", "FP64"}, {"data", {1}}}})}},
       400, "datatype \"FP64\""},
      {"/v2/models/echo/infer", {{"inputs", json::array({{{"name", "x"}, {"shape", {2}}, {"datatype", "FP32"}, {"data", {1}}}})}},
       400, "1 values for shape [2]"},
      {"/v2/models/echo/infer", {{"inputs", json::array({{{"name", "x"}, {"shape", {1}}, {"datatype", "INT32"}, {"data", {1.5}}}})}},
       400, "is not an integer"},
      {"/v2/models/echo/infer", {{"inputs", json::array({{{"name", "x"}, {"shape", {1}}, {"datatype", "FP16"}, {"data", {1e6}}}})}},
       400, "outside the range of FP16"},
      {"/v2/models/echo/infer", {{"inputs", json::array()}}, 400, "non-empty list"},
      {"/v2/models/echo/infer", {{"input", 1}}, 400, "\"input\""},
      {"/v2/models/tiny/infer", {{"inputs", json::array({{{"name", "input_ids"}, {"shape", {1}}, {"datatype", "INT32"}, {"data", {1}}}})}},
       400, "the model takes i64 [-1]"},
      {"/v2/models/nope/infer", {{"inputs", json::array({{{"name", "x"}, {"shape", {1}}, {"datatype", "FP32"}, {"data", {1}}}})}},
       404, "not registered"},
      {"/v2/models/echo/other", json::object(), 404, "POST /v2/models/NAME/infer"},
  };
  for (const Bad& b : bad) {
    Response r = post(b.path, b.body);
    EXPECT_EQ(r.status, b.status) << r.body;
    json error = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(error.is_object() && error.contains("error")) << r.body;
    EXPECT_TRUE(Contains(error["error"].get<std::string>(), b.says)) << r.body;
  }

  std::string printed, err;
  ASSERT_EQ(Cli({"infer", "echo", "--tensors", "-"}, &printed, &err, json{{"inputs", inputs}}.dump()), 0) << err;
  EXPECT_EQ(json::parse(printed)["outputs"], want);
  EXPECT_EQ(Cli({"infer", "echo", "--tensors", "-"}, &printed, &err, R"([{"name": "x"}])"), 2) << "INVALID_ARGUMENT";
  EXPECT_TRUE(Contains(err, "tensor \"x\" needs a \"datatype\"")) << err;
  ExpectQuiescentAndValid();
}

}  // namespace
}  // namespace warmpool::testing
