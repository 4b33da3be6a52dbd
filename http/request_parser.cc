#include "http/request_parser.h"

#include <http_parser.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <utility>

namespace warmpool::http {

namespace {

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::optional<std::string> PercentDecode(std::string_view text, bool plus_is_space) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); i++) {
    char c = text[i];
    if (c == '%') {
      if (i + 2 >= text.size()) return std::nullopt;
      int hi = HexValue(text[i + 1]), lo = HexValue(text[i + 2]);
      if (hi < 0 || lo < 0) return std::nullopt;
      out += static_cast<char>(hi * 16 + lo);
      i += 2;
    } else if (c == '+' && plus_is_space) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

const std::string& Request::Header(const std::string& lower_name) const {
  static const std::string kEmpty;
  auto it = headers.find(lower_name);
  return it == headers.end() ? kEmpty : it->second;
}

struct RequestParser::Impl {
  http_parser parser{};
  http_parser_settings settings{};
  ParserLimits limits;
  // The request being parsed.
  Request current;
  std::string url;
  std::string field, value;
  bool in_value = false;
  uint64_t header_bytes = 0;
  bool began = false;
  bool expects_continue = false;  // the request being read waits for "100 Continue"
  // A limit crossed inside a callback: the callback returns nonzero and Feed reports this.
  Status limit_error;
  int limit_status = 0;
  std::optional<Request> done;

  static Impl* Of(http_parser* p) { return static_cast<Impl*>(p->data); }

  int CountHeader(size_t n) {
    header_bytes += n;
    if (header_bytes <= limits.max_header_bytes) return 0;
    limit_error = Error(Code::kResourceExhausted, "request headers are over {} bytes",
                        limits.max_header_bytes);
    limit_status = 431;
    return 1;
  }
  void EndHeader() {
    if (field.empty()) return;
    std::string name = Lower(field);
    auto [it, fresh] = current.headers.emplace(name, value);
    if (!fresh) it->second += ", " + value;
    field.clear();
    value.clear();
  }
  Status Finish() {
    // Target: path and query, percent-decoded.
    http_parser_url u;
    http_parser_url_init(&u);
    if (http_parser_parse_url(url.data(), url.size(), 0, &u) != 0 || !(u.field_set & (1 << UF_PATH))) {
      return Error(Code::kInvalidArgument, "request target \"{}\" is not a path", url.substr(0, 200));
    }
    auto part = [&](int f) {
      return std::string_view(url).substr(u.field_data[f].off, u.field_data[f].len);
    };
    std::optional<std::string> path = PercentDecode(part(UF_PATH), false);
    if (!path) return Error(Code::kInvalidArgument, "request path has a malformed %-escape");
    current.path = std::move(*path);
    if (u.field_set & (1 << UF_QUERY)) {
      std::string_view q = part(UF_QUERY);
      while (!q.empty()) {
        size_t amp = q.find('&');
        std::string_view pair = q.substr(0, amp);
        q = amp == std::string_view::npos ? std::string_view() : q.substr(amp + 1);
        if (pair.empty()) continue;
        size_t eq = pair.find('=');
        auto key = PercentDecode(pair.substr(0, eq), true);
        auto val = PercentDecode(eq == std::string_view::npos ? "" : pair.substr(eq + 1), true);
        if (!key || !val) return Error(Code::kInvalidArgument, "request query has a malformed %-escape");
        current.query[*key] = *val;
      }
    }
    current.method = http_method_str(static_cast<http_method>(parser.method));
    current.keep_alive = http_should_keep_alive(&parser) != 0;
    current.http11 = parser.http_major == 1 && parser.http_minor >= 1;
    return OkStatus();
  }
};

RequestParser::RequestParser(ParserLimits limits) : impl_(std::make_unique<Impl>()) {
  impl_->limits = limits;
  http_parser_init(&impl_->parser, HTTP_REQUEST);
  impl_->parser.data = impl_.get();
  http_parser_settings& s = impl_->settings;
  http_parser_settings_init(&s);
  s.on_message_begin = [](http_parser* p) {
    Impl* i = Impl::Of(p);
    i->current = Request{};
    i->url.clear();
    i->field.clear();
    i->value.clear();
    i->in_value = false;
    i->header_bytes = 0;
    i->began = true;
    return 0;
  };
  s.on_url = [](http_parser* p, const char* at, size_t n) {
    Impl* i = Impl::Of(p);
    if (i->CountHeader(n)) return 1;
    i->url.append(at, n);
    return 0;
  };
  s.on_header_field = [](http_parser* p, const char* at, size_t n) {
    Impl* i = Impl::Of(p);
    if (i->CountHeader(n)) return 1;
    if (i->in_value) {
      i->EndHeader();
      i->in_value = false;
    }
    i->field.append(at, n);
    return 0;
  };
  s.on_header_value = [](http_parser* p, const char* at, size_t n) {
    Impl* i = Impl::Of(p);
    if (i->CountHeader(n)) return 1;
    i->in_value = true;
    i->value.append(at, n);
    return 0;
  };
  s.on_headers_complete = [](http_parser* p) {
    Impl* i = Impl::Of(p);
    i->EndHeader();
    if (p->http_major != 1 || p->http_minor > 1) {
      i->limit_error = Error(Code::kInvalidArgument, "HTTP/{}.{} is not spoken here: use HTTP/1.1",
                             p->http_major, p->http_minor);
      i->limit_status = 505;
      return -1;
    }
    if (p->method == HTTP_CONNECT) {
      i->limit_error = Error(Code::kInvalidArgument, "CONNECT is not served here");
      i->limit_status = 405;
      return -1;
    }
    // An offer to upgrade (curl --http2 asks for h2c) is declined by answering in HTTP/1.1, as
    // RFC 9110 allows: the request is an ordinary one.
    p->upgrade = 0;
    i->expects_continue = Lower(i->current.Header("expect")) == "100-continue";
    // A declared body over the limit is refused before any of it is read.
    if ((p->flags & F_CONTENTLENGTH) && p->content_length > i->limits.max_body_bytes) {
      i->limit_error = Error(Code::kResourceExhausted, "request body of {} bytes is over the limit of {}",
                             p->content_length, i->limits.max_body_bytes);
      i->limit_status = 413;
      return -1;
    }
    if (p->content_length != ULLONG_MAX && p->content_length > 0 && p->content_length < (16u << 20)) {
      i->current.body.reserve(p->content_length);
    }
    return 0;
  };
  s.on_body = [](http_parser* p, const char* at, size_t n) {
    Impl* i = Impl::Of(p);
    if (i->current.body.size() + n > i->limits.max_body_bytes) {
      i->limit_error = Error(Code::kResourceExhausted, "request body is over the limit of {} bytes",
                             i->limits.max_body_bytes);
      i->limit_status = 413;
      return 1;
    }
    i->current.body.append(at, n);
    return 0;
  };
  s.on_message_complete = [](http_parser* p) {
    Impl* i = Impl::Of(p);
    if (Status st = i->Finish(); !st.ok()) {
      i->limit_error = st;
      i->limit_status = 400;
      return 1;
    }
    i->done = std::move(i->current);
    i->began = false;
    i->expects_continue = false;
    http_parser_pause(p, 1);  // one request at a time: the caller takes it first
    return 0;
  };
}

RequestParser::~RequestParser() = default;

Result<size_t> RequestParser::Feed(std::span<const char> bytes) {
  if (!error_.ok()) return error_;
  if (impl_->done) return size_t{0};  // take the complete one first
  http_parser& p = impl_->parser;
  size_t taken = http_parser_execute(&p, &impl_->settings, bytes.data(), bytes.size());
  http_errno err = HTTP_PARSER_ERRNO(&p);
  if (err == HPE_PAUSED) {
    http_parser_pause(&p, 0);
    return taken;
  }
  if (err != HPE_OK) {
    if (!impl_->limit_error.ok()) {
      error_ = impl_->limit_error;
      status_code_ = impl_->limit_status;
    } else if (err == HPE_HEADER_OVERFLOW) {
      error_ = Error(Code::kResourceExhausted, "request headers are too large");
      status_code_ = 431;
    } else if (err == HPE_INVALID_VERSION) {
      error_ = Error(Code::kInvalidArgument, "only HTTP/1.0 and HTTP/1.1 are spoken here");
      status_code_ = 505;
    } else {
      error_ = Error(Code::kInvalidArgument, "malformed HTTP request: {}", http_errno_description(err));
      status_code_ = 400;
    }
    return error_;
  }
  if (p.upgrade) {
    error_ = Error(Code::kInvalidArgument, "protocol upgrades (and CONNECT) are not supported");
    status_code_ = 400;
    return error_;
  }
  return taken;
}

std::optional<Request> RequestParser::Next() {
  std::optional<Request> out = std::move(impl_->done);
  impl_->done.reset();
  return out;
}

bool RequestParser::mid_request() const { return impl_->began; }

bool RequestParser::TakeExpectsContinue() { return std::exchange(impl_->expects_continue, false); }

}  // namespace warmpool::http

namespace warmpool::http {

Sniffed SniffFirstBytes(std::string_view first) {
  static constexpr std::string_view kPrefixes[] = {"GET ", "HEAD", "POST", "PUT ", "DELE", "OPTI", "PATC"};
  const std::string_view head = first.substr(0, 4);
  bool could_be = false;
  for (std::string_view p : kPrefixes) {
    if (p.substr(0, head.size()) != head) continue;
    if (head.size() == 4) return Sniffed::kHttp;
    could_be = true;
  }
  return could_be ? Sniffed::kNeedMore : Sniffed::kFramed;
}

}  // namespace warmpool::http
