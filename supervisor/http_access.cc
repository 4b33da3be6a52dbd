#include "supervisor/http_access.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>

#include <fmt/format.h>

namespace warmpool::supervisor {
namespace {

constexpr size_t kMinSecretBytes = 16;

// Equal in a time that depends on the lengths only.
bool SameSecret(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); i++) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// The token of "Authorization: Bearer TOKEN" (the scheme's case does not matter: RFC 9110, 11.1).
std::string_view BearerToken(const http::Request& request) {
  constexpr std::string_view kBearer = "bearer ";
  const std::string& auth = request.Header("authorization");
  if (auth.size() < kBearer.size()) return {};
  for (size_t i = 0; i < kBearer.size(); i++) {
    if (std::tolower(static_cast<unsigned char>(auth[i])) != kBearer[i]) return {};
  }
  return std::string_view(auth).substr(kBearer.size());
}

// A preflight's Access-Control-Request-Headers, to allow back: header names and commas only
// (the official clients send headers of their own, x-stainless-..., besides Authorization).
std::string RequestedHeaders(const http::Request& request) {
  const std::string& asked = request.Header("access-control-request-headers");
  const bool plain = !asked.empty() && asked.size() <= 1024 &&
                     std::all_of(asked.begin(), asked.end(), [](char c) {
                       return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == ',' || c == ' ';
                     });
  return plain ? asked : "Authorization, Content-Type";
}

// A file of secrets: it must exist and be readable by its owner alone.
Result<std::ifstream> OpenSecretFile(const std::string& path, const char* key) {
  struct stat st{};
  if (stat(path.c_str(), &st) != 0) {
    return Error(Code::kFailedPrecondition, "[http] {} {}: {}", key, path, std::strerror(errno));
  }
  if ((st.st_mode & 0077) != 0) {
    return Error(Code::kFailedPrecondition, "[http] {} {} is readable by others: chmod 600 it", key, path);
  }
  std::ifstream in(path);
  if (!in) return Error(Code::kFailedPrecondition, "[http] {} {}: cannot be read", key, path);
  return in;
}

std::string Trimmed(std::string line) {
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
  const size_t start = line.find_first_not_of(" \t");
  return start == std::string::npos ? std::string() : line.substr(start);
}

bool OriginAllowed(const HttpAccess& access, const std::string& origin) {
  if (origin.empty()) return false;
  return std::any_of(access.cors_origins.begin(), access.cors_origins.end(),
                     [&](const std::string& o) { return o == "*" || o == origin; });
}

}  // namespace

HttpVerdict Authenticate(const HttpAccess& access, const http::Request& request, bool tcp) {
  HttpVerdict verdict;
  if (!tcp) return verdict;  // the Unix socket: peer credentials decide
  const std::string_view token = BearerToken(request);
  verdict.admin = !access.admin_token.empty() && SameSecret(token, access.admin_token);
  if (access.api_keys.empty()) return verdict;
  bool key = false;
  for (const std::string& k : access.api_keys) key |= SameSecret(token, k);  // every key, no early exit
  verdict.allowed = key || verdict.admin;
  return verdict;
}

http::Headers CorsHeaders(const HttpAccess& access, const http::Request& request) {
  if (access.cors_origins.empty()) return {};
  // Whether allowed or not, the response varies by Origin: caches must know it.
  const std::string& origin = request.Header("origin");
  if (!OriginAllowed(access, origin)) return {{"Vary", "Origin"}};
  return {{"Access-Control-Allow-Origin", origin}, {"Vary", "Origin"}};  // the origin itself, not "*"
}

std::optional<std::string> Preflight(const HttpAccess& access, const http::Request& request, bool keep_alive) {
  if (request.method != "OPTIONS" || request.Header("access-control-request-method").empty() ||
      !OriginAllowed(access, request.Header("origin"))) {
    return std::nullopt;
  }
  // The origin's own headers (CorsHeaders) are added with every response's (http_session.cc).
  http::Headers headers = {{"Access-Control-Allow-Methods", "GET, POST, PUT, DELETE, OPTIONS"},
                           {"Access-Control-Allow-Headers", RequestedHeaders(request)},
                           {"Access-Control-Max-Age", "600"}};
  return http::Response(204, "text/plain", "", keep_alive, headers);
}

Result<std::vector<std::string>> ReadApiKeys(const std::string& path) {
  Result<std::ifstream> in = OpenSecretFile(path, "api_keys_file");
  if (!in.ok()) return in.status();
  std::vector<std::string> keys;
  size_t number = 0;
  for (std::string line; std::getline(*in, line);) {
    number++;
    std::string key = Trimmed(std::move(line));
    if (key.empty() || key[0] == '#') continue;
    if (key.size() < kMinSecretBytes) {
      return Error(Code::kFailedPrecondition,
                   "[http] api_keys_file {} line {}: a key of {} characters; use at least {} (e.g. head -c 32 "
                   "/dev/urandom | base64)",
                   path, number, key.size(), kMinSecretBytes);
    }
    keys.push_back(std::move(key));
  }
  if (keys.empty()) return Error(Code::kFailedPrecondition, "[http] api_keys_file {} holds no key", path);
  return keys;
}

ApiKeysReload ReloadApiKeys(const std::string& path, bool keys_in_force) {
  ApiKeysReload out;
  if (path.empty()) {
    if (keys_in_force) {
      out.log = "reload: [http] api_keys_file is no longer set; the API keys in force stay until a restart";
    }
    return out;
  }
  Result<std::vector<std::string>> keys = ReadApiKeys(path);
  if (!keys.ok()) {
    out.error = true;
    out.log = fmt::format("reload: {}; {}", keys.status().message(),
                          keys_in_force ? "the API keys in force stay" : "TCP requests still need no key");
    return out;
  }
  out.log = fmt::format("reload: {} API key(s) from {}", keys->size(), path);
  out.value = std::move(*keys);
  return out;
}

AdminTokenReload ReloadAdminToken(const std::string& path, bool token_in_force) {
  AdminTokenReload out;
  if (path.empty()) {
    if (token_in_force) {
      out.value = std::string();
      out.log = "reload: [http] admin_token_file is no longer set; no TCP request administers";
    }
    return out;
  }
  Result<std::string> token = ReadAdminToken(path);
  if (!token.ok()) {
    out.error = true;
    out.log = fmt::format("reload: {}; {}", token.status().message(),
                          token_in_force ? "the admin token in force stays" : "no TCP request administers");
    return out;
  }
  out.log = fmt::format("reload: the admin token from {}", path);
  out.value = std::move(*token);
  return out;
}

Result<std::string> ReadAdminToken(const std::string& path) {
  Result<std::ifstream> in = OpenSecretFile(path, "admin_token_file");
  if (!in.ok()) return in.status();
  std::string token;
  std::getline(*in, token);
  while (!token.empty() && (token.back() == '\r' || token.back() == ' ')) token.pop_back();
  if (token.size() < kMinSecretBytes) {
    return Error(Code::kFailedPrecondition,
                 "[http] admin_token_file {} holds a token of {} characters: use at least {} (e.g. "
                 "head -c 32 /dev/urandom | base64 > FILE)",
                 path, token.size(), kMinSecretBytes);
  }
  return token;
}

}  // namespace warmpool::supervisor
