#include "supervisor/http_session.h"

#include <unistd.h>

#include <cstring>

#include <spdlog/spdlog.h>

#include "supervisor/http_generate.h"
#include "http/response.h"

namespace warmpool::supervisor {

namespace {

struct WriteRequest {
  uv_write_t req;
  std::string bytes;
};

// Constant-time comparison: a token is not guessed byte by byte from response times.
}  // namespace

HttpSession::HttpSession(uv_loop_t* loop, Options options, Hooks hooks)
    : loop_(loop), options_(std::move(options)), hooks_(std::move(hooks)), parser_(options_.limits) {
  handle_.pipe.data = this;
}

HttpSession* HttpSession::OpenPipe(uv_loop_t* loop, int fd, Options options, Hooks hooks) {
  auto* s = new HttpSession(loop, std::move(options), std::move(hooks));
  uv_pipe_init(loop, &s->handle_.pipe, 0);
  s->handle_.pipe.data = s;
  if (uv_pipe_open(&s->handle_.pipe, fd) != 0) {
    close(fd);
    s->closed_ = true;  // nobody was told of it: no hook to call
    uv_close(reinterpret_cast<uv_handle_t*>(&s->handle_), [](uv_handle_t* h) {
      delete static_cast<HttpSession*>(h->data);
    });
    return nullptr;
  }
  return s->Start() ? s : nullptr;
}

HttpSession* HttpSession::AcceptTcp(uv_loop_t* loop, uv_stream_t* server, Options options, Hooks hooks) {
  auto* s = new HttpSession(loop, std::move(options), std::move(hooks));
  uv_tcp_init(loop, &s->handle_.tcp);
  s->handle_.tcp.data = s;
  if (uv_accept(server, s->stream()) != 0) {
    s->closed_ = true;
    uv_close(reinterpret_cast<uv_handle_t*>(&s->handle_), [](uv_handle_t* h) {
      delete static_cast<HttpSession*>(h->data);
    });
    return nullptr;
  }
  uv_tcp_nodelay(&s->handle_.tcp, 1);
  return s->Start() ? s : nullptr;
}

bool HttpSession::Start() {
  uv_timer_init(loop_, progress_timer_.get());
  progress_timer_.MarkInitialized();
  progress_timer_.get()->data = this;
  last_read_ms_ = uv_now(loop_);
  StartReading();
  return true;
}

void HttpSession::StartReading() {
  reading_ = true;
  uv_read_start(
      stream(),
      [](uv_handle_t* h, size_t, uv_buf_t* buf) {
        auto* self = static_cast<HttpSession*>(h->data);
        *buf = uv_buf_init(self->buffer_, sizeof(self->buffer_));
      },
      [](uv_stream_t* s, ssize_t n, const uv_buf_t* buf) {
        static_cast<HttpSession*>(s->data)->OnRead(n, buf);
      });
}

bool HttpSession::RoomToRead() const {
  return exchanges_.size() < kMaxPipelined && pending_write_bytes() < kMaxUnreadWhileReading;
}

void HttpSession::MakeReady(Exchange& e, std::string response, Code code) {
  // A response that begins here (not the tail of one streamed) carries the exchange's headers.
  e.response = response.starts_with("HTTP/") ? http::WithHeaders(std::move(response), e.cors) : std::move(response);
  e.code = code;
  e.ready = true;
  held_bytes_ += e.response.size();
}

void HttpSession::EndWith(const Status& why, int status, bool linger) {
  if (closed_) return;
  if (!exchanges_.empty() || lingering_) return Close(why);  // answers owed come first: none
  no_more_requests_ = true;
  linger_ = linger;
  Exchange e;
  e.keep_alive = false;
  MakeReady(e, http::ErrorResponse(why, false, status), why.code());
  exchanges_.push_back(std::move(e));
  Flush();
}

std::string HttpSession::PeerAddress() const {
  if (!options_.tcp) return "";
  sockaddr_storage addr{};
  int len = sizeof(addr);
  if (uv_tcp_getpeername(&handle_.tcp, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "";
  char name[64] = {};
  if (addr.ss_family == AF_INET6) {
    uv_ip6_name(reinterpret_cast<const sockaddr_in6*>(&addr), name, sizeof(name));
  } else {
    uv_ip4_name(reinterpret_cast<const sockaddr_in*>(&addr), name, sizeof(name));
  }
  return name;
}

void HttpSession::UpdateReading() {
  const bool want = !closed_ && !no_more_requests_ && RoomToRead();
  if (closed_ || want == reading_) return;
  if (want) {
    if (parser_.mid_request()) request_started_ms_ += uv_now(loop_) - paused_at_ms_;
    StartReading();
  } else {
    uv_read_stop(stream());
    paused_at_ms_ = uv_now(loop_);
  }
  reading_ = want;
}

void HttpSession::CloseWhenWritten() {
  if (closed_ || unread_bytes_ != 0 || lingering_) return;
  if (!linger_) return Close(OkStatus());
  // Shut down our side, then read and drop what the client still sends until it closes or the
  // lingering time is up: closing with its bytes unread would reset the connection, and the
  // client might lose the error response before reading it.
  lingering_ = true;
  shutdown_.data = this;
  if (uv_shutdown(&shutdown_, stream(), [](uv_shutdown_t*, int) {}) != 0) return Close(OkStatus());
  if (!reading_) StartReading();
  uv_timer_start(progress_timer_.get(), [](uv_timer_t* t) {
    static_cast<HttpSession*>(t->data)->Close(OkStatus());
  }, kLingerMs, 0);
}

void HttpSession::Close(const Status& why) {
  if (closed_) return;
  closed_ = true;
  if (progress_timer_.active()) uv_timer_stop(progress_timer_.get());
  progress_timer_.Close();
  uv_close(reinterpret_cast<uv_handle_t*>(&handle_), [](uv_handle_t* h) {
    delete static_cast<HttpSession*>(h->data);
  });
  if (hooks_.closed) hooks_.closed(why);
}

void HttpSession::OnRead(ssize_t n, const uv_buf_t* buf) {
  if (closed_) return;
  if (lingering_) {
    if (n < 0) Close(OkStatus());
    return;  // dropped
  }
  if (n < 0) {
    // EOF or a reset: what was asked is still answered when the peer only half-closed.
    no_more_requests_ = true;
    uv_read_stop(stream());
    reading_ = false;
    if (n != UV_EOF || (exchanges_.empty() && unread_bytes_ == 0)) {
      return Close(Error(Code::kUnavailable, "peer left"));
    }
    return Flush();  // closes once the last answers are out
  }
  if (n == 0) return;
  last_read_ms_ = uv_now(loop_);
  unparsed_.append(buf->base, static_cast<size_t>(n));
  Consume();
}

void HttpSession::Consume() {
  if (consuming_) return;  // Flush below resumes reading: not from inside this loop
  consuming_ = true;
  size_t offset = 0;  // of unparsed_ taken by the parser (erased once, after the loop)
  while (!closed_ && !no_more_requests_ && offset < unparsed_.size() && RoomToRead()) {
    if (!parser_.mid_request()) request_started_ms_ = uv_now(loop_);
    Result<size_t> taken = parser_.Feed(std::string_view(unparsed_).substr(offset));
    if (!taken.ok()) {
      // The request cannot be read: answered after the ones before it, then the connection goes.
      no_more_requests_ = true;
      linger_ = true;
      offset = unparsed_.size();
      Exchange e;
      e.keep_alive = false;
      MakeReady(e, http::ErrorResponse(taken.status(), false, parser_.status_code()),
                taken.status().code());
      exchanges_.push_back(std::move(e));
      if (hooks_.refused) hooks_.refused(metrics::Refusal::kHttpUnreadable);
      break;
    }
    offset += *taken;
    // curl waits a second for this before sending a large body; only when nothing is owed before it.
    if (parser_.TakeExpectsContinue() && exchanges_.empty() && unread_bytes_ == 0) {
      Write("HTTP/1.1 100 Continue\r\n\r\n");
    }
    std::optional<http::Request> request = parser_.Next();
    if (!request) {
      if (*taken == 0) break;
      continue;
    }
    Handle(std::move(*request));
  }
  if (!closed_) unparsed_.erase(0, offset);
  UpdateReading();  // held back: reading resumes as responses make room
  consuming_ = false;
  Flush();
}

void HttpSession::Handle(http::Request&& request) {
  const bool reserve = !options_.reserve_refusal.ok();
  const bool keep_alive = request.keep_alive && !reserve;  // a reserve place serves one request
  if (!keep_alive) no_more_requests_ = true;
  Exchange e;
  e.keep_alive = keep_alive;
  e.http11 = request.http11;
  e.head_only = request.method == "HEAD";
  e.cors = CorsHeaders(*options_.access, request);
  const HttpVerdict verdict = Authenticate(*options_.access, request, options_.tcp);
  if (std::optional<std::string> preflight = Preflight(*options_.access, request, keep_alive)) {
    // Before credentials: a browser sends none with its preflight.
    e.plan.immediate = std::move(*preflight);
  } else if (!verdict.allowed) {
    e.plan = httpapi::Refusal(request,
                              Error(Code::kPermissionDenied,
                                    "this API asks for a key: send \"Authorization: Bearer KEY\" with one of the "
                                    "keys in the daemon's [http] api_keys_file"),
                              keep_alive, 401);
    e.plan.immediate = http::WithHeaders(std::move(*e.plan.immediate), {{"WWW-Authenticate", "Bearer"}});
    if (hooks_.refused) hooks_.refused(metrics::Refusal::kHttpUnauthenticated);
  } else {
    e.plan = httpapi::PlanRequest(request, keep_alive);
  }
  if (reserve && !e.plan.immediate && e.plan.kind != httpapi::Kind::kMetrics) {
    e.plan.immediate = http::ErrorResponse(options_.reserve_refusal, false);
    e.plan.code = options_.reserve_refusal.code();
    if (hooks_.refused) hooks_.refused(options_.reserve_reason);
  } else if (e.plan.immediate && e.plan.code != Code::kOk && verdict.allowed && hooks_.refused) {
    hooks_.refused(metrics::Refusal::kHttpInvalid);  // (a missing key is counted as such, above)
  }
  if (e.plan.immediate) {
    MakeReady(e, std::move(*e.plan.immediate), e.plan.code);
  } else if (e.plan.kind == httpapi::Kind::kMetrics) {
    MakeReady(e,
              http::Response(200, "text/plain; version=0.0.4; charset=utf-8",
                             hooks_.metrics ? hooks_.metrics() : "", keep_alive),
              Code::kOk);
  }
  if (e.ready) {
    exchanges_.push_back(std::move(e));
    return;
  }
  const bool admin_token = verdict.admin;
  e.request_id = next_request_id_++;
  v1::Envelope envelope = std::move(e.plan.request);  // the exchange keeps only how to answer
  envelope.set_request_id(e.request_id);
  envelope.set_protocol_version(1);
  // Load progress lines are the native API's; an Ollama load answers once, as Ollama's does.
  const bool load = e.plan.kind == httpapi::Kind::kLoad && !e.plan.ollama;
  exchanges_.push_back(std::move(e));
  hooks_.request(std::move(envelope), admin_token);  // may answer at once (OnReply)
  if (load && !closed_ && !uv_is_active(reinterpret_cast<uv_handle_t*>(progress_timer_.get()))) {
    uv_timer_start(progress_timer_.get(), [](uv_timer_t* t) {
      static_cast<HttpSession*>(t->data)->Progress();
    }, kProgressPeriodMs, kProgressPeriodMs);
  }
}

void HttpSession::Progress() {
  // Only the first exchange writes: a load behind another response reports when its turn comes.
  if (closed_) return;
  bool loading = false;
  for (const Exchange& e : exchanges_) {
    loading = loading || (e.plan.kind == httpapi::Kind::kLoad && !e.plan.ollama && !e.ready);
  }
  if (!loading) {
    uv_timer_stop(progress_timer_.get());
    return;
  }
  if (!progress_requests_.empty()) return;  // the last one is not answered yet
  const uint64_t id = next_request_id_++;
  progress_requests_.insert(id);
  v1::Envelope status;
  status.set_request_id(id);
  status.mutable_status();
  hooks_.request(std::move(status), false);
}

void HttpSession::OnReply(const v1::Envelope& reply) {
  if (closed_) return;
  if (progress_requests_.erase(reply.request_id()) != 0) {
    if (exchanges_.empty() || !reply.has_status_reply()) return;
    Exchange& head = exchanges_.front();
    if (head.plan.kind != httpapi::Kind::kLoad || head.plan.ollama || head.ready || !head.http11) return;
    std::string line = httpapi::ProgressLine(head.plan.model, reply.status_reply());
    if (line.empty()) return;
    if (!head.streaming) {
      head.streaming = true;
      Write(http::ChunkedHead(200, "application/x-ndjson", head.keep_alive, head.cors));
    }
    Write(http::Chunk(line));
    return;
  }
  for (Exchange& e : exchanges_) {
    if (e.ready || e.request_id != reply.request_id()) continue;
    if (reply.has_generate_chunk()) {
      OnChunk(e, reply.generate_chunk());
      return;
    }
    const Code code = reply.has_error() ? static_cast<Code>(reply.error().code()) : Code::kOk;
    if (e.plan.kind == httpapi::Kind::kGenerate && e.plan.stream && (e.streaming || !e.held_lines.empty())) {
      MakeReady(e, EndStream(e, reply), code);
    } else if (e.streaming) {
      MakeReady(e, http::Chunk(httpapi::FinalLoadLine(reply)) + http::LastChunk(), code);
    } else {
      MakeReady(e, httpapi::RenderReply(e.plan, reply, e.keep_alive), code);
    }
    break;
  }
  Flush();
}

void HttpSession::OnChunk(Exchange& e, const v1::GenerateChunk& chunk) {
  if (e.plan.kind != httpapi::Kind::kGenerate || !e.plan.stream) return;  // not asked for: dropped
  std::string line = httpapi::StreamChunk(e.plan, chunk);
  if (&e == &exchanges_.front() && e.http11) {
    if (!e.streaming) {
      e.streaming = true;
      Write(http::ChunkedHead(200, httpapi::StreamType(e.plan), e.keep_alive, e.cors));
    }
    Write(http::Chunk(line));
    return;
  }
  // Behind another response (or HTTP/1.0): held, and counted as held, until its turn.
  held_bytes_ += line.size();
  e.held_lines += line;
  if (pending_write_bytes() > options_.max_unread_bytes) {
    Close(Error(Code::kResourceExhausted, "the client leaves {} bytes of streamed text held behind an earlier "
                                          "response or unread (limit {})",
                pending_write_bytes(), options_.max_unread_bytes));
  }
}

std::string HttpSession::EndStream(Exchange& e, const v1::Envelope& reply) {
  held_bytes_ -= e.held_lines.size();
  std::string lines = std::move(e.held_lines);
  e.held_lines.clear();
  lines += httpapi::StreamEnd(e.plan, reply);
  if (!e.http11) return http::Response(200, httpapi::StreamType(e.plan), lines, e.keep_alive, e.cors);
  std::string out = e.streaming ? "" : http::ChunkedHead(200, httpapi::StreamType(e.plan), e.keep_alive, e.cors);
  // One chunk per line, as they would have gone out one by one.
  for (size_t at = 0; at < lines.size();) {
    const size_t end = lines.find('\n', at) + 1;
    out += http::Chunk(lines.substr(at, end - at));
    at = end;
  }
  return out + http::LastChunk();
}

void HttpSession::WriteHeldLines() {
  if (closed_ || exchanges_.empty()) return;
  Exchange& head = exchanges_.front();
  if (head.ready || head.held_lines.empty() || !head.http11) return;
  if (!head.streaming) {
    head.streaming = true;
    Write(http::ChunkedHead(200, httpapi::StreamType(head.plan), head.keep_alive, head.cors));
  }
  held_bytes_ -= head.held_lines.size();
  std::string lines = std::move(head.held_lines);
  head.held_lines.clear();
  for (size_t at = 0; at < lines.size();) {
    const size_t end = lines.find('\n', at) + 1;
    Write(http::Chunk(lines.substr(at, end - at)));
    at = end;
  }
}

void HttpSession::Flush() {
  while (!closed_ && !exchanges_.empty() && exchanges_.front().ready) {
    Exchange e = std::move(exchanges_.front());
    exchanges_.pop_front();
    held_bytes_ -= e.response.size();
    if (e.head_only) e.response.resize(e.response.find("\r\n\r\n") + 4);
    if (hooks_.answered) hooks_.answered(e.code);
    Write(std::move(e.response));
    if (!e.keep_alive) {
      no_more_requests_ = true;
      exchanges_.clear();  // answered nothing after a close: HTTP says no more
      held_bytes_ = 0;
    }
  }
  if (closed_) return;
  // A stream held behind the responses just written is at the head now: what it holds goes out
  // before its next line does (OnChunk writes the head's lines as they come).
  WriteHeldLines();
  if (pending_write_bytes() > options_.max_unread_bytes) {
    return Close(Error(Code::kResourceExhausted,
                       "the client leaves {} bytes of responses unread or held behind an earlier "
                       "request ([limits] max_unread_reply_bytes)",
                       pending_write_bytes()));
  }
  if (no_more_requests_ && exchanges_.empty()) return CloseWhenWritten();
  // Room again for requests held back: parse what waits and read on.
  if (!reading_ && !no_more_requests_ && RoomToRead()) Consume();
}

void HttpSession::Write(std::string bytes) {
  if (closed_ || bytes.empty()) return;
  auto* w = new WriteRequest;
  w->bytes = std::move(bytes);
  w->req.data = this;
  unread_bytes_ += w->bytes.size();
  uv_buf_t buf = uv_buf_init(w->bytes.data(), static_cast<unsigned>(w->bytes.size()));
  int rc = uv_write(&w->req, stream(), &buf, 1, [](uv_write_t* req, int status) {
    auto* w = reinterpret_cast<WriteRequest*>(req);
    auto* self = static_cast<HttpSession*>(req->data);
    self->unread_bytes_ -= w->bytes.size();
    delete w;
    if (self->closed_) return;
    if (status != 0) return self->Close(Error(Code::kUnavailable, "write: {}", uv_strerror(status)));
    if (self->no_more_requests_ && self->exchanges_.empty()) return self->CloseWhenWritten();
    if (!self->reading_ && self->RoomToRead()) self->Consume();
  });
  if (rc != 0) {
    unread_bytes_ -= w->bytes.size();
    delete w;
    return Close(Error(Code::kUnavailable, "write: {}", uv_strerror(rc)));
  }
  if (pending_write_bytes() > options_.max_unread_bytes) {
    Close(Error(Code::kResourceExhausted, "the client leaves {} bytes of responses unread",
                pending_write_bytes()));
  }
}

}  // namespace warmpool::supervisor
