#include "bench/session.h"

#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <latch>
#include <thread>
#include <vector>

#include "bench/relay.h"
#include "ipc/framing.h"

namespace warmpool::bench {

namespace {

using Clock = std::chrono::steady_clock;

// The pipelined load of both targets: request ids from 1 up, `depth` outstanding; `payload` finds
// the echoed tensor in a reply (the relay echoes the request, warmpool answers infer_reply).
Status PipelineOn(ipc::BlockingChannel& channel, const std::string& model, const client::Matrix& input,
                  uint64_t first_id, uint64_t count, uint32_t depth, std::vector<uint64_t>& latencies,
                  const v1::Tensor& (*payload)(const v1::Envelope&)) {
  v1::Envelope request = MakeInferRequest(model, input, first_id, first_id == 1);
  v1::Envelope reply;
  std::string frame;
  std::vector<Clock::time_point> sent(count);  // by request, allocated before the clock runs
  uint64_t next = 0, done = 0;
  auto send = [&]() -> Status {
    request.set_request_id(first_id + next);
    if (next > 0 || first_id > 1) request.clear_protocol_version();
    frame.clear();
    if (Status s = ipc::AppendFrame(frame, request); !s.ok()) return s;
    sent[next] = Clock::now();
    next++;
    return channel.WriteRaw(frame);
  };
  while (next < count && next < depth) {
    if (Status s = send(); !s.ok()) return s;
  }
  while (done < count) {
    if (Status s = channel.Read(reply); !s.ok()) return s;
    const uint64_t k = reply.request_id() - first_id;
    // Replies may come in another order (two workers): each is timed from its own send.
    if (reply.request_id() < first_id || k >= next) {
      return Error(Code::kInternal, "reply to request {} while {}..{} are outstanding", reply.request_id(),
                   first_id + done, first_id + next - 1);
    }
    latencies.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - sent[k]).count());
    const v1::Tensor& out = payload(reply);
    if (out.rows() != input.rows || out.cols() != input.cols || out.data().size() != input.data.size() * sizeof(float)) {
      return Error(Code::kInternal, "echo returned {} x {} for a {} x {} input{}", out.rows(), out.cols(), input.rows,
                   input.cols, reply.has_error() ? ": " + reply.error().message() : "");
    }
    done++;
    if (next < count) {
      if (Status s = send(); !s.ok()) return s;
    }
  }
  return OkStatus();
}

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

  Status Pipeline(uint64_t count, uint32_t depth, std::vector<uint64_t>& latencies) override {
    Status s = PipelineOn(client_->channel(), model_, input_, next_id_, count, depth, latencies,
                          [](const v1::Envelope& r) -> const v1::Tensor& { return r.infer_reply().output(); });
    next_id_ += count;
    return s;
  }

 private:
  uint64_t next_id_ = 1u << 30;  // above the ids the client library assigns
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

  Status Pipeline(uint64_t count, uint32_t depth, std::vector<uint64_t>& latencies) override {
    Status s = PipelineOn(channel_, model_, input_, next_request_id_, count, depth, latencies,
                          [](const v1::Envelope& r) -> const v1::Tensor& { return r.infer().input(); });
    next_request_id_ += count;
    return s;
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

Result<double> RunPhase(Sessions& sessions, uint64_t total, std::vector<uint64_t>* out, uint32_t depth) {
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
      if (depth > 1) {
        errors[i] = sessions[i]->Pipeline(count, depth, latencies[i]);
        return;
      }
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
