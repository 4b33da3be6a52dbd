// A test that uses device 0 of the CUDA driver in front of it: the driver test double (two devices
// of 64 MiB, configured before the driver is first loaded; a real driver ignores the variables),
// or a GPU's driver when scripts/gpu-check.sh runs the test there.
#pragma once

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "devmem/cuda_memory.h"
#include "tests/gpu/in_process_memory.h"

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

// The worker's device memory service on device 0, its grants made in this process
// (tests/gpu/in_process_memory.h); every grant is released by the end.
class CudaMemoryTest : public CudaDeviceTest {
 protected:
  void SetUp() override {
    CudaDeviceTest::SetUp();
    Result<CudaDeviceInfo> info = device_->Info();
    ASSERT_TRUE(info.ok());
    on_the_double_ = info->name.find("test double") != std::string::npos;
    Result<std::unique_ptr<InProcessCudaMemory>> memory = InProcessCudaMemory::Open(0);
    ASSERT_TRUE(memory.ok()) << memory.status().ToString();
    in_process_ = std::move(*memory);
    memory_ = &in_process_->memory();
  }
  void TearDown() override {
    // Every engine and region of the test is gone: nothing may still hold a grant.
    EXPECT_EQ(in_process_->grants(), 0u) << "every grant is released";
    in_process_.reset();
  }

  bool on_the_double_ = false;
  std::unique_ptr<InProcessCudaMemory> in_process_;
  CudaMemory* memory_ = nullptr;
};

}  // namespace warmpool::testing
