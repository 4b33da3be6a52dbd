// A shorter embedding (worker/embed_dimensions.h) against its definition: the first d values over
// the Euclidean norm of those d, computed here in long double; with hostile values too.
#include "worker/embed_dimensions.h"

#include <cmath>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

namespace warmpool::worker {
namespace {

std::vector<float> Reference(const std::vector<float>& values, uint32_t d) {
  long double squares = 0;
  for (uint32_t i = 0; i < d; i++) squares += static_cast<long double>(values[i]) * values[i];
  std::vector<float> out(values.begin(), values.begin() + d);
  for (float& v : out) v = static_cast<float>(v / std::sqrt(squares));
  return out;
}

TEST(ShortenEmbedding, ThePrefixAtUnitLengthAsTheDefinitionSays) {
  const float huge = std::numeric_limits<float>::max() / 4;
  const float tiny = std::numeric_limits<float>::denorm_min();
  for (const std::vector<float>& values :
       {std::vector<float>{0.6f, -0.8f, 0.3f, 0.1f}, std::vector<float>{huge, huge, -huge, 1.0f},
        std::vector<float>{tiny, tiny, 3 * tiny, 0.5f}, std::vector<float>{-1e-20f, 2e-20f, 5.0f, 7.0f}}) {
    for (uint32_t d : {1u, 2u, 3u, 4u}) {
      std::vector<float> got = values;
      ShortenEmbedding(got, d);
      const std::vector<float> want = Reference(values, d);
      double length = 0;
      for (uint32_t i = 0; i < d; i++) {
        EXPECT_NEAR(got[i], want[i], 2e-7 * std::fabs(want[i]) + 1e-30) << "d " << d << " i " << i;
        length += double{got[i]} * got[i];
      }
      EXPECT_NEAR(length, 1.0, 1e-6) << "d " << d;
      for (uint32_t i = d; i < values.size(); i++) EXPECT_EQ(got[i], values[i]) << "past the prefix: untouched";
    }
  }
}

TEST(ShortenEmbedding, APrefixOfZerosOrOfWhatIsNotFiniteIsLeftAsItIs) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> zeros = {0.0f, -0.0f, 1.0f};
  ShortenEmbedding(zeros, 2);
  EXPECT_EQ(zeros[0], 0.0f);
  EXPECT_TRUE(std::signbit(zeros[1]));
  std::vector<float> with_nan = {nan, 1.0f, 2.0f};
  ShortenEmbedding(with_nan, 2);
  EXPECT_TRUE(std::isnan(with_nan[0]));
  EXPECT_EQ(with_nan[1], 1.0f);
  std::vector<float> with_inf = {3.0f, -inf, 2.0f};
  ShortenEmbedding(with_inf, 2);
  EXPECT_EQ(with_inf[0], 3.0f);
  EXPECT_EQ(with_inf[1], -inf);
}

}  // namespace
}  // namespace warmpool::worker
