// An embedding model's checkpoint through warmpoold: a base model saved alone (no output head,
// tensors without "model.", as Hugging Face saves LlamaModel and embedding models built on such a
// base ship) registers, loads and embeds as its causal-LM twin of the same weights does. It is listed
// as embedding only from its registration; a generation (the protocol's, the CLI's) gets a typed
// error without a load; input_ids run to its last hidden state; and the model keeps serving.
#include <cmath>
#include <map>

#include "client/typed_tensors.h"
#include "engines/tokenizer/tokenizer.h"
#include <nlohmann/json.hpp>

#include "tests/integration/daemon_fixture.h"
#include "tests/integration/http_exchange.h"
#include "tests/unit/tiny_model.h"

namespace warmpool::testing {
namespace {

class EmbeddingModelTest : public DaemonTest {};

TEST_F(EmbeddingModelTest, ABaseModelSavedAloneEmbedsAsItsTwinAndRefusesGenerationTyped) {
  transformer::RandomCheckpoint spec;
  spec.seed = 11;
  WriteTinyModel(models_dir_ + "/twin", spec);
  spec.base_model_only = true;
  WriteTinyModel(models_dir_ + "/embedder", spec);
  StartDaemon();
  auto c = Connect();
  auto models = [&] {
    std::map<std::string, v1::ModelInfo> by_name;
    Result<v1::ModelsReply> reply = c->Models();
    EXPECT_TRUE(reply.ok()) << reply.status().ToString();
    if (reply.ok()) {
      for (const v1::ModelInfo& m : reply->models()) by_name[m.name()] = m;
    }
    return by_name;
  };
  // Known at registration, before any worker opened it: listed as such, and a generation is
  // refused without loading it.
  EXPECT_TRUE(models()["embedder"].embeds_only());
  EXPECT_FALSE(models()["twin"].embeds_only());
  std::string listed;
  ASSERT_EQ(Cli({"models"}, &listed), 0);
  EXPECT_NE(listed.find("transformer (embeds only)"), std::string::npos) << listed;
  EXPECT_EQ(listed.find("embeds only"), listed.rfind("embeds only")) << "the twin generates: " << listed;
  v1::GenerateRequest g;
  g.set_model("embedder");
  g.set_prompt("free software");
  g.set_max_tokens(4);
  auto unloaded = c->Generate(g, [](const v1::GenerateChunk&) {});
  ASSERT_FALSE(unloaded.ok());
  EXPECT_EQ(unloaded.status().code(), Code::kFailedPrecondition) << unloaded.status().ToString();
  EXPECT_NE(unloaded.status().message().find("embeds only"), std::string::npos) << unloaded.status().ToString();
  EXPECT_EQ(models()["embedder"].state(), "registered") << "refused without a load";
  // Over HTTP: Ollama's capabilities say so, and OpenAI's chat gets the error with its status.
  auto post = [&](const std::string& path, const nlohmann::json& body) {
    std::vector<Response> r = Split(Exchange(ConnectUnix(socket_), HttpPost(path, body.dump(), true)));
    return r.size() == 1 ? r[0] : Response{};
  };
  const Response shown = post("/api/show", {{"model", "embedder"}});
  ASSERT_EQ(shown.status, 200) << shown.body;
  EXPECT_EQ(nlohmann::json::parse(shown.body)["capabilities"], nlohmann::json::array({"embedding"})) << shown.body;
  const Response twin_shown = post("/api/show", {{"model", "twin"}});
  EXPECT_EQ(nlohmann::json::parse(twin_shown.body)["capabilities"], nlohmann::json::array({"completion", "embedding"}));
  const Response chat = post("/v1/chat/completions",
                             {{"model", "embedder"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}});
  EXPECT_EQ(chat.status, 409) << chat.body;  // FAILED_PRECONDITION, as every endpoint maps it
  EXPECT_NE(chat.body.find("embeds only"), std::string::npos) << chat.body;

  auto embed = [&](const std::string& model) {
    v1::EmbedRequest r;
    r.set_model(model);
    r.add_input("free software");
    r.add_input("the GNU General Public License");
    return c->Embed(std::move(r));
  };
  auto values = [](const v1::EmbedReply& reply, int i) {
    return std::vector<float>(reply.embeddings(i).values().begin(), reply.embeddings(i).values().end());
  };
  auto twin = embed("twin");
  auto embedder = embed("embedder");
  ASSERT_TRUE(twin.ok()) << twin.status().ToString();
  ASSERT_TRUE(embedder.ok()) << embedder.status().ToString();
  for (int i = 0; i < 2; ++i) EXPECT_EQ(values(*embedder, i), values(*twin, i)) << "input " << i;

  auto generated = c->Generate(g, [](const v1::GenerateChunk&) {});
  ASSERT_FALSE(generated.ok());
  EXPECT_EQ(generated.status().code(), Code::kFailedPrecondition) << generated.status().ToString();
  EXPECT_NE(generated.status().message().find("embeds only"), std::string::npos) << generated.status().ToString();
  std::string out, err;
  EXPECT_NE(Cli({"generate", "embedder", "free software", "--max-tokens", "4"}, &out, &err), 0);
  EXPECT_NE(err.find("FAILED_PRECONDITION"), std::string::npos) << err;
  EXPECT_NE(err.find("embeds only"), std::string::npos) << err;

  // Its typed run gives the last hidden state (Hugging Face's last_hidden_state[-1]): the
  // embedding before it is scaled to unit length.
  const v1::ModelInfo loaded = models()["embedder"];
  EXPECT_TRUE(loaded.embeds_only()) << "as its worker said too";
  ASSERT_EQ(loaded.outputs_size(), 1);
  EXPECT_EQ(loaded.outputs(0).name(), "last_hidden_state");
  Result<std::unique_ptr<tokenizer::Tokenizer>> words = tokenizer::Tokenizer::Load(models_dir_ + "/embedder/tokenizer.json");
  ASSERT_TRUE(words.ok());
  Result<std::vector<int32_t>> ids = (*words)->Encode("free software", /*add_special_tokens=*/true);
  ASSERT_TRUE(ids.ok());
  const std::vector<int64_t> wide(ids->begin(), ids->end());
  Result<v1::InferReply> state =
      c->InferTensors("embedder", {client::TensorOf<int64_t>("input_ids", {static_cast<int64_t>(wide.size())}, wide)});
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  ASSERT_EQ(state->outputs_size(), 1);
  EXPECT_EQ(state->outputs(0).name(), "last_hidden_state");
  Result<std::vector<float>> hidden = client::ValuesOf<float>(state->outputs(0));
  ASSERT_TRUE(hidden.ok());
  ASSERT_EQ(hidden->size(), static_cast<size_t>(spec.hidden_size));
  double squares = 0;
  for (float v : *hidden) squares += double{v} * v;
  ASSERT_GT(squares, 0);
  for (size_t i = 0; i < hidden->size(); ++i) {
    EXPECT_NEAR((*hidden)[i] / std::sqrt(squares), embedder->embeddings(0).values(static_cast<int>(i)), 1e-6) << i;
  }

  // Still serving: the embedder embeds again, the twin generates.
  auto again = embed("embedder");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(values(*again, 0), values(*twin, 0));
  g.set_model("twin");
  auto twin_text = c->Generate(g, [](const v1::GenerateChunk&) {});
  ASSERT_TRUE(twin_text.ok()) << twin_text.status().ToString();
}

}  // namespace
}  // namespace warmpool::testing
