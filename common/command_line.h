// The command line of every warmpool program: --help prints and exits 0, --version prints
// "PROGRAM VERSION" (the project's version, common/version.h) and exits 0, and a usage error prints
// one line in one format and exits 2 (CLI11's own exit codes, 105 and so on, would tell a script
// nothing):
//
//   PROGRAM[ COMMAND]: MESSAGE; see PROGRAM[ COMMAND] --help
//
// e.g. `warmpool: unknown command "frob"; see warmpool --help`. Errors the daemon answers are
// another format ("error: CODE: message", exit 1) printed by the program itself.
#pragma once

#include <cctype>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/version.h"

namespace warmpool {

namespace command_line_detail {

inline std::string Basename(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// What went wrong, in the words of the format above (CLI11's own words are for its own format).
inline std::string Describe(CLI::App& at, const CLI::ParseError& e, const std::vector<std::string>& extras) {
  if (!extras.empty()) {
    const std::string& first = extras.front();
    if (first.size() > 1 && first[0] == '-') return "unknown option \"" + first + "\"";
    // A word where a command was expected: CLI11 reports it as a missing subcommand.
    if (!at.get_subcommands([](CLI::App*) { return true; }).empty() && at.get_subcommands().empty()) {
      return "unknown command \"" + first + "\"";
    }
    return "unexpected argument \"" + first + "\"";
  }
  if (e.get_name() == "RequiredError" && std::string(e.what()).rfind("A subcommand", 0) == 0) {
    std::string names;
    for (CLI::App* sub : at.get_subcommands([](CLI::App*) { return true; })) {
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    return "a command is required (" + names + ")";
  }
  std::string what = e.what();
  if (!what.empty() && std::isupper(static_cast<unsigned char>(what[0])) &&
      !(what.size() > 1 && std::isupper(static_cast<unsigned char>(what[1])))) {
    what[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(what[0])));
  }
  return what;
}

}  // namespace command_line_detail

// Prints a usage error in the format above for the deepest command parsed so far; returns 2.
inline int UsageError(CLI::App& app, const CLI::ParseError& e) {
  using command_line_detail::Basename;
  CLI::App* at = &app;
  std::string path = Basename(app.get_name());
  for (;;) {
    std::vector<CLI::App*> parsed = at->get_subcommands();
    if (parsed.empty()) break;
    at = parsed.front();
    path += " " + at->get_name();
  }
  // The arguments no option or command took: the deepest command's, else the program's.
  std::vector<std::string> extras = at->remaining();
  if (extras.empty()) extras = app.remaining(/*recurse=*/true);
  const std::string message = command_line_detail::Describe(*at, e, extras);
  std::fprintf(stderr, "%s: %s; see %s --help\n", path.c_str(), message.c_str(), path.c_str());
  return 2;
}

// -1 when the program goes on; otherwise the status to exit with (the message is printed).
inline int ParseCommandLine(CLI::App& app, int argc, char** argv) {
  if (app.get_option_no_throw("--version") == nullptr) {
    app.set_version_flag("--version",
                         command_line_detail::Basename(argc > 0 ? argv[0] : app.get_name()) + " " +
                             kProjectVersion,
                         "print the version and exit");
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return UsageError(app, e);
  }
  return -1;
}

}  // namespace warmpool
