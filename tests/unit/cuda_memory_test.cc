// Device memory through the driver API, against the driver test double (tests/cuda_double): the
// same code runs against libcuda on a GPU (scripts/gpu-check.sh). The double is configured before
// the driver is loaded: two devices of 64 MiB.
#include "devmem/cuda_memory.h"
#include "tests/unit/cuda_device_fixture.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#include <gtest/gtest.h>

namespace warmpool {
namespace {

constexpr uint64_t kMiB = 1u << 20;

using CudaMemoryTest = testing::CudaDeviceTest;

std::vector<uint8_t> Pattern(uint64_t bytes, uint8_t seed) {
  std::vector<uint8_t> data(bytes);
  for (uint64_t i = 0; i < bytes; ++i) data[i] = static_cast<uint8_t>(seed + i * 7);
  return data;
}

TEST_F(CudaMemoryTest, DescribesTheDevice) {
  Result<CudaDeviceInfo> info = device_->Info();
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_FALSE(info->name.empty());
  EXPECT_GT(info->total_bytes, 0u);
  EXPECT_LE(info->free_bytes, info->total_bytes);
  EXPECT_TRUE(info->vmm);
  EXPECT_TRUE(info->fd_handles);
  EXPECT_GT(info->granularity, 0u);
  EXPECT_GE((*CudaDriver::Get())->version(), 11000);
}

TEST_F(CudaMemoryTest, ADeviceThatDoesNotExistIsAnInvalidArgument) {
  Result<CudaDevice> device = CudaDevice::Open(99);
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.status().code(), Code::kInvalidArgument);
  EXPECT_NE(device.status().message().find("does not exist"), std::string::npos) << device.status().message();
}

TEST_F(CudaMemoryTest, AnExportedAllocationIsSharedThroughItsDescriptor) {
  Result<DeviceAllocation> allocation = DeviceAllocation::Create(*device_, 3 * kMiB);
  ASSERT_TRUE(allocation.ok()) << allocation.status().ToString();
  EXPECT_EQ(allocation->bytes() % device_->granularity(), 0u);
  EXPECT_GE(allocation->bytes(), 3 * kMiB);
  Result<int> fd = allocation->Export();
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();

  Result<DeviceMapping> writer = DeviceMapping::Import(*device_, *fd, 3 * kMiB, DeviceAccess::kReadWrite);
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  std::vector<uint8_t> pattern = Pattern(3 * kMiB, 11);
  const CudaDriver& cu = device_->driver();
  ASSERT_EQ(cu.cuMemcpyHtoD(writer->ptr(), pattern.data(), pattern.size()), CUDA_SUCCESS);

  Result<DeviceMapping> reader = DeviceMapping::Import(*device_, *fd, 3 * kMiB, DeviceAccess::kReadOnly);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_NE(reader->ptr(), writer->ptr());
  std::vector<uint8_t> read(pattern.size());
  ASSERT_EQ(cu.cuMemcpyDtoH(read.data(), reader->ptr(), read.size()), CUDA_SUCCESS);
  EXPECT_EQ(read, pattern);
  close(*fd);
}

TEST_F(CudaMemoryTest, AReadOnlyMappingCannotBeWritten) {
  Result<DeviceAllocation> allocation = DeviceAllocation::Create(*device_, kMiB);
  ASSERT_TRUE(allocation.ok()) << allocation.status().ToString();
  Result<int> fd = allocation->Export();
  ASSERT_TRUE(fd.ok());
  Result<DeviceMapping> reader = DeviceMapping::Import(*device_, *fd, kMiB, DeviceAccess::kReadOnly);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  close(*fd);
  if (!reader->read_only()) GTEST_SKIP() << "this driver maps replicas read-write";
  std::vector<uint8_t> data(64, 1);
  EXPECT_NE(device_->driver().cuMemcpyHtoD(reader->ptr(), data.data(), data.size()), CUDA_SUCCESS);
}

TEST_F(CudaMemoryTest, AMappingOutlivesTheCreatorsHandle) {
  // Documented driver behaviour: memory is freed when every handle is released and every mapping
  // unmapped. The owner releasing its handle must not pull weights from under a serving worker.
  std::vector<uint8_t> pattern = Pattern(kMiB, 3);
  std::optional<DeviceMapping> mapping;
  {
    Result<DeviceAllocation> allocation = DeviceAllocation::Create(*device_, kMiB);
    ASSERT_TRUE(allocation.ok());
    Result<int> fd = allocation->Export();
    ASSERT_TRUE(fd.ok());
    Result<DeviceMapping> imported = DeviceMapping::Import(*device_, *fd, kMiB, DeviceAccess::kReadWrite);
    ASSERT_TRUE(imported.ok()) << imported.status().ToString();
    close(*fd);
    mapping.emplace(std::move(*imported));
    ASSERT_EQ(device_->driver().cuMemcpyHtoD(mapping->ptr(), pattern.data(), pattern.size()), CUDA_SUCCESS);
  }
  std::vector<uint8_t> read(kMiB);
  ASSERT_EQ(device_->driver().cuMemcpyDtoH(read.data(), mapping->ptr(), read.size()), CUDA_SUCCESS);
  EXPECT_EQ(read, pattern);
}

TEST_F(CudaMemoryTest, AnAllocationLargerThanTheDeviceIsResourceExhausted) {
  Result<CudaDeviceInfo> info = device_->Info();
  ASSERT_TRUE(info.ok());
  Result<DeviceAllocation> allocation = DeviceAllocation::Create(*device_, info->total_bytes + kMiB);
  ASSERT_FALSE(allocation.ok());
  EXPECT_EQ(allocation.status().code(), Code::kResourceExhausted);
  EXPECT_NE(allocation.status().message().find("CUDA_ERROR_OUT_OF_MEMORY"), std::string::npos)
      << allocation.status().message();
}

TEST_F(CudaMemoryTest, FreeMemoryFollowsAllocations) {
  Result<CudaDeviceInfo> before = device_->Info();
  ASSERT_TRUE(before.ok());
  Result<DeviceAllocation> allocation = DeviceAllocation::Create(*device_, 8 * kMiB);
  ASSERT_TRUE(allocation.ok());
  Result<CudaDeviceInfo> during = device_->Info();
  ASSERT_TRUE(during.ok());
  EXPECT_LE(during->free_bytes + 8 * kMiB, before->free_bytes);
}

TEST_F(CudaMemoryTest, ZeroBytesAndForeignDescriptorsAreRefused) {
  EXPECT_EQ(DeviceAllocation::Create(*device_, 0).status().code(), Code::kInvalidArgument);
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  Result<DeviceMapping> bogus = DeviceMapping::Import(*device_, pipe_fds[0], kMiB, DeviceAccess::kReadOnly);
  EXPECT_FALSE(bogus.ok());
  close(pipe_fds[0]);
  close(pipe_fds[1]);
  EXPECT_EQ(LegacyMapping::Open(*device_, "short", kMiB).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace warmpool
