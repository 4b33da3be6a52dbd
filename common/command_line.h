// The command line of every warmpool program: --help prints and exits 0, a usage error prints what
// is wrong and exits 2 (CLI11's own exit codes, 105 and so on, would tell a script nothing).
#pragma once

#include <CLI/CLI.hpp>

namespace warmpool {

// -1 when the program goes on; otherwise the status to exit with (the message is printed).
inline int ParseCommandLine(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return -1;
}

}  // namespace warmpool
