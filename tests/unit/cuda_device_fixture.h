// A test that uses device 0 of the CUDA driver in front of it: the driver test double (two devices
// of 64 MiB, configured before the driver is first loaded; a real driver ignores the variables),
// or a GPU's driver when scripts/gpu-check.sh runs the test there.
#pragma once

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "devmem/cuda_memory.h"
#include "devmem/cuda_service.h"

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

// The worker's device memory service (CudaMemory) on device 0, its grants made in this process by
// allocations of its own, as the owner would make them; every grant is released by the end.
class CudaMemoryTest : public CudaDeviceTest {
 protected:
  void SetUp() override {
    CudaDeviceTest::SetUp();
    Result<CudaDeviceInfo> info = device_->Info();
    ASSERT_TRUE(info.ok());
    on_the_double_ = info->name.find("test double") != std::string::npos;
    Result<std::unique_ptr<CudaMemory>> memory = CudaMemory::Open(
        0, CudaSharing::kVmm,
        [this](uint64_t bytes) -> Result<OwnerGrant> {
          std::lock_guard<std::mutex> lock(mutex_);
          Result<DeviceAllocation> allocation = DeviceAllocation::Create(*device_, bytes);
          if (!allocation.ok()) return allocation.status();
          Result<int> fd = allocation->Export();
          if (!fd.ok()) return fd.status();
          const uint64_t id = next_++;
          const uint64_t granted = allocation->bytes();
          allocations_.emplace(id, std::move(*allocation));
          return OwnerGrant{id, *fd, granted};
        },
        [this](uint64_t grant) {
          std::lock_guard<std::mutex> lock(mutex_);
          allocations_.erase(grant);
        });
    ASSERT_TRUE(memory.ok()) << memory.status().ToString();
    memory_ = std::move(*memory);
  }
  void TearDown() override {
    memory_.reset();
    EXPECT_TRUE(allocations_.empty()) << "every grant is released";
  }

  bool on_the_double_ = false;
  std::mutex mutex_;
  std::map<uint64_t, DeviceAllocation> allocations_;
  uint64_t next_ = 1;
  std::unique_ptr<CudaMemory> memory_;
};

}  // namespace warmpool::testing
