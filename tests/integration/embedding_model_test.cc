// An embedding model's checkpoint through warmpoold: a base model saved alone (no output head,
// tensors without "model.", as Hugging Face saves LlamaModel and embedding models built on such a
// base ship) registers, loads and embeds as its causal-LM twin of the same weights does; what needs
// logits (a generation, the CLI's generate, input_ids to logits) gets a typed error, and the model
// keeps serving.
#include "tests/integration/daemon_fixture.h"
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

  v1::GenerateRequest g;
  g.set_model("embedder");
  g.set_prompt("free software");
  g.set_max_tokens(4);
  auto generated = c->Generate(g, [](const v1::GenerateChunk&) {});
  ASSERT_FALSE(generated.ok());
  EXPECT_EQ(generated.status().code(), Code::kFailedPrecondition) << generated.status().ToString();
  EXPECT_NE(generated.status().message().find("embeds only"), std::string::npos) << generated.status().ToString();
  std::string out, err;
  EXPECT_NE(Cli({"generate", "embedder", "free software", "--max-tokens", "4"}, &out, &err), 0);
  EXPECT_NE(err.find("FAILED_PRECONDITION"), std::string::npos) << err;
  EXPECT_NE(err.find("embeds only"), std::string::npos) << err;

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
