// Kept weights for the tests of the descriptor store (warm_store_test, service_manager_double_test):
// a memfd region of recognisable bytes and the record the core would keep of it.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include <gtest/gtest.h>

#include "supervisor/core/kept.h"

namespace warmpool::supervisor::testing {

inline int Region(uint64_t bytes, uint8_t seed) {
  int fd = memfd_create("weights", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  std::string data(bytes, '\0');
  for (uint64_t i = 0; i < bytes; i++) data[i] = static_cast<char>((i * 31 + seed) & 0xff);
  EXPECT_EQ(write(fd, data.data(), data.size()), static_cast<ssize_t>(bytes));
  return fd;
}

inline KeptWeights Kept(const std::string& name, int fd, uint64_t bytes, bool parked) {
  KeptWeights k;
  k.name = name;
  k.engine = "dense";
  k.path = "/models/" + name + ".safetensors";
  k.weights.version = FileVersion{bytes + 10, 5, 6, 7, 8};
  k.parked = parked;
  k.weights.handle = fd;
  k.weights.header = name + " header";
  k.weights.weight_bytes = bytes;
  return k;
}

}  // namespace warmpool::supervisor::testing
