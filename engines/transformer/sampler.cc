#include "engines/transformer/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

namespace warmpool::transformer {
namespace {

constexpr double kImpossible = -INFINITY;

// exp(s - max) normalised over the possible tokens; +inf logits share all the mass.
std::vector<double> Softmax(const std::vector<double>& scores) {
  const double max = *std::max_element(scores.begin(), scores.end());
  std::vector<double> p(scores.size(), 0.0);
  if (std::isinf(max) && max > 0) {
    for (size_t i = 0; i < scores.size(); ++i) p[i] = scores[i] == max ? 1.0 : 0.0;
  } else {
    for (size_t i = 0; i < scores.size(); ++i) p[i] = scores[i] == kImpossible ? 0.0 : std::exp(scores[i] - max);
  }
  const double total = std::accumulate(p.begin(), p.end(), 0.0);
  if (!(total > 0) || !std::isfinite(total)) {
    // A temperature so small that the scaled logits are all -inf or all overflow: the limit of
    // sampling as the temperature goes to 0 is the most likely token.
    std::fill(p.begin(), p.end(), 0.0);
    p[static_cast<size_t>(std::max_element(scores.begin(), scores.end()) - scores.begin())] = 1.0;
    return p;
  }
  for (double& v : p) v /= total;
  return p;
}

size_t ArgMax(const std::vector<double>& scores) {
  return static_cast<size_t>(std::max_element(scores.begin(), scores.end()) - scores.begin());
}

// Below this temperature every gap between logits of more than 0.01 is a factor of e^-1000: the
// distribution is the most likely token alone, and dividing by it could overflow to -inf everywhere.
constexpr double kGreedyBelow = 1e-5;

}  // namespace

bool ChoosesArgMax(const SamplingOptions& options) {
  return options.temperature < kGreedyBelow && options.repetition_penalty == 1.0;
}

Result<int32_t> ArgMaxToken(std::span<const float> logits) {
  int32_t best = -1;
  float value = -INFINITY;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] > value) {  // false for NaN, and for -inf: neither is possible
      value = logits[i];
      best = static_cast<int32_t>(i);
    }
  }
  if (best < 0) return Error(Code::kInternal, "the model gave no logit that is a number: nothing can be sampled");
  return best;
}

Status CheckSamplingOptions(const SamplingOptions& o) {
  if (!std::isfinite(o.temperature) || o.temperature < 0) {
    return Error(Code::kInvalidArgument, "temperature {} must be 0 (greedy) or positive", o.temperature);
  }
  if (!(o.top_p > 0 && o.top_p <= 1)) {
    return Error(Code::kInvalidArgument, "top_p {} must be above 0 and at most 1", o.top_p);
  }
  if (!(o.min_p >= 0 && o.min_p <= 1)) {
    return Error(Code::kInvalidArgument, "min_p {} must be from 0 to 1", o.min_p);
  }
  if (!std::isfinite(o.repetition_penalty) || o.repetition_penalty <= 0) {
    return Error(Code::kInvalidArgument, "repetition_penalty {} must be positive (1: none)", o.repetition_penalty);
  }
  return OkStatus();
}

Sampler::Sampler(const SamplingOptions& options) : options_(options), generator_(options.seed) {}

Result<std::vector<double>> Sampler::Distribution(std::span<const float> logits, std::span<const int32_t> seen) const {
  if (logits.empty()) return Error(Code::kInternal, "no logits to sample from");
  std::vector<double> s(logits.begin(), logits.end());
  bool any = false;
  for (double& v : s) {
    if (std::isnan(v)) v = kImpossible;
    any = any || v != kImpossible;
  }
  if (!any) return Error(Code::kInternal, "the model gave no logit that is a number: nothing can be sampled");

  if (options_.repetition_penalty != 1.0) {
    for (int32_t token : std::set<int32_t>(seen.begin(), seen.end())) {
      if (token < 0 || static_cast<size_t>(token) >= s.size()) continue;
      double& v = s[static_cast<size_t>(token)];
      v = v < 0 ? v * options_.repetition_penalty : v / options_.repetition_penalty;
    }
  }
  if (options_.temperature < kGreedyBelow) {
    std::vector<double> one_hot(s.size(), 0.0);
    one_hot[ArgMax(s)] = 1.0;
    return one_hot;
  }
  for (double& v : s) v /= options_.temperature;

  if (options_.top_k > 0 && options_.top_k < s.size()) {
    std::vector<double> sorted = s;
    std::nth_element(sorted.begin(), sorted.begin() + (options_.top_k - 1), sorted.end(), std::greater<>());
    const double kth = sorted[options_.top_k - 1];
    for (double& v : s) {
      if (v < kth) v = kImpossible;
    }
  }
  if (options_.top_p < 1.0) {
    // From the least likely up: drop tokens while the mass dropped so far stays within 1 - top_p;
    // the most likely token always stays.
    const std::vector<double> p = Softmax(s);
    std::vector<size_t> order(s.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return s[a] < s[b]; });
    double cumulative = 0;
    for (size_t i = 0; i + 1 < order.size(); ++i) {
      cumulative += p[order[i]];
      if (cumulative > 1.0 - options_.top_p) break;
      s[order[i]] = kImpossible;
    }
  }
  if (options_.min_p > 0) {
    const std::vector<double> p = Softmax(s);
    const double floor = options_.min_p * p[ArgMax(p)];
    for (size_t i = 0; i < s.size(); ++i) {
      if (p[i] < floor) s[i] = kImpossible;
    }
  }
  return Softmax(s);
}

Result<int32_t> Sampler::Next(std::span<const float> logits, std::span<const int32_t> seen) {
  Result<std::vector<double>> p = Distribution(logits, seen);
  if (!p.ok()) return p.status();
  if (options_.temperature < 1e-5) return static_cast<int32_t>(ArgMax(*p));  // one-hot (Distribution)
  // A uniform in [0, 1) from 53 raw bits, then the inverse of the distribution in token order.
  const double u = static_cast<double>(generator_() >> 11) * 0x1p-53;
  double cumulative = 0;
  size_t last = 0;
  for (size_t i = 0; i < p->size(); ++i) {
    if ((*p)[i] == 0) continue;
    last = i;
    cumulative += (*p)[i];
    if (u < cumulative) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(last);  // u beyond a sum rounded below 1
}

}  // namespace warmpool::transformer
