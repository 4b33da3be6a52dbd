#include "bench/http_generate.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/language_model.h"
#include "bench/skeleton.h"
#include "bench/stats.h"

namespace warmpool::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Stream {
  double first_ms = 0;  // send to the first token's text
  double total_ms = 0;  // send to the end
  uint32_t tokens = 0;
};

// A loopback port nobody listens on now (bound and let go).
Result<int> FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) close(fd);
    return Error(Code::kUnavailable, "no loopback port to listen on");
  }
  close(fd);
  return static_cast<int>(ntohs(a.sin_port));
}

class HttpGenerate {
 public:
  HttpGenerate(HttpGenerateOptions options, BenchRun& run) : options_(std::move(options)), run_(run) {}

  Status Run() {
    const std::string models = run_.File("models");
    Result<LanguageModel> lm = WriteLanguageModel(models + "/lm", options_.tokenizer_dir, options_.model_mib, options_.prompt);
    if (!lm.ok()) return lm.status();
    prompt_ = lm->prompt;
    Result<int> port = FreePort();
    if (!port.ok()) return port.status();
    port_ = *port;
    const std::string config =
        fmt::format("[daemon]\nmodels_dir = \"{}\"\n[http]\nlisten = \"127.0.0.1:{}\"\n", models, port_);
    if (Status s = run_.StartDaemon(options_.daemon, "host", config); !s.ok()) return s;
    Result<std::unique_ptr<client::Client>> c = run_.Connect();
    if (!c.ok()) return run_.WithLog(c.status());
    client_ = std::move(*c);
    std::vector<double> framed_first, framed_rate, sse_first, sse_rate;
    for (uint32_t r = 0; r <= options_.rounds; r++) {  // round 0 loads the model and warms both paths
      Result<Stream> framed = Framed();
      if (!framed.ok()) return run_.WithLog(framed.status());
      Result<Stream> sse = Sse();
      if (!sse.ok()) return run_.WithLog(sse.status());
      if (sse->tokens != framed->tokens) {
        return Error(Code::kInternal, "the streams differ: {} tokens through SSE, {} framed", sse->tokens, framed->tokens);
      }
      if (r == 0) continue;
      framed_first.push_back(framed->first_ms);
      framed_rate.push_back(framed->tokens * 1000.0 / framed->total_ms);
      sse_first.push_back(sse->first_ms);
      sse_rate.push_back(sse->tokens * 1000.0 / sse->total_ms);
      tokens_ = framed->tokens;
    }
    Print(Median(framed_rate), Median(sse_rate), Median(framed_first), Median(sse_first), lm->layers, lm->prompt_tokens);
    if (fd_ >= 0) close(fd_);
    return run_.StopDaemon();
  }

 private:
  Result<Stream> Framed() {
    v1::GenerateRequest r;
    r.set_model("lm");
    r.set_prompt(Prompt());
    r.set_max_tokens(options_.tokens);
    r.set_temperature(0);
    r.set_stream(true);
    Stream s;
    const auto start = Clock::now();
    Result<v1::GenerateReply> reply = client_->Generate(r, [&](const v1::GenerateChunk& chunk) {
      if (s.first_ms == 0 && !chunk.text().empty()) s.first_ms = MsSince(start);  // as the SSE side times it
    });
    if (!reply.ok()) return reply.status();
    s.total_ms = MsSince(start);
    s.tokens = reply->completion_tokens();
    return s;
  }

