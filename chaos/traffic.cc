#include "chaos/traffic.h"

#include <cmath>
#include <deque>
#include <random>

namespace warmpool::chaos {

std::string TrafficResult::Summary() const {
  std::string s = fmt::format("{}/{} ok", ok, sent);
  for (const auto& [code, n] : errors) s += fmt::format(", {} {}", n, CodeName(code));
  return s;
}

Traffic::Traffic(Harness& harness, TrafficSpec spec) : harness_(harness), spec_(std::move(spec)) {}

Traffic::~Traffic() {
  stop_ = true;
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
  if (counted_) harness_.open_traffic_--;
}

void Traffic::Start() {
  harness_.open_traffic_++;
  counted_ = true;
  results_.resize(spec_.clients);
  for (int i = 0; i < spec_.clients; i++) threads_.emplace_back([this, i] { RunClient(i); });
}

TrafficResult Traffic::Join() {
  for (auto& t : threads_) t.join();
  if (counted_) harness_.open_traffic_--;
  counted_ = false;
  threads_.clear();
  TrafficResult total;
  for (const TrafficResult& r : results_) {
    total.sent += r.sent;
    total.ok += r.ok;
    for (const auto& [code, n] : r.errors) total.errors[code] += n;
    total.problems.insert(total.problems.end(), r.problems.begin(), r.problems.end());
  }
  return total;
}

namespace {

bool Near(const client::Matrix& a, const client::Matrix& b) {
  if (a.rows != b.rows || a.cols != b.cols || a.data.size() != b.data.size()) return false;
  for (size_t i = 0; i < a.data.size(); i++) {
    if (std::fabs(a.data[i] - b.data[i]) > 1e-4f * (1 + std::fabs(a.data[i]))) return false;
  }
  return true;
}

}  // namespace

void Traffic::RunClient(int index) {
  TrafficResult& result = results_[index];
  const ModelUnderTest& model = *spec_.model;
  auto connected = harness_.Connect();
  if (!connected.ok()) {
    if (!spec_.tolerate_disconnect) result.problems.push_back(connected.status().ToString());
    return;
  }
  client::Client& client = **connected;
  std::mt19937_64 rng(spec_.seed * 1000003 + index);
  std::uniform_real_distribution<float> dist(-1, 1);
  struct Sent {
    uint64_t id;
    client::Matrix expected;
  };
  std::deque<Sent> window;
  int issued = 0;
  auto more = [&] {
    return spec_.requests > 0 ? issued < spec_.requests : (issued < 3 || !stop_.load());
  };
  while (more() || !window.empty()) {
    while (more() && static_cast<int>(window.size()) < spec_.pipeline) {
      client::Matrix input{spec_.rows, model.in_features,
                           std::vector<float>(uint64_t{spec_.rows} * model.in_features)};
      for (float& v : input.data) v = dist(rng);
      auto id = client.SendInfer(model.name, input, client::InferOptions{spec_.deadline_ms, std::nullopt});
      if (!id.ok()) {
        if (!spec_.tolerate_disconnect) result.problems.push_back("send: " + id.status().ToString());
        return;
      }
      issued++;
      result.sent++;
      window.push_back({*id, harness_.Expected(model, input)});
    }
    Sent next = std::move(window.front());
    window.pop_front();
    auto reply = client.Wait(next.id);
    if (!reply.ok()) {
      if (!spec_.tolerate_disconnect) {
        result.problems.push_back(fmt::format("request {} got no reply: {}", next.id,
                                              reply.status().ToString()));
      }
      return;
    }
    if (reply->has_infer_reply()) {
      auto out = client::FromTensor(reply->infer_reply().output());
      if (out.ok() && Near(next.expected, *out)) {
        result.ok++;
      } else {
        result.problems.push_back(fmt::format("request {} on {}: wrong result", next.id, model.name));
      }
    } else if (reply->has_error()) {
      Code code = CodeFromInt(reply->error().code());
      result.errors[code]++;
      if (spec_.allowed.count(code) == 0) {
        result.problems.push_back(fmt::format("request {} on {}: unexpected {}", next.id,
                                              model.name, client::StatusOf(*reply).ToString()));
      }
    } else {
      result.problems.push_back(fmt::format("request {}: reply of the wrong kind", next.id));
    }
  }
  // Exactly once: the daemon answers in order of completion, so a stray or duplicate reply would
  // arrive before the reply to this last probe.
  auto id = client.Send(client::StatusRequest());
  if (!id.ok()) return;
  auto reply = client.Receive();
  if (reply.ok() && reply->request_id() != *id) {
    result.problems.push_back(fmt::format("stray reply to request {} (answered twice?)",
                                          reply->request_id()));
  }
}

void ExpectTraffic(Checks& checks, const std::string& who, const TrafficResult& r) {
  std::string detail = r.Summary();
  for (size_t i = 0; i < r.problems.size() && i < 3; i++) detail += "; " + r.problems[i];
  checks.Expect(r.problems.empty() && r.sent > 0,
                fmt::format("{}: {} (one reply each, results correct)", who, r.Summary()), detail);
}

}  // namespace warmpool::chaos
