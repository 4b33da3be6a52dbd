// `warmpool top`: a live view of the pool. On a terminal it takes the screen over and redraws it
// at each refresh until q; otherwise it prints one plain block of text per refresh (no escapes),
// blocks separated by a blank line, each covering the interval before it.
#pragma once

#include <cstdint>
#include <string>

namespace warmpool::top {

struct TopOptions {
  std::string socket;
  double interval_seconds = 1;
  uint64_t iterations = 0;  // refreshes shown before top ends; 0: until q (or forever, plain)
};

// The exit status: 0 after q, a signal or the iterations; 1 when no daemon answers at the
// socket, or when the daemon goes away during plain output (on a terminal top says so and keeps
// trying to reconnect instead).
int RunTop(const TopOptions& options);

}  // namespace warmpool::top
