// A test that uses device 0 of the CUDA driver in front of it: the driver test double (two devices
// of 64 MiB, configured before the driver is first loaded; a real driver ignores the variables),
// or a GPU's driver when scripts/gpu-check.sh runs the test there.
#pragma once

#include <cstdlib>
#include <optional>

#include <gtest/gtest.h>

#include "devmem/cuda_memory.h"

namespace warmpool::testing {

class CudaDeviceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    setenv("WARMPOOL_FAKE_CUDA_DEVICES", "2", 0);
    setenv("WARMPOOL_FAKE_CUDA_MEMORY", "67108864", 0);
  }
  void SetUp() override {
    Result<CudaDevice> device = CudaDevice::Open(0);
    ASSERT_TRUE(device.ok()) << device.status().ToString();
    device_.emplace(std::move(*device));
  }
  std::optional<CudaDevice> device_;
};

}  // namespace warmpool::testing
