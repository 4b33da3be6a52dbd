// Clients with known inputs and expected outputs. Every request is accounted for: exactly one reply
// (a second reply to the same request, or a reply to nothing, is a finding), a correct result when
// it succeeds, and an error code from the scenario's allowed list when it does not.
#pragma once

#include <atomic>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "chaos/harness.h"

namespace warmpool::chaos {

struct TrafficSpec {
  const ModelUnderTest* model = nullptr;
  int clients = 2;
  int requests = 8;       // per client; 0: until Stop(), and at least 3
  int pipeline = 2;       // requests in flight per connection
  uint32_t rows = 4;
  uint32_t deadline_ms = 0;  // 0: the daemon's default
  std::set<Code> allowed;    // error codes that are acceptable in this scenario
  bool tolerate_disconnect = false;  // the supervisor itself is killed
  uint64_t seed = 1;
};

struct TrafficResult {
  int sent = 0;
  int ok = 0;
  std::map<Code, int> errors;
  std::vector<std::string> problems;  // wrong results, unexpected codes, duplicates, lost replies
  std::string Summary() const;
};

class Traffic {
 public:
  Traffic(Harness& harness, TrafficSpec spec);
  ~Traffic();
  void Start();
  void Stop() { stop_ = true; }  // for open-ended traffic
  TrafficResult Join();

 private:
  void RunClient(int index);

  Harness& harness_;
  TrafficSpec spec_;
  std::vector<std::thread> threads_;
  std::vector<TrafficResult> results_;
  std::atomic<bool> stop_{false};
  bool counted_ = false;  // in the harness's open_traffic_: started, not yet joined
};

// A check that the traffic got exactly one correct reply per request (and sent some).
void ExpectTraffic(Checks& checks, const std::string& who, const TrafficResult& r);

// A steady client on the bystander, for "other models were served throughout".
struct Bystander {
  explicit Bystander(Harness& h, std::set<Code> allowed = {})
      : traffic(h, TrafficSpec{&h.bystander(), 1, 0, 1, 2, 0, std::move(allowed), false, 99}) {
    traffic.Start();
  }
  void Finish(Checks& checks) {
    traffic.Stop();
    ExpectTraffic(checks, "bystander", traffic.Join());
  }
  Traffic traffic;
};

}  // namespace warmpool::chaos
