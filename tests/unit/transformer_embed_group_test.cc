// Short inputs embedded together (engines/transformer/embedding.h, EmbedGroup): one step of the
// model for a group, each input in a cache of its own. Each embedding must be what the input gives
// alone, up to the order of the products' sums; groups must respect the piece's rows, the group's
// size and the KV blocks the pool can give; a long input goes alone between groups.
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engines/transformer/embedding.h"
#include "tests/unit/transformer_engine_fixture.h"

namespace warmpool::transformer {
namespace {

std::vector<int32_t> Ids(size_t n) { return std::vector<int32_t>(n, 7); }

TEST(EmbedGroupEnd, KeepsWithinThePiecesRowsTheGroupsSizeAndTheBlocks) {
  const std::vector<std::vector<int32_t>> inputs = {Ids(3), Ids(300), Ids(5), Ids(65), Ids(100), Ids(90), Ids(1)};
  EXPECT_EQ(EmbedGroupEnd(inputs, 0, 100), 1u) << "the next is longer than a piece";
  EXPECT_EQ(EmbedGroupEnd(inputs, 1, 100), 2u) << "a long input goes alone";
  EXPECT_EQ(EmbedGroupEnd(inputs, 2, 100), 5u) << "5 + 65 + 100 rows; 90 more pass the piece's 256";
  EXPECT_EQ(EmbedGroupEnd(inputs, 2, 3), 4u) << "5 takes a block, 65 two: a third input needs a fourth";
  EXPECT_EQ(EmbedGroupEnd(inputs, 2, 0), 3u) << "at least the input itself";
  EXPECT_EQ(EmbedGroupEnd(inputs, 6, 100), 7u);
  const std::vector<std::vector<int32_t>> many(200, Ids(1));
  EXPECT_EQ(EmbedGroupEnd(many, 0, 1000), kMaxEmbedGroup);
  EXPECT_EQ(EmbedGroupEnd(inputs, 2, 100, /*rows=*/64), 3u) << "a context of 64: 5 rows, then 65 pass it";
}

// Through the ABI, as a request of many inputs comes: the short ones in groups, a long one alone,
// each the embedding the input gives alone (bf16 products: the same values up to the sums' order).
TEST_F(TransformerEngineTest, InputsEmbeddedTogetherAreEachWhatItGivesAlone) {
  Result<Engine> engine = OpenDirectory();
  ASSERT_TRUE(engine.ok() && engine->Load().ok());
  const uint32_t size = engine->info().embedding_size;
  std::vector<std::string> inputs;
  const std::string words = "free software is a matter of liberty not price and the GNU General Public License ";
  for (size_t i = 0; i < 24; ++i) inputs.push_back(words.substr(0, 3 + (i * 37) % (words.size() - 3)));
  inputs.insert(inputs.begin() + 10, std::string(1200, 'a') + " " + words);  // past a piece: alone
  Result<Engine::Embeddings> together = engine->Embed(inputs);
  ASSERT_TRUE(together.ok()) << together.status().ToString();
  for (size_t i = 0; i < inputs.size(); ++i) {
    Result<Engine::Embeddings> alone = engine->Embed({inputs[i]});
    ASSERT_TRUE(alone.ok()) << alone.status().ToString();
    EXPECT_EQ(together->tokens[i], alone->tokens[0]) << "input " << i;
    double dot = 0, worst = 0;
    for (uint32_t j = 0; j < size; ++j) {
      const double a = together->values[i * size + j], b = alone->values[j];
      dot += a * b;
      worst = std::max(worst, std::fabs(a - b));
    }
    EXPECT_GT(dot, 1 - 1e-5) << "input " << i << ": cosine";
    EXPECT_LT(worst, 5e-3) << "input " << i;
  }
  // The same request again, after the long input alone filled the engine's own cache: the same
  // groups, the same bits.
  Result<Engine::Embeddings> again = engine->Embed(inputs);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->values, together->values);
}

// A pool of few blocks (kv_tokens of one context) still embeds a request of many inputs: its
// groups are as small as its blocks say. Whatever ran before (a long input that filled the engine's
// own cache), the same request makes the same groups: the same bits.
TEST_F(TransformerEngineTest, AKvCacheOfFewBlocksMakesSmallerGroupsAndTheSameOnesEveryTime) {
  Result<Engine> small = LoadDirectory(/*context=*/512, /*sequences=*/1, /*kv_tokens=*/512);
  ASSERT_TRUE(small.ok()) << small.status().ToString();
  Result<Engine> large = LoadDirectory(/*context=*/512, /*sequences=*/8);
  ASSERT_TRUE(large.ok()) << large.status().ToString();
  const std::vector<std::string> inputs(12, "free software");
  Result<Engine::Embeddings> few = small->Embed(inputs);
  Result<Engine::Embeddings> many = large->Embed(inputs);
  ASSERT_TRUE(few.ok()) << few.status().ToString();
  ASSERT_TRUE(many.ok()) << many.status().ToString();
  ASSERT_EQ(few->values.size(), many->values.size());
  for (size_t j = 0; j < few->values.size(); ++j) EXPECT_NEAR(few->values[j], many->values[j], 5e-3) << j;
  // Groups of 8 inputs (one block each, the pool's 8) run the products past the small-batch
  // kernel's 16 rows; had the long input's blocks stayed held, groups of 3 would run within it.
  std::string long_input;
  for (int i = 0; i < 100; ++i) long_input += "free software ";
  Result<Engine::Embeddings> filled = small->Embed({long_input});
  ASSERT_TRUE(filled.ok()) << filled.status().ToString();
  ASSERT_GT(filled->tokens[0], 4u * 64) << "it fills most of the pool";
  Result<Engine::Embeddings> after = small->Embed(inputs);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_EQ(after->values, few->values);
}

}  // namespace
}  // namespace warmpool::transformer
