// FUZZ_CHECK: an invariant of a fuzz target. Unlike assert it stays on in optimized builds; a
// failure prints what broke and aborts, which libFuzzer reports as a crash with the input saved.
#pragma once

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(condition)                                                                  \
  do {                                                                                         \
    if (!(condition)) {                                                                        \
      std::fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #condition);  \
      std::abort();                                                                            \
    }                                                                                          \
  } while (0)
