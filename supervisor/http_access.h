// Who may use the HTTP API, and from which web pages. On the Unix socket the peer's credentials
// decide (supervisor/access.h); over TCP the request's bearer token does:
//   - API keys ([http] api_keys_file): with any configured, every TCP request needs one (or the
//     admin token); without, TCP serves loopback only and needs none for reads and inference;
//   - the admin token ([http] admin_token_file) makes a request an admin's, as before.
// Tokens are compared in constant time, and against every key, so that neither a key's bytes nor
// which key matched shows in the time an answer takes.
//
// CORS ([http] cors_origins): off unless origins are listed ("*" for any). A request from a listed
// origin gets Access-Control-Allow-Origin; a preflight (OPTIONS) from one is answered here, before
// any credentials, since browsers send none with it.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "http/request_parser.h"
#include "http/response.h"

namespace warmpool::supervisor {

struct HttpAccess {
  std::string admin_token;                // "" none
  std::vector<std::string> api_keys;      // empty: none asked for
  std::vector<std::string> cors_origins;  // empty: no CORS; "*": any origin
};

struct HttpVerdict {
  bool allowed = true;  // false: answer 401
  bool admin = false;   // it carries the admin token
};
HttpVerdict Authenticate(const HttpAccess& access, const http::Request& request, bool tcp);

// The CORS headers a response to this request carries: none without cors_origins; Vary: Origin
// with them, and Access-Control-Allow-Origin when its Origin is listed.
http::Headers CorsHeaders(const HttpAccess& access, const http::Request& request);
// The answer to a CORS preflight from an allowed origin; nullopt for any other request.
std::optional<std::string> Preflight(const HttpAccess& access, const http::Request& request, bool keep_alive);

// [http] api_keys_file: one key per line (blank lines and lines starting with '#' skipped), each
// of at least 16 characters; the file must not be readable by others (chmod 600).
Result<std::vector<std::string>> ReadApiKeys(const std::string& path);
// [http] api_keys_file read again (SIGHUP; `path` as the configuration names it now): the keys
// that serve from now on, or none to change, and what to log. A file that cannot be read, is
// readable by others or holds no key changes nothing (an error): the keys in force stay. So does
// a configuration that names no file while keys are in force (a warning): a listener beyond
// loopback may have been allowed because of them, so only a restart drops them.
template <typename Secret>
struct SecretReload {
  std::optional<Secret> value;  // nullopt: what is in force stays
  std::string log;              // "": nothing to say
  bool error = false;
};
using ApiKeysReload = SecretReload<std::vector<std::string>>;
ApiKeysReload ReloadApiKeys(const std::string& path, bool keys_in_force);
// [http] admin_token_file: its first line, of at least 16 characters; not readable by others.
Result<std::string> ReadAdminToken(const std::string& path);
// [http] admin_token_file read again (SIGHUP): the token that administers from now on, or none to
// change. A file that cannot be used changes nothing (an error: the token in force stays, so that
// a mistake while rotating it does not lock the operator out). A configuration that names no file
// takes the token away ("": TCP requests administer no more), the safe direction, unlike keys.
using AdminTokenReload = SecretReload<std::string>;
AdminTokenReload ReloadAdminToken(const std::string& path, bool token_in_force);

}  // namespace warmpool::supervisor
