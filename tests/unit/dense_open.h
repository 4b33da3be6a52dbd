// Opening a dense model file through the engine ABI, as the dense engine's tests do.
#pragma once

#include <string>

#include <gtest/gtest.h>

#include "devmem/host_memory.h"
#include "engines/builtin.h"
#include "engines/catalog/builtin_engines.h"
#include "tests/unit/dense_reference.h"

namespace warmpool::testing {

inline Result<Engine> OpenDense(const std::string& path, HostMemory& memory) {
  return Engine::Open(FindBuiltinEngine("dense"), Spec(path), memory.service());
}

// Opens and expects an INVALID_ARGUMENT naming the problem.
inline void ExpectOpenFails(const std::string& path, const std::string& substring, Code code = Code::kInvalidArgument) {
  HostMemory memory;
  Result<Engine> engine = OpenDense(path, memory);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), code) << engine.status().ToString();
  EXPECT_NE(engine.status().message().find(substring), std::string::npos) << engine.status().message();
}

}  // namespace warmpool::testing
