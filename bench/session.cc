#include "bench/session.h"

#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <latch>
#include <thread>
#include <vector>

#include "bench/relay.h"

namespace warmpool::bench {

namespace {

class WarmpoolSession : public Session {
 public:
  WarmpoolSession(std::unique_ptr<client::Client> client, std::string model,
                  const client::Matrix& input)
      : client_(std::move(client)), model_(std::move(model)), input_(input) {}

  Status RoundTrip() override {
    Result<client::Matrix> out = client_->Infer(model_, input_);
    if (!out.ok()) return out.status();
    if (out->rows != input_.rows || out->cols != input_.cols) {
      return Error(Code::kInternal, "warmpool echo returned {} x {} for a {} x {} input", out->rows,
                   out->cols, input_.rows, input_.cols);
    }
    return OkStatus();
  }

 private:
  std::unique_ptr<client::Client> client_;
  std::string model_;
  const client::Matrix& input_;
};

class RelaySession : public Session {
 public:
  RelaySession(int fd, std::string model, const client::Matrix& input)
      : fd_(fd), channel_(fd, ipc::kDefaultMaxFrameBytes), model_(std::move(model)), input_(input) {}
  ~RelaySession() override { close(fd_); }

  Status RoundTrip() override {
    uint64_t id = next_request_id_++;
    v1::Envelope request = MakeInferRequest(model_, input_, id, id == 1);
    if (Status s = channel_.Write(request); !s.ok()) return s;
    v1::Envelope reply;
    if (Status s = channel_.Read(reply); !s.ok()) return s;
    if (reply.request_id() != id) {
      return Error(Code::kInternal, "relay returned request {} for request {}", reply.request_id(),
                   id);
    }
    // The same copy out that Client::Infer makes of its reply tensor.
    Result<client::Matrix> out = client::FromTensor(reply.infer().input());
    if (!out.ok()) return out.status();
    if (out->rows != input_.rows || out->cols != input_.cols) {
      return Error(Code::kInternal, "relay returned {} x {} for a {} x {} input", out->rows,
                   out->cols, input_.rows, input_.cols);
    }
    return OkStatus();
  }

 private:
  int fd_;
  ipc::BlockingChannel channel_;
  std::string model_;
  const client::Matrix& input_;
  uint64_t next_request_id_ = 1;
};

}  // namespace

void SetReceiveTimeout(int fd) {
  timeval tv{};
  tv.tv_sec = kReceiveTimeoutSeconds;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

v1::Envelope MakeInferRequest(const std::string& model, const client::Matrix& input,
                              uint64_t request_id, bool first) {
  // Mirrors Client::Infer + Client::Send field by field.
  v1::Envelope request;
  request.mutable_infer()->set_model(model);
  *request.mutable_infer()->mutable_input() = client::ToTensor(input);
  request.mutable_infer()->set_deadline_ms(0);
  request.set_request_id(request_id);
  if (first) request.set_protocol_version(ipc::kProtocolVersion);
  return request;
}

Result<std::unique_ptr<Session>> ConnectWarmpool(const std::string& socket_path,
                                                 const std::string& model,
                                                 const client::Matrix& input) {
  Result<std::unique_ptr<client::Client>> client = client::Client::Connect(socket_path);
  if (!client.ok()) return client.status();
  SetReceiveTimeout((*client)->fd());
  return std::unique_ptr<Session>(new WarmpoolSession(std::move(*client), model, input));
}

Result<std::unique_ptr<Session>> ConnectRelay(const std::string& socket_path,
                                              const std::string& model,
                                              const client::Matrix& input) {
  Result<int> fd = ConnectUnix(socket_path);
  if (!fd.ok()) return fd.status();
  SetReceiveTimeout(*fd);
  return std::unique_ptr<Session>(new RelaySession(*fd, model, input));
}

Result<double> RunPhase(Sessions& sessions, uint64_t total, std::vector<uint64_t>* out) {
  size_t n = sessions.size();
  std::vector<std::vector<uint64_t>> latencies(n);
  std::vector<Status> errors(n);
  std::latch ready(static_cast<std::ptrdiff_t>(n));
  std::latch go(1);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < n; ++i) {
    uint64_t count = total / n + (i < total % n ? 1 : 0);
    threads.emplace_back([&, i, count] {
      latencies[i].reserve(count);
      ready.count_down();
      go.wait();
      for (uint64_t k = 0; k < count; ++k) {
        auto t0 = std::chrono::steady_clock::now();
        Status s = sessions[i]->RoundTrip();
        auto t1 = std::chrono::steady_clock::now();
        if (!s.ok()) {
          errors[i] = std::move(s);
          return;
        }
        latencies[i].push_back(
            std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
      }
    });
  }
  ready.wait();
  auto start = std::chrono::steady_clock::now();
  go.count_down();
  for (std::thread& t : threads) t.join();
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (size_t i = 0; i < n; ++i) {
    if (!errors[i].ok()) return errors[i];
  }
  if (out != nullptr) {
    for (auto& l : latencies) out->insert(out->end(), l.begin(), l.end());
  }
  return wall;
}

}  // namespace warmpool::bench