  // POST /v1/completions with stream: the events as they come, read off the socket directly (what
  // any SSE client does first); the usage chunk says how many tokens.
  Result<Stream> Sse() {
    const std::string body = nlohmann::json{{"model", "lm"},
                                            {"prompt", Prompt()},
                                            {"max_tokens", options_.tokens},
                                            {"temperature", 0},
                                            {"stream", true},
                                            {"stream_options", {{"include_usage", true}}}}
                                 .dump();
    // One kept-alive connection for every round, as the framed client keeps its socket and as
    // HTTP clients pool theirs: what is timed is the request, not a TCP handshake.
    const std::string request = fmt::format(
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n"
        "\r\n{}",
        body.size(), body);
    if (fd_ < 0) {
      fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(static_cast<uint16_t>(port_));
      const int one = 1;
      setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      if (fd_ < 0 || connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
        return Error(Code::kUnavailable, "connecting to 127.0.0.1:{} failed", port_);
      }
    }
    const int fd = fd_;
    Stream s;
    const auto start = Clock::now();
    if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(request.size())) {
      return Error(Code::kUnavailable, "POST /v1/completions to 127.0.0.1:{} failed", port_);
    }
    std::string got;
    char buffer[16384];
    size_t parsed = 0;  // events before this are read
    for (;;) {
      const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
      if (n <= 0) break;
      got.append(buffer, static_cast<size_t>(n));
      // The first event whose text is not empty is the first token's text.
      for (size_t at; s.first_ms == 0 && (at = got.find("data: {", parsed)) != std::string::npos;) {
        const size_t end = got.find('\n', at);
        if (end == std::string::npos) break;
        const nlohmann::json event = nlohmann::json::parse(got.substr(at + 6, end - at - 6), nullptr, false);
        if (event.is_object() && event.contains("choices") && !event["choices"].empty() &&
            !event["choices"][0].value("text", "").empty()) {
          s.first_ms = MsSince(start);
        }
        parsed = end;
      }
      // The last event, then the chunked body's end: the connection is ready for the next.
      const size_t done = got.find("data: [DONE]");
      if (done != std::string::npos && s.total_ms == 0) s.total_ms = MsSince(start);
      if (done != std::string::npos && got.find("0\r\n\r\n", done) != std::string::npos) break;
    }
    const size_t usage = got.find("\"completion_tokens\":");
    if (got.find("data: [DONE]") == std::string::npos || usage == std::string::npos) {
      return Error(Code::kInternal, "the event stream ended early: {}", got.substr(0, 400));
    }
    s.tokens = static_cast<uint32_t>(std::stoul(got.substr(usage + 20)));
    if (s.first_ms == 0) s.first_ms = s.total_ms;
    return s;
  }

  void Print(double framed_rate, double sse_rate, double framed_first, double sse_first, uint32_t layers,
             uint32_t prompt_tokens) {
    const double ratio = sse_rate / framed_rate;
    const double overhead = sse_first - framed_first;
    if (options_.json) {
      std::printf("{\"mode\": \"http-generate\", \"model_mib\": %u, \"layers\": %u, \"prompt_tokens\": %u, "
                  "\"tokens\": %u, \"framed_tokens_per_s\": %.2f, \"sse_tokens_per_s\": %.2f, "
                  "\"sse_vs_framed\": %.3f, \"framed_first_token_ms\": %.3f, \"sse_first_token_ms\": %.3f, "
                  "\"first_token_overhead_ms\": %.3f}\n",
                  options_.model_mib, layers, prompt_tokens, tokens_, framed_rate, sse_rate, ratio, framed_first,
                  sse_first, overhead);
      return;
    }
    std::printf("warmpool-bench --generate --http: a %u MiB bf16 model (%u layers), a %u-token prompt, %u tokens, "
                "medians of %u rounds\n",
                options_.model_mib, layers, prompt_tokens, tokens_, options_.rounds);
    std::printf("  framed protocol (Unix socket)   %8.2f tokens/s   first token %8.3f ms\n", framed_rate, framed_first);
    std::printf("  OpenAI SSE (loopback TCP)       %8.2f tokens/s   first token %8.3f ms\n", sse_rate, sse_first);
    std::printf("  SSE / framed                    %8.3fx           first token %+8.3f ms (goals >= 0.95x, <= 1 ms)\n",
                ratio, overhead);
  }

  HttpGenerateOptions options_;
  BenchRun& run_;
  std::unique_ptr<client::Client> client_;
  // Each request's prompt begins differently, so that the prefix cache serves none of it: both
  // paths are timed with their prefill.
  std::string Prompt() { return fmt::format("{} {}", ++asked_, prompt_); }
  std::string prompt_;
  uint32_t asked_ = 0;
  int port_ = 0;
  int fd_ = -1;  // the SSE client's connection, kept alive
  uint32_t tokens_ = 0;
};

}  // namespace

int RunHttpGenerate(const HttpGenerateOptions& options) {
  return BenchRun::Main("--generate --http", [&](BenchRun& run) { return HttpGenerate(options, run).Run(); });
}

}  // namespace warmpool::bench
