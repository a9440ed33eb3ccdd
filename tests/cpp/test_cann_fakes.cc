// The fakes themselves: the v1.5.1 layouts CANN documents, and the behaviour the ascend device's tests rely on
// (best-fit reuse of freed addresses, ordered asynchronous streams, failures surfacing at synchronize, NPU memory the
// host cannot touch).
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "acl/acl.h"
#include "cann_layout.h"
#include "fake_cann.h"
#include "fake_heap.h"
#include "aclnn/acl_meta.h"
#include "aclnnop/aclnn_add.h"
#include "aclnnop/aclnn_cast.h"
#include "aclnnop/aclnn_maximum.h"
#include "aclnnop/aclnn_minimum.h"
#include "shmem.h"
#include "test_support.h"
#include "thread_bootstrap.h"

namespace hp::fakes {
namespace {

// The layouts, values and codes of v1.5.1 (cann_layout.h, the same assertions the real-header check makes).

class CannFakesTest : public ::testing::Test {
 protected:
  void SetUp() override { FakeCann::Reset(); }
  void TearDown() override { FakeCann::Reset(); }
};

// One PE on npu:0 over a heap of `heap_bytes` (the calling thread is its process).
void InitSinglePe(std::int64_t heap_bytes = 2 << 20) {
  ASSERT_EQ(aclrtSetDevice(0), ACL_SUCCESS);
  aclshmemx_uniqueid_t uid{};
  ASSERT_EQ(aclshmemx_get_uniqueid(&uid), ACLSHMEM_SUCCESS);
  aclshmemx_init_attr_t attr{};
  ASSERT_EQ(aclshmemx_set_attr_uniqueid_args(0, 1, heap_bytes, &uid, &attr), ACLSHMEM_SUCCESS);
  ASSERT_EQ(aclshmemx_init_attr(ACLSHMEMX_INIT_WITH_UNIQUEID, &attr), ACLSHMEM_SUCCESS);
}

// PE `rank` of `n_pes` on npu:`rank`, with rank 0's unique id carried into `uid` over `bootstrap`: the init
// attributes (a 2 MiB heap) for the test to adjust before aclshmemx_init_attr. `attr` points at `uid`, as the
// real library's do: keep it alive until then.
void PrepareUniqueIdPe(int rank, int n_pes, shmem::Bootstrap& bootstrap, aclshmemx_uniqueid_t* uid,
                       aclshmemx_init_attr_t* attr) {
  ASSERT_EQ(aclrtSetDevice(rank), ACL_SUCCESS);
  if (rank == 0) {
    ASSERT_EQ(aclshmemx_get_uniqueid(uid), ACLSHMEM_SUCCESS);
  }
  *uid = shmem::testutil::GatherValue(bootstrap, *uid)[0];
  ASSERT_EQ(aclshmemx_set_attr_uniqueid_args(rank, n_pes, 2 << 20, uid, attr), ACLSHMEM_SUCCESS);
}

// Copies between the host and NPU memory, which the host cannot dereference.
void Upload(void* npu, const void* host, std::size_t bytes) {
  ASSERT_EQ(aclrtMemcpy(npu, bytes, host, bytes, ACL_MEMCPY_HOST_TO_DEVICE), ACL_SUCCESS);
}

std::string Download(const void* npu, std::size_t bytes) {
  std::string host(bytes, '?');
  EXPECT_EQ(aclrtMemcpy(host.data(), bytes, npu, bytes, ACL_MEMCPY_DEVICE_TO_HOST), ACL_SUCCESS);
  return host;
}

// A host load, as a forgotten copy would do it.
char HostLoad(const void* address) { return *static_cast<const volatile char*>(address); }

TEST_F(CannFakesTest, DefaultInitAttributesAreTheReleaseDefaults) {
  aclshmemx_init_attr_t attr{};
  EXPECT_EQ(attr.option_attr.version, (1 << 16) + 24);
  EXPECT_EQ(attr.option_attr.data_op_engine_type, ACLSHMEM_DATA_OP_MTE);
  EXPECT_EQ(attr.option_attr.shm_init_timeout, 120u);
  EXPECT_EQ(attr.option_attr.control_operation_timeout, 120u);
  EXPECT_EQ(attr.comm_args, nullptr);
  EXPECT_EQ(attr.instance_id, 0u);
  EXPECT_EQ(attr.ip_port[0], '\0');
}

TEST_F(CannFakesTest, HeapIsBestFitAndHandsAFreedAddressOutAgain) {
  FakeHeap heap(4096);
  auto a = heap.Allocate(100, 16);
  auto b = heap.Allocate(1000, 16);
  auto c = heap.Allocate(100, 16);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(*b, 112u);   // 100 rounds up to 112
  ASSERT_TRUE(heap.Free(*b));
  auto again = heap.Allocate(1000, 16);
  ASSERT_TRUE(again);
  EXPECT_EQ(*again, *b);
  ASSERT_TRUE(heap.Free(*a));
  auto small = heap.Allocate(64, 16);   // best fit: the 112-byte hole, not the tail
  ASSERT_TRUE(small);
  EXPECT_EQ(*small, *a);
  auto aligned = heap.Allocate(64, 1024);
  ASSERT_TRUE(aligned);
  EXPECT_EQ(*aligned % 1024, 0u);
  EXPECT_FALSE(heap.Free(3));
  EXPECT_FALSE(heap.Allocate(8192, 16));
  EXPECT_FALSE(heap.Allocate(0, 16));
}

TEST_F(CannFakesTest, StreamsRunInOrderAndReportInjectedFailuresAtSynchronize) {
  InitSinglePe();
  aclshmemx_init_attr_t attr{};
  EXPECT_EQ(aclshmemx_init_attr(ACLSHMEMX_INIT_WITH_UNIQUEID, &attr), ACLSHMEM_INNER_ERROR);
  EXPECT_EQ(aclshmemx_init_status(), ACLSHMEM_STATUS_IS_INITIALIZED);

  auto* buffer = static_cast<char*>(aclshmem_malloc(64));
  ASSERT_NE(buffer, nullptr);
  void* staging = nullptr;   // the puts' local buffers are NPU memory, as CANN needs
  ASSERT_EQ(aclrtMalloc(&staging, 16, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  char* first = static_cast<char*>(staging);
  char* second = first + 8;
  Upload(first, "first\0\0", 8);
  Upload(second, "second\0", 8);
  aclrtStream stream = nullptr;
  ASSERT_EQ(aclrtCreateStream(&stream), ACL_SUCCESS);
  aclshmemx_putmem_on_stream(buffer, first, 8, 0, stream);
  aclshmemx_putmem_on_stream(buffer, second, 8, 0, stream);
  ASSERT_EQ(aclrtSynchronizeStream(stream), ACL_SUCCESS);
  EXPECT_STREQ(Download(buffer, 8).c_str(), "second");

  FakeCann::FailNext("aclshmemx_putmem_on_stream", ACL_ERROR_RT_AICORE_EXCEPTION);
  aclshmemx_putmem_on_stream(buffer, first, 8, 0, stream);
  EXPECT_EQ(aclrtSynchronizeStream(stream), ACL_ERROR_RT_AICORE_EXCEPTION);
  EXPECT_EQ(aclrtSynchronizeStream(stream), ACL_SUCCESS);   // reported once
  EXPECT_STREQ(Download(buffer, 8).c_str(), "second");

  // A wait nobody satisfies: the bounded synchronize times out and the kernel keeps spinning; a signal ends it.
  auto* signal = static_cast<int32_t*>(aclshmem_malloc(4));
  const int32_t zero = 0;
  Upload(signal, &zero, sizeof(zero));
  aclshmemx_signal_wait_until_on_stream(signal, ACLSHMEM_CMP_GE, 1, stream);
  EXPECT_EQ(aclrtSynchronizeStreamWithTimeout(stream, 50), ACL_ERROR_RT_STREAM_SYNC_TIMEOUT);
  aclshmemx_signal_op_on_stream(signal, 1, ACLSHMEM_SIGNAL_ADD, 0, nullptr);   // NULL: CANN's default stream
  EXPECT_EQ(aclrtSynchronizeStreamWithTimeout(stream, 5000), ACL_SUCCESS);
  int32_t observed = 0;
  ASSERT_EQ(aclrtMemcpy(&observed, sizeof(observed), signal, sizeof(observed), ACL_MEMCPY_DEVICE_TO_HOST), ACL_SUCCESS);
  EXPECT_EQ(observed, 1);
  EXPECT_EQ(aclrtDestroyStream(stream), ACL_SUCCESS);
  EXPECT_EQ(aclrtFree(staging), ACL_SUCCESS);
  aclshmem_free(signal);
  aclshmem_free(buffer);
  EXPECT_EQ(aclshmem_finalize(), ACLSHMEM_SUCCESS);
  EXPECT_EQ(aclshmemx_init_status(), ACLSHMEM_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(FakeCann::LiveStreams(), 0u);
  EXPECT_EQ(FakeCann::LiveSessions(), 0u);
}

TEST_F(CannFakesTest, PesOfOneUniqueIdShareASessionAndTranslateAddresses) {
  shmem::testutil::RunRanks(2, [](int rank, shmem::Bootstrap& bootstrap) {
    aclshmemx_uniqueid_t uid{};
    aclshmemx_init_attr_t attr{};
    ASSERT_NO_FATAL_FAILURE(PrepareUniqueIdPe(rank, 2, bootstrap, &uid, &attr));
    ASSERT_EQ(aclshmemx_init_attr(ACLSHMEMX_INIT_WITH_UNIQUEID, &attr), ACLSHMEM_SUCCESS);
    EXPECT_EQ(aclshmem_my_pe(), rank);
    EXPECT_EQ(aclshmem_n_pes(), 2);
    void* mine = aclshmem_align(4096, 256);
    ASSERT_NE(mine, nullptr);
    const auto all = shmem::testutil::GatherValue(bootstrap, mine);
    EXPECT_EQ(aclshmem_ptr(mine, 1 - rank), all[static_cast<std::size_t>(1 - rank)]);
    EXPECT_EQ(aclshmem_ptr(mine, 2), nullptr);
    int outside = 0;
    EXPECT_EQ(aclshmem_ptr(&outside, 0), nullptr);
    ASSERT_TRUE(bootstrap.Barrier().ok());
    EXPECT_EQ(aclshmem_finalize(), ACLSHMEM_SUCCESS);
  });
}

TEST_F(CannFakesTest, NpuMemoryIsOutOfTheHostsReach) {
  InitSinglePe();
  void* malloced = aclshmem_malloc(64);
  void* aligned = aclshmem_align(4096, 256);
  void* base = aclshmemx_get_heap_base(DEVICE_SIDE);
  void* own = aclshmem_ptr(aligned, 0);
  void* buffer = nullptr;
  ASSERT_EQ(aclrtMalloc(&buffer, 100, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  for (void* npu : {malloced, aligned, base, own, buffer}) {
    ASSERT_NE(npu, nullptr);
    EXPECT_TRUE(FakeCann::IsDeviceMemory(npu));
  }
  EXPECT_TRUE(FakeCann::IsDeviceMemory(base, (2 << 20) + ACLSHMEM_EXTRA_SIZE));    // the whole heap
  EXPECT_FALSE(FakeCann::IsDeviceMemory(base, (2 << 20) + ACLSHMEM_EXTRA_SIZE + 1));
  EXPECT_TRUE(FakeCann::IsDeviceMemory(buffer, 100));
  const std::vector<char> host(16);
  EXPECT_FALSE(FakeCann::IsDeviceMemory(host.data()));
  EXPECT_EQ(FakeCann::LiveDeviceAllocations(), 1u);

  // A host dereference of NPU memory crashes, as it would with a real NPU; the bytes are reachable by copies only.
  GTEST_FLAG_SET(death_test_style, "threadsafe");   // the fakes run stream threads
  EXPECT_DEATH(HostLoad(malloced), "");
  EXPECT_DEATH(HostLoad(buffer), "");
  EXPECT_EQ(Download(malloced, 4), std::string(4, '\0'));   // heaps start zeroed, as CANN's do

  EXPECT_EQ(aclrtFree(buffer), ACL_SUCCESS);
  EXPECT_FALSE(FakeCann::IsDeviceMemory(buffer));
  EXPECT_EQ(aclrtFree(buffer), ACL_ERROR_RT_PARAM_INVALID);
  EXPECT_EQ(FakeCann::LiveDeviceAllocations(), 0u);
  EXPECT_EQ(aclshmem_finalize(), ACLSHMEM_SUCCESS);
}

TEST_F(CannFakesTest, AclrtMemcpyChecksEachSideAgainstItsKind) {
  std::string host = "0123456789abcdef";
  void* npu = nullptr;
  EXPECT_EQ(aclrtMalloc(&npu, 16, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_RT_CONTEXT_NULL);   // no device selected
  EXPECT_EQ(aclrtMemcpy(host.data(), 16, "x", 1, ACL_MEMCPY_HOST_TO_HOST), ACL_ERROR_RT_CONTEXT_NULL);
  ASSERT_EQ(aclrtSetDevice(0), ACL_SUCCESS);
  FakeCann::ClearCalls();
  ASSERT_EQ(aclrtMalloc(&npu, 16, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  void* other = nullptr;
  ASSERT_EQ(aclrtMalloc(&other, 16, ACL_MEM_MALLOC_NORMAL_ONLY), ACL_SUCCESS);

  // Every kind, each side what the kind says.
  ASSERT_EQ(aclrtMemcpy(npu, 16, host.data(), 16, ACL_MEMCPY_HOST_TO_DEVICE), ACL_SUCCESS);
  ASSERT_EQ(aclrtMemcpy(other, 16, npu, 16, ACL_MEMCPY_DEVICE_TO_DEVICE), ACL_SUCCESS);
  std::string back(16, '?');
  ASSERT_EQ(aclrtMemcpy(back.data(), 16, other, 16, ACL_MEMCPY_DEVICE_TO_HOST), ACL_SUCCESS);
  EXPECT_EQ(back, host);
  ASSERT_EQ(aclrtMemcpy(back.data(), 16, "FEDCBA9876543210", 16, ACL_MEMCPY_HOST_TO_HOST), ACL_SUCCESS);
  EXPECT_EQ(back, "FEDCBA9876543210");
  EXPECT_EQ(aclrtMemcpy(npu, 16, host.data(), 0, ACL_MEMCPY_HOST_TO_DEVICE), ACL_SUCCESS);
  const FakeCall recorded = FakeCann::CallsNamed("aclrtMemcpy").front();
  EXPECT_EQ(recorded.address, reinterpret_cast<std::uintptr_t>(npu));
  EXPECT_EQ(recorded.bytes, 16u);
  EXPECT_EQ(recorded.op, ACL_MEMCPY_HOST_TO_DEVICE);

  // A side that is not what the kind says, a short destination, a range off the end, an unknown kind.
  const int kInvalid = ACL_ERROR_RT_PARAM_INVALID;
  EXPECT_EQ(aclrtMemcpy(back.data(), 16, host.data(), 16, ACL_MEMCPY_HOST_TO_DEVICE), kInvalid);
  EXPECT_EQ(aclrtMemcpy(back.data(), 16, host.data(), 16, ACL_MEMCPY_DEVICE_TO_HOST), kInvalid);
  EXPECT_EQ(aclrtMemcpy(npu, 16, other, 16, ACL_MEMCPY_HOST_TO_DEVICE), kInvalid);
  EXPECT_EQ(aclrtMemcpy(npu, 16, host.data(), 16, ACL_MEMCPY_DEVICE_TO_DEVICE), kInvalid);
  EXPECT_EQ(aclrtMemcpy(back.data(), 16, npu, 16, ACL_MEMCPY_HOST_TO_HOST), kInvalid);
  EXPECT_EQ(aclrtMemcpy(npu, 8, host.data(), 16, ACL_MEMCPY_HOST_TO_DEVICE), kInvalid);
  EXPECT_EQ(aclrtMemcpy(static_cast<char*>(npu) + 8, 16, host.data(), 16, ACL_MEMCPY_HOST_TO_DEVICE), kInvalid);
  EXPECT_EQ(aclrtMemcpy(npu, 16, host.data(), 16, static_cast<aclrtMemcpyKind>(7)), kInvalid);
  EXPECT_EQ(aclrtMemcpy(nullptr, 16, host.data(), 16, ACL_MEMCPY_HOST_TO_DEVICE), kInvalid);
  // Memory of another NPU is not the current device's.
  ASSERT_EQ(aclrtSetDevice(1), ACL_SUCCESS);
  EXPECT_EQ(aclrtMemcpy(npu, 16, host.data(), 16, ACL_MEMCPY_HOST_TO_DEVICE), kInvalid);
  ASSERT_EQ(aclrtSetDevice(0), ACL_SUCCESS);
  FakeCann::FailNext("aclrtMemcpy", ACL_ERROR_RT_INTERNAL_ERROR);
  EXPECT_EQ(aclrtMemcpy(npu, 16, host.data(), 16, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_RT_INTERNAL_ERROR);
  EXPECT_EQ(Download(npu, 16), host);   // none of the refused copies wrote anything
  EXPECT_EQ(aclrtFree(npu), ACL_SUCCESS);
  EXPECT_EQ(aclrtFree(other), ACL_SUCCESS);
}

TEST_F(CannFakesTest, AclrtMemcpyAsyncRunsInStreamOrderAndRefusesWhatTheReleaseRefuses) {
  InitSinglePe();
  void* npu = nullptr;
  ASSERT_EQ(aclrtMalloc(&npu, 32, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  char* source = static_cast<char*>(npu);
  char* target = source + 16;
  Upload(source, "0123456789abcdef", 16);
  Upload(target, "................", 16);
  aclrtStream stream = nullptr;
  ASSERT_EQ(aclrtCreateStream(&stream), ACL_SUCCESS);
  FakeCann::ClearCalls();

  // Device to device is only enqueued: behind a wait nobody satisfied yet, it has not run.
  auto* signal = static_cast<int32_t*>(aclshmem_malloc(4));
  const int32_t zero = 0;
  Upload(signal, &zero, sizeof(zero));
  aclshmemx_signal_wait_until_on_stream(signal, ACLSHMEM_CMP_GE, 1, stream);
  ASSERT_EQ(aclrtMemcpyAsync(target, 16, source, 16, ACL_MEMCPY_DEVICE_TO_DEVICE, stream), ACL_SUCCESS);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(Download(target, 16), "................");
  const int32_t one = 1;
  Upload(signal, &one, sizeof(one));
  ASSERT_EQ(aclrtSynchronizeStreamWithTimeout(stream, 5000), ACL_SUCCESS);
  EXPECT_EQ(Download(target, 16), "0123456789abcdef");
  const FakeCall recorded = FakeCann::CallsNamed("aclrtMemcpyAsync").front();
  EXPECT_EQ(recorded.address, reinterpret_cast<std::uintptr_t>(target));
  EXPECT_EQ(recorded.bytes, 16u);
  EXPECT_EQ(recorded.op, ACL_MEMCPY_DEVICE_TO_DEVICE);
  EXPECT_EQ(recorded.stream, reinterpret_cast<std::uintptr_t>(stream));

  // A side in pageable host memory: the call returns once the stream ran it.
  std::string host = "ABCDEFGHIJKLMNOP";
  ASSERT_EQ(aclrtMemcpyAsync(target, 16, host.data(), 16, ACL_MEMCPY_HOST_TO_DEVICE, stream), ACL_SUCCESS);
  std::string back(16, '?');
  ASSERT_EQ(aclrtMemcpyAsync(back.data(), 16, target, 16, ACL_MEMCPY_DEVICE_TO_HOST, stream), ACL_SUCCESS);
  EXPECT_EQ(back, host);

  // Refused when submitted: host to host (no asynchronous host copy), a side that is not what the kind says, a short
  // destination, a range off the end, an unknown kind or stream; zero bytes succeed.
  const int kInvalid = ACL_ERROR_RT_PARAM_INVALID;
  EXPECT_EQ(aclrtMemcpyAsync(back.data(), 16, host.data(), 16, ACL_MEMCPY_HOST_TO_HOST, stream),
            ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
  EXPECT_EQ(aclrtMemcpyAsync(target, 16, host.data(), 16, ACL_MEMCPY_DEVICE_TO_DEVICE, stream), kInvalid);
  EXPECT_EQ(aclrtMemcpyAsync(back.data(), 16, source, 16, ACL_MEMCPY_DEVICE_TO_DEVICE, stream), kInvalid);
  EXPECT_EQ(aclrtMemcpyAsync(target, 8, source, 16, ACL_MEMCPY_DEVICE_TO_DEVICE, stream), kInvalid);
  EXPECT_EQ(aclrtMemcpyAsync(target + 8, 16, source, 16, ACL_MEMCPY_DEVICE_TO_DEVICE, stream), kInvalid);
  EXPECT_EQ(aclrtMemcpyAsync(target, 16, source, 16, static_cast<aclrtMemcpyKind>(7), stream), kInvalid);
  EXPECT_EQ(aclrtMemcpyAsync(nullptr, 16, source, 16, ACL_MEMCPY_DEVICE_TO_DEVICE, stream), kInvalid);
  int bogus = 0;
  EXPECT_EQ(aclrtMemcpyAsync(target, 16, source, 16, ACL_MEMCPY_DEVICE_TO_DEVICE, &bogus), kInvalid);
  EXPECT_EQ(aclrtMemcpyAsync(target, 16, host.data(), 0, ACL_MEMCPY_DEVICE_TO_DEVICE, stream), ACL_SUCCESS);
  FakeCann::FailNext("aclrtMemcpyAsync", ACL_ERROR_RT_INTERNAL_ERROR);
  EXPECT_EQ(aclrtMemcpyAsync(target, 16, source, 16, ACL_MEMCPY_DEVICE_TO_DEVICE, stream), ACL_ERROR_RT_INTERNAL_ERROR);
  ASSERT_EQ(aclrtSynchronizeStream(stream), ACL_SUCCESS);
  EXPECT_EQ(Download(target, 16), host);   // none of the refused copies wrote anything

  // Memory freed before the stream reaches the copy: the stream reports it at the next synchronize.
  void* doomed = nullptr;
  ASSERT_EQ(aclrtMalloc(&doomed, 16, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  Upload(signal, &zero, sizeof(zero));
  aclshmemx_signal_wait_until_on_stream(signal, ACLSHMEM_CMP_GE, 1, stream);
  ASSERT_EQ(aclrtMemcpyAsync(target, 16, doomed, 16, ACL_MEMCPY_DEVICE_TO_DEVICE, stream), ACL_SUCCESS);
  EXPECT_EQ(aclrtFree(doomed), ACL_SUCCESS);
  Upload(signal, &one, sizeof(one));
  EXPECT_EQ(aclrtSynchronizeStreamWithTimeout(stream, 5000), kInvalid);
  EXPECT_EQ(Download(target, 16), host);

  EXPECT_EQ(aclrtDestroyStream(stream), ACL_SUCCESS);
  ASSERT_EQ(aclrtSetDevice(1), ACL_SUCCESS);   // memory of another NPU is not the current device's
  aclrtStream other = nullptr;
  ASSERT_EQ(aclrtCreateStream(&other), ACL_SUCCESS);
  EXPECT_EQ(aclrtMemcpyAsync(target, 16, source, 16, ACL_MEMCPY_DEVICE_TO_DEVICE, other), kInvalid);
  EXPECT_EQ(aclrtDestroyStream(other), ACL_SUCCESS);
  ASSERT_EQ(aclrtSetDevice(0), ACL_SUCCESS);
  EXPECT_EQ(aclrtFree(npu), ACL_SUCCESS);
  aclshmem_free(signal);
  EXPECT_EQ(aclshmem_finalize(), ACLSHMEM_SUCCESS);
}

TEST_F(CannFakesTest, PutAndGetNeedNpuMemoryOnTheLocalSide) {
  InitSinglePe();
  auto* heap = static_cast<char*>(aclshmem_malloc(64));
  ASSERT_NE(heap, nullptr);
  void* npu = nullptr;
  ASSERT_EQ(aclrtMalloc(&npu, 8, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  Upload(npu, "fromnpu", 8);
  aclrtStream stream = nullptr;
  ASSERT_EQ(aclrtCreateStream(&stream), ACL_SUCCESS);

  // Host memory as the local buffer faults in the copy kernel: the stream reports it, nothing is copied.
  char host[8] = "fromhst";
  aclshmemx_putmem_on_stream(heap, host, 8, 0, stream);
  EXPECT_EQ(aclrtSynchronizeStream(stream), ACL_ERROR_RT_AICORE_EXCEPTION);
  aclshmemx_getmem_on_stream(host, heap, 8, 0, stream);
  EXPECT_EQ(aclrtSynchronizeStream(stream), ACL_ERROR_RT_AICORE_EXCEPTION);
  EXPECT_EQ(Download(heap, 8), std::string(8, '\0'));

  // NPU memory on both sides: an aclrtMalloc buffer, or the heap itself.
  aclshmemx_putmem_on_stream(heap, npu, 8, 0, stream);
  aclshmemx_putmem_on_stream(heap + 8, heap, 8, 0, stream);
  ASSERT_EQ(aclrtSynchronizeStream(stream), ACL_SUCCESS);
  EXPECT_EQ(Download(heap, 16), std::string("fromnpu\0fromnpu\0", 16));
  aclshmemx_getmem_on_stream(npu, heap + 8, 8, 0, stream);
  ASSERT_EQ(aclrtSynchronizeStream(stream), ACL_SUCCESS);

  // Another NPU's memory is not local to the copy kernel of npu:0.
  ASSERT_EQ(aclrtSetDevice(1), ACL_SUCCESS);
  void* foreign = nullptr;
  ASSERT_EQ(aclrtMalloc(&foreign, 8, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  ASSERT_EQ(aclrtSetDevice(0), ACL_SUCCESS);
  aclshmemx_putmem_on_stream(heap, foreign, 8, 0, stream);
  EXPECT_EQ(aclrtSynchronizeStream(stream), ACL_ERROR_RT_AICORE_EXCEPTION);

  EXPECT_EQ(aclrtDestroyStream(stream), ACL_SUCCESS);
  EXPECT_EQ(aclrtFree(npu), ACL_SUCCESS);
  EXPECT_EQ(aclrtFree(foreign), ACL_SUCCESS);
  aclshmem_free(heap);
  EXPECT_EQ(aclshmem_finalize(), ACLSHMEM_SUCCESS);
}

TEST_F(CannFakesTest, InitTakesAbout5MiBOfTheHeapAndAllocationEndsInAControlBarrier) {
  InitSinglePe(2 << 20);
  void* base = aclshmemx_get_heap_base(DEVICE_SIDE);
  void* first = aclshmem_malloc(16);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(static_cast<char*>(first) - static_cast<char*>(base), 512 + SYNC_POOL_SIZE + SYNC_COUNTERS_SIZE);
  void* zeroed = aclshmem_calloc(4, 8);
  ASSERT_NE(zeroed, nullptr);
  EXPECT_EQ(Download(zeroed, 8), std::string(8, '\0'));
  // The barrier that ends every allocation: a failed one releases the block and answers NULL.
  FakeCann::FailNext(kControlBarrier, ACLSHMEM_SMEM_ERROR);
  EXPECT_EQ(aclshmem_malloc(64), nullptr);
  void* again = aclshmem_malloc(64);
  EXPECT_EQ(again, static_cast<char*>(zeroed) + 32);   // the released block comes back
  EXPECT_EQ(aclshmem_finalize(), ACLSHMEM_SUCCESS);
}

TEST_F(CannFakesTest, AMallocOnOnePeWaitsForEveryPeUpToCannsOwnTimeout) {
  FakeCann::SetCannDefaultTimeout(std::chrono::milliseconds(200));
  shmem::testutil::RunRanks(2, [](int rank, shmem::Bootstrap& bootstrap) {
    aclshmemx_uniqueid_t uid{};
    aclshmemx_init_attr_t attr{};
    ASSERT_NO_FATAL_FAILURE(PrepareUniqueIdPe(rank, 2, bootstrap, &uid, &attr));
    attr.option_attr.shm_init_timeout = 3600;   // ignored in unique-id mode
    ASSERT_EQ(aclshmemx_init_attr(ACLSHMEMX_INIT_WITH_UNIQUEID, &attr), ACLSHMEM_SUCCESS);
    EXPECT_EQ(FakeCann::LastInit()->init_timeout_s, 120u);
    if (rank == 0) {
      EXPECT_EQ(aclshmem_malloc(64), nullptr);   // rank 1 is not there: CANN's barrier times out
      EXPECT_EQ(aclshmem_malloc(64), nullptr);   // ... as long as rank 1 stays away
    }
    ASSERT_TRUE(bootstrap.Barrier().ok());
    if (rank == 1) {
      // Rank 1 arrives for the first time: the arrivals rank 0 left behind complete its barrier at once, which is
      // why nothing may run after a timed-out CANN barrier (the runtime agrees first so that none times out).
      EXPECT_NE(aclshmem_malloc(64), nullptr);
    }
    ASSERT_TRUE(bootstrap.Barrier().ok());
    EXPECT_EQ(aclshmem_finalize(), ACLSHMEM_SUCCESS);
  });
}

// aclshmemx_init_attr on one PE with `stage`'s control barrier failing (kControlBarrier + ":" + stage).
int InitFailingAt(const std::string& stage, int code) {
  EXPECT_EQ(aclrtSetDevice(0), ACL_SUCCESS);
  aclshmemx_uniqueid_t uid{};
  EXPECT_EQ(aclshmemx_get_uniqueid(&uid), ACLSHMEM_SUCCESS);
  aclshmemx_init_attr_t attr{};
  EXPECT_EQ(aclshmemx_set_attr_uniqueid_args(0, 1, 2 << 20, &uid, &attr), ACLSHMEM_SUCCESS);
  FakeCann::FailNext(std::string(kControlBarrier) + ":" + stage, code);
  return aclshmemx_init_attr(ACLSHMEMX_INIT_WITH_UNIQUEID, &attr);
}

TEST_F(CannFakesTest, AFailedInitLeavesTheReleasesStateAndItsStreamUntilFinalize) {
  struct Case {
    const char* stage;
    int returned;   // what init answers
    int status;     // what aclshmemx_init_status says after it
  };
  // init_device_state turns any barrier failure into ACLSHMEM_SMEM_ERROR before the heap exists; CANN's allocations
  // after it answer ACLSHMEM_INNER_ERROR; the last barrier's code comes back as it is, after "initialized" was set.
  for (const Case& c : {Case{"init_device_state", ACLSHMEM_SMEM_ERROR, ACLSHMEM_STATUS_NOT_INITIALIZED},
                        Case{"exchange_slice", ACLSHMEM_SMEM_ERROR, ACLSHMEM_STATUS_NOT_INITIALIZED},
                        Case{"aclshmemi_signal_init", ACLSHMEM_INNER_ERROR, ACLSHMEM_STATUS_SHM_CREATED},
                        Case{"aclshmemi_team_init", ACLSHMEM_INNER_ERROR, ACLSHMEM_STATUS_SHM_CREATED},
                        Case{"aclshmemx_init_attr", ACLSHMEM_SMEM_ERROR, ACLSHMEM_STATUS_IS_INITIALIZED}}) {
    SCOPED_TRACE(c.stage);
    FakeCann::Reset();
    EXPECT_EQ(InitFailingAt(c.stage, ACLSHMEM_SMEM_ERROR), c.returned);   // what a failed barrier returns
    EXPECT_EQ(aclshmemx_init_status(), c.status);
    EXPECT_EQ(FakeCann::LiveStreams(), 1u);    // CANN's own stream, created before any barrier
    EXPECT_EQ(FakeCann::LiveSessions(), 1u);   // and the bootstrap
    if (c.status != ACLSHMEM_STATUS_NOT_INITIALIZED) {
      aclshmemx_init_attr_t again{};
      EXPECT_EQ(aclshmemx_init_attr(ACLSHMEMX_INIT_WITH_UNIQUEID, &again), ACLSHMEM_INNER_ERROR);   // "repeatedly"
      EXPECT_NE(aclshmemx_get_heap_base(DEVICE_SIDE), nullptr);
    }
    EXPECT_EQ(aclshmem_finalize(), ACLSHMEM_SUCCESS);   // releases whatever was built
    EXPECT_EQ(aclshmemx_init_status(), ACLSHMEM_STATUS_NOT_INITIALIZED);
    EXPECT_EQ(FakeCann::LiveStreams(), 0u);
    EXPECT_EQ(FakeCann::LiveSessions(), 0u);
  }
}

TEST_F(CannFakesTest, AMissingPeerFailsInitsFirstBarrierWithSmemErrorBeforeTheHeap) {
  FakeCann::SetCannDefaultTimeout(std::chrono::milliseconds(200));
  shmem::testutil::RunRanks(2, [](int rank, shmem::Bootstrap& bootstrap) {
    aclshmemx_uniqueid_t uid{};
    aclshmemx_init_attr_t attr{};
    ASSERT_NO_FATAL_FAILURE(PrepareUniqueIdPe(rank, 2, bootstrap, &uid, &attr));
    if (rank == 0) {
      // Rank 1 never comes: the config store's group barrier times out, reported as ACLSHMEM_SMEM_ERROR
      // (shmemi_bootstrap_config_store.cpp:206-209), not ACLSHMEM_TIMEOUT_ERROR.
      EXPECT_EQ(aclshmemx_init_attr(ACLSHMEMX_INIT_WITH_UNIQUEID, &attr), ACLSHMEM_SMEM_ERROR);
      EXPECT_EQ(aclshmemx_init_status(), ACLSHMEM_STATUS_NOT_INITIALIZED);
      EXPECT_EQ(aclshmemx_get_heap_base(DEVICE_SIDE), nullptr);
      EXPECT_EQ(FakeCann::LiveStreams(), 1u);   // CANN's stream stays until finalize
      EXPECT_EQ(aclshmem_finalize(), ACLSHMEM_SUCCESS);
      EXPECT_EQ(FakeCann::LiveStreams(), 0u);
    }
    ASSERT_TRUE(bootstrap.Barrier().ok());
  });
}

TEST_F(CannFakesTest, InitWithNullAttributesCrashesAsTheReleaseDoes) {
  ASSERT_EQ(aclrtSetDevice(0), ACL_SUCCESS);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH((void)aclshmemx_init_attr(ACLSHMEMX_INIT_WITH_UNIQUEID, nullptr), "NULL attributes dereferenced");
}

TEST_F(CannFakesTest, CallocZeroesOnlyItsSizeArgumentAndAZeroProductSkipsTheBarrier) {
  InitSinglePe();
  auto* dirty = static_cast<char*>(aclshmem_malloc(64));
  ASSERT_NE(dirty, nullptr);
  Upload(dirty, std::string(64, 'x').data(), 64);
  aclshmem_free(dirty);
  // aclrtMemset(ptr, size, 0, size) (shmem_mm.cpp:75): 16 of the 64 bytes.
  auto* reused = static_cast<char*>(aclshmem_calloc(4, 16));
  ASSERT_EQ(reused, dirty);
  EXPECT_EQ(Download(reused, 64), std::string(16, '\0') + std::string(48, 'x'));
  EXPECT_EQ(aclshmem_finalize(), ACLSHMEM_SUCCESS);

  FakeCann::Reset();
  FakeCann::SetCannDefaultTimeout(std::chrono::milliseconds(200));
  shmem::testutil::RunRanks(2, [](int rank, shmem::Bootstrap& bootstrap) {
    aclshmemx_uniqueid_t uid{};
    aclshmemx_init_attr_t attr{};
    ASSERT_NO_FATAL_FAILURE(PrepareUniqueIdPe(rank, 2, bootstrap, &uid, &attr));
    ASSERT_EQ(aclshmemx_init_attr(ACLSHMEMX_INIT_WITH_UNIQUEID, &attr), ACLSHMEM_SUCCESS);
    // A zero product returns before the barrier (SHM_ASSERT_MULTIPLY_OVERFLOW): the peer that calls malloc waits in
    // a barrier nobody else enters, and fails.
    if (rank == 0) {
      EXPECT_EQ(aclshmem_calloc(0, 16), nullptr);
    } else {
      EXPECT_EQ(aclshmem_malloc(16), nullptr);
    }
    ASSERT_TRUE(bootstrap.Barrier().ok());
    EXPECT_EQ(aclshmem_finalize(), ACLSHMEM_SUCCESS);
  });
}

TEST_F(CannFakesTest, TlsIsOffWhateverWasAskedAndTheKeyCallExists) {
  const std::string info = "tls.enable:true;";
  EXPECT_EQ(aclshmemx_set_conf_store_tls(true, info.c_str(), static_cast<uint32_t>(info.size())), ACLSHMEM_SUCCESS);
  EXPECT_EQ(aclshmemx_set_config_store_tls_key("pk", 2, "pw", 2, nullptr), ACLSHMEM_SUCCESS);
  InitSinglePe();
  const auto record = FakeCann::LastInit();
  ASSERT_TRUE(record.has_value());
  EXPECT_TRUE(record->tls_enable);
  EXPECT_EQ(record->tls_info, info);
  EXPECT_FALSE(record->tls_effective);   // init_config_store() turned it off
  EXPECT_EQ(aclshmem_finalize(), ACLSHMEM_SUCCESS);
}

// A PE of `n_pes` on npu:`rank` (host `host`, the engines given), initialised, with an NPU staging buffer of 64
// bytes holding `fill`.
struct ReachPe {
  void* target = nullptr;    // 64 heap bytes, the same offset on every PE
  void* staging = nullptr;   // 64 bytes of this NPU
  aclrtStream stream = nullptr;
};

ReachPe InitReachPe(int rank, int n_pes, shmem::Bootstrap& bootstrap, const std::string& host, int engines,
                    char fill) {
  ReachPe pe;
  aclshmemx_uniqueid_t uid{};
  aclshmemx_init_attr_t attr{};
  PrepareUniqueIdPe(rank, n_pes, bootstrap, &uid, &attr);
  FakeCann::SetNode(host);
  attr.option_attr.data_op_engine_type = static_cast<data_op_engine_type_t>(engines);
  EXPECT_EQ(aclshmemx_init_attr(ACLSHMEMX_INIT_WITH_UNIQUEID, &attr), ACLSHMEM_SUCCESS);
  pe.target = aclshmem_malloc(64);
  EXPECT_NE(pe.target, nullptr);
  EXPECT_EQ(aclrtMalloc(&pe.staging, 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  Upload(pe.staging, std::string(64, fill).data(), 64);
  EXPECT_EQ(aclrtCreateStream(&pe.stream), ACL_SUCCESS);
  return pe;
}

void ReleaseReachPe(ReachPe& pe, shmem::Bootstrap& bootstrap) {
  EXPECT_EQ(aclrtDestroyStream(pe.stream), ACL_SUCCESS);
  EXPECT_EQ(aclrtFree(pe.staging), ACL_SUCCESS);
  EXPECT_TRUE(bootstrap.Barrier().ok());
  EXPECT_EQ(aclshmem_finalize(), ACLSHMEM_SUCCESS);
}

TEST_F(CannFakesTest, SixteenNpusOfA910BHostAreTwoHccsGroupsThatDoNotMapEachOther) {
  // Logical ids 0-7 and 8-15 (hybm_mem_segment.cpp:168-173): a put across is a silent no-op, aclshmem_ptr answers
  // an address all the same, and a kernel touching it faults.
  shmem::testutil::RunRanks(16, [](int rank, shmem::Bootstrap& bootstrap) {
    ReachPe pe = InitReachPe(rank, 16, bootstrap, "node0", ACLSHMEM_DATA_OP_MTE, static_cast<char>('a' + rank));
    const int same_group = rank ^ 1;    // 0<->1, ..., 8<->9
    const int other_group = rank ^ 8;   // 0<->8, ...
    for (int peer = 0; peer < 16; ++peer) EXPECT_NE(aclshmem_ptr(pe.target, peer), nullptr);
    aclshmemx_putmem_on_stream(pe.target, pe.staging, 64, same_group, pe.stream);
    aclshmemx_putmem_on_stream(pe.target, pe.staging, 64, other_group, pe.stream);
    EXPECT_EQ(aclrtSynchronizeStream(pe.stream), ACL_SUCCESS);   // nothing reported
    ASSERT_TRUE(bootstrap.Barrier().ok());
    EXPECT_EQ(Download(pe.target, 64), std::string(64, static_cast<char>('a' + same_group)));

    // A get and a SET across do nothing either; an ADD faults (an MTE atomic at an unmapped address).
    aclshmemx_getmem_on_stream(pe.staging, pe.target, 64, other_group, pe.stream);
    aclshmemx_signal_op_on_stream(static_cast<int32_t*>(pe.target), 7, ACLSHMEM_SIGNAL_SET, other_group, pe.stream);
    EXPECT_EQ(aclrtSynchronizeStream(pe.stream), ACL_SUCCESS);
    EXPECT_EQ(Download(pe.staging, 64), std::string(64, static_cast<char>('a' + rank)));
    aclshmemx_signal_op_on_stream(static_cast<int32_t*>(pe.target), 1, ACLSHMEM_SIGNAL_ADD, other_group, pe.stream);
    EXPECT_EQ(aclrtSynchronizeStream(pe.stream), ACL_ERROR_RT_AICORE_EXCEPTION);

    // An aclnn kernel reading the peer in place: fine in the group, a fault across it.
    void* workspace = nullptr;
    ASSERT_EQ(aclrtMalloc(&workspace, kAclnnWorkspaceBytes, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
    const int64_t dims[1] = {16};
    float one = 1;
    aclScalar* alpha = aclCreateScalar(&one, ACL_FLOAT);
    aclTensor* mine = aclCreateTensor(dims, 1, ACL_FLOAT, nullptr, 0, ACL_FORMAT_ND, dims, 1, pe.staging);
    for (const int peer : {same_group, other_group}) {
      aclTensor* theirs =
          aclCreateTensor(dims, 1, ACL_FLOAT, nullptr, 0, ACL_FORMAT_ND, dims, 1, aclshmem_ptr(pe.target, peer));
      uint64_t size = 0;
      aclOpExecutor* executor = nullptr;
      ASSERT_EQ(aclnnInplaceAddGetWorkspaceSize(mine, theirs, alpha, &size, &executor), ACL_SUCCESS);
      ASSERT_EQ(aclnnInplaceAdd(workspace, size, executor, pe.stream), ACL_SUCCESS);
      EXPECT_EQ(aclrtSynchronizeStream(pe.stream), peer == same_group ? ACL_SUCCESS : ACL_ERROR_RT_AICORE_EXCEPTION);
      EXPECT_EQ(aclDestroyTensor(theirs), ACL_SUCCESS);
    }
    EXPECT_EQ(aclDestroyTensor(mine), ACL_SUCCESS);
    EXPECT_EQ(aclDestroyScalar(alpha), ACL_SUCCESS);
    EXPECT_EQ(aclrtFree(workspace), ACL_SUCCESS);

    // CANN's barrier reads every member's word in place: over the world it faults; over a team of the group it works.
    aclshmemx_barrier_all_on_stream(pe.stream);
    EXPECT_EQ(aclrtSynchronizeStream(pe.stream), ACL_ERROR_RT_AICORE_EXCEPTION);
    aclshmem_team_t group = ACLSHMEM_TEAM_INVALID;
    ASSERT_EQ(aclshmem_team_split_strided(ACLSHMEM_TEAM_WORLD, rank / 8 * 8, 1, 8, &group), ACLSHMEM_SUCCESS);
    ASSERT_NE(group, ACLSHMEM_TEAM_INVALID);
    aclshmemx_barrier_on_stream(group, pe.stream);
    EXPECT_EQ(aclrtSynchronizeStream(pe.stream), ACL_SUCCESS);
    aclshmem_team_destroy(group);
    ReleaseReachPe(pe, bootstrap);
  });
}

TEST_F(CannFakesTest, TheHccsGroupIsTheLogicalDeviceIdsNotTheUsersDeviceIds) {
  // ASCEND_RT_VISIBLE_DEVICES=0,8,1,9,...: user devices 0 and 1 are logical 0 and 8, two groups.
  std::string interleaved;
  for (int i = 0; i < 8; ++i) interleaved += std::to_string(i) + "," + std::to_string(i + 8) + (i < 7 ? "," : "");
  ASSERT_EQ(setenv("ASCEND_RT_VISIBLE_DEVICES", interleaved.c_str(), 1), 0);
  shmem::testutil::RunRanks(2, [](int rank, shmem::Bootstrap& bootstrap) {
    ReachPe pe = InitReachPe(rank, 2, bootstrap, "node0", ACLSHMEM_DATA_OP_MTE, static_cast<char>('a' + rank));
    aclshmemx_putmem_on_stream(pe.target, pe.staging, 64, 1 - rank, pe.stream);
    EXPECT_EQ(aclrtSynchronizeStream(pe.stream), ACL_SUCCESS);
    ASSERT_TRUE(bootstrap.Barrier().ok());
    EXPECT_EQ(Download(pe.target, 64), std::string(64, '\0'));   // nothing arrived
    ReleaseReachPe(pe, bootstrap);
  });
  ASSERT_EQ(unsetenv("ASCEND_RT_VISIBLE_DEVICES"), 0);
}

TEST_F(CannFakesTest, OtherHostsAreReachedOverRoceForPutGetAndSetButNeverForAddOrBarriers) {
  for (const int engines : {static_cast<int>(ACLSHMEM_DATA_OP_MTE), ACLSHMEM_DATA_OP_MTE | ACLSHMEM_DATA_OP_ROCE}) {
    SCOPED_TRACE(engines);
    FakeCann::Reset();
    shmem::testutil::RunRanks(2, [engines](int rank, shmem::Bootstrap& bootstrap) {
      ReachPe pe = InitReachPe(rank, 2, bootstrap, "host" + std::to_string(rank), engines,
                               static_cast<char>('a' + rank));
      const bool roce = (engines & ACLSHMEM_DATA_OP_ROCE) != 0;
      EXPECT_NE(aclshmem_ptr(pe.target, 1 - rank), nullptr);   // mapped or not
      aclshmemx_putmem_on_stream(pe.target, pe.staging, 64, 1 - rank, pe.stream);
      EXPECT_EQ(aclrtSynchronizeStream(pe.stream), ACL_SUCCESS);
      ASSERT_TRUE(bootstrap.Barrier().ok());
      EXPECT_EQ(Download(pe.target, 64), std::string(64, roce ? static_cast<char>('a' + 1 - rank) : '\0'));
      ASSERT_TRUE(bootstrap.Barrier().ok());
      aclshmemx_signal_op_on_stream(static_cast<int32_t*>(pe.target), 5, ACLSHMEM_SIGNAL_SET, 1 - rank, pe.stream);
      EXPECT_EQ(aclrtSynchronizeStream(pe.stream), ACL_SUCCESS);
      ASSERT_TRUE(bootstrap.Barrier().ok());
      int32_t set = 0;
      ASSERT_EQ(aclrtMemcpy(&set, 4, pe.target, 4, ACL_MEMCPY_DEVICE_TO_HOST), ACL_SUCCESS);
      EXPECT_EQ(set == 5, roce);
      // SIGNAL ADD is an MTE atomic through aclshmem_ptr (shmem_device_so.hpp:299-312), RoCE or not.
      aclshmemx_signal_op_on_stream(static_cast<int32_t*>(pe.target), 1, ACLSHMEM_SIGNAL_ADD, 1 - rank, pe.stream);
      EXPECT_EQ(aclrtSynchronizeStream(pe.stream), ACL_ERROR_RT_AICORE_EXCEPTION);
      aclshmemx_barrier_all_on_stream(pe.stream);
      EXPECT_EQ(aclrtSynchronizeStream(pe.stream), ACL_ERROR_RT_AICORE_EXCEPTION);
      ReleaseReachPe(pe, bootstrap);
    });
  }
}

TEST_F(CannFakesTest, ASetWritesItsWholeLineBackAsTheWriterLastWroteIt) {
  // Two PEs SET their own flag in one 64-byte line of PE 0's heap, one after the other, and then again: the second
  // round writes back the line as each writer last wrote it, so the other writer's flag is lost.
  shmem::testutil::RunRanks(3, [](int rank, shmem::Bootstrap& bootstrap) {
    ReachPe pe = InitReachPe(rank, 3, bootstrap, "node0", ACLSHMEM_DATA_OP_MTE, 'z');
    auto* line = static_cast<int32_t*>(pe.target);   // 64-byte aligned: its own line
    ASSERT_EQ(reinterpret_cast<std::uintptr_t>(line) % 64, 0u);
    for (int round = 1; round <= 2; ++round) {
      for (int writer = 1; writer <= 2; ++writer) {
        if (rank == writer) {
          aclshmemx_signal_op_on_stream(line + writer, round, ACLSHMEM_SIGNAL_SET, 0, pe.stream);
          EXPECT_EQ(aclrtSynchronizeStream(pe.stream), ACL_SUCCESS);
        }
        ASSERT_TRUE(bootstrap.Barrier().ok());
      }
    }
    if (rank == 0) {
      int32_t flags[3] = {};
      ASSERT_EQ(aclrtMemcpy(flags, sizeof(flags), line, sizeof(flags), ACL_MEMCPY_DEVICE_TO_HOST), ACL_SUCCESS);
      EXPECT_EQ(flags[2], 2);
      EXPECT_EQ(flags[1], 1) << "writer 2's write-back restored the line it last saw, losing writer 1's second flag";
    }
    // Flags on lines of their own lose nothing.
    ASSERT_TRUE(bootstrap.Barrier().ok());
    for (int round = 3; round <= 4; ++round) {
      for (int writer = 1; writer <= 2; ++writer) {
        if (rank == writer) {
          aclshmemx_signal_op_on_stream(line + 16 * (writer - 1) + 32, round, ACLSHMEM_SIGNAL_SET, 0, pe.stream);
          EXPECT_EQ(aclrtSynchronizeStream(pe.stream), ACL_SUCCESS);
        }
        ASSERT_TRUE(bootstrap.Barrier().ok());
      }
    }
    if (rank == 0) {
      int32_t padded[17] = {};
      ASSERT_EQ(aclrtMemcpy(padded, sizeof(padded), line + 32, sizeof(padded), ACL_MEMCPY_DEVICE_TO_HOST),
                ACL_SUCCESS);
      EXPECT_EQ(padded[0], 4);
      EXPECT_EQ(padded[16], 4);
    }
    ASSERT_TRUE(bootstrap.Barrier().ok());
    ReleaseReachPe(pe, bootstrap);
  });
}

TEST_F(CannFakesTest, KernelsIgnoreUnknownCompareAndSignalOps) {
  InitSinglePe();
  auto* signal = static_cast<int32_t*>(aclshmem_malloc(4));
  const int32_t zero = 0;
  Upload(signal, &zero, sizeof(zero));
  aclrtStream stream = nullptr;
  ASSERT_EQ(aclrtCreateStream(&stream), ACL_SUCCESS);
  // The wait's switch has no default (shmem_device_p2p_sync.hpp:74-90): it returns at once, whatever the signal.
  aclshmemx_signal_wait_until_on_stream(signal, 9, 1, stream);
  EXPECT_EQ(aclrtSynchronizeStreamWithTimeout(stream, 5000), ACL_SUCCESS);
  // Nor does the signal's (shmem_device_so.hpp:333-343): nothing is written, nothing reported.
  aclshmemx_signal_op_on_stream(signal, 5, 7, 0, stream);
  EXPECT_EQ(aclrtSynchronizeStream(stream), ACL_SUCCESS);
  EXPECT_EQ(Download(signal, 4), std::string(4, '\0'));
  EXPECT_EQ(aclrtDestroyStream(stream), ACL_SUCCESS);
  EXPECT_EQ(aclshmem_finalize(), ACLSHMEM_SUCCESS);
}

TEST_F(CannFakesTest, ALaggingStreamLeavesAHostReadStaleUntilSynchronized) {
  InitSinglePe();
  FakeCann::SetStreamLag(FakeCann::kLagUntilDemanded);
  auto* heap = static_cast<char*>(aclshmem_malloc(8));
  void* staging = nullptr;
  ASSERT_EQ(aclrtMalloc(&staging, 8, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  Upload(staging, "arrived", 8);
  aclrtStream stream = nullptr;
  ASSERT_EQ(aclrtCreateStream(&stream), ACL_SUCCESS);
  aclshmemx_putmem_on_stream(heap, staging, 8, 0, stream);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(Download(heap, 8), std::string(8, '\0'));   // aclrtMemcpy is not ordered with the stream
  EXPECT_EQ(aclrtSynchronizeStream(stream), ACL_SUCCESS);
  EXPECT_STREQ(Download(heap, 8).c_str(), "arrived");

  // A stream waiting on an event of a lagging one makes it run.
  aclrtStream other = nullptr;
  ASSERT_EQ(aclrtCreateStream(&other), ACL_SUCCESS);
  aclrtEvent event = nullptr;
  ASSERT_EQ(aclrtCreateEvent(&event), ACL_SUCCESS);
  Upload(staging, "second!", 8);
  aclshmemx_putmem_on_stream(heap, staging, 8, 0, stream);
  ASSERT_EQ(aclrtRecordEvent(event, stream), ACL_SUCCESS);
  ASSERT_EQ(aclrtStreamWaitEvent(other, event), ACL_SUCCESS);
  EXPECT_EQ(aclrtSynchronizeStream(other), ACL_SUCCESS);
  EXPECT_STREQ(Download(heap, 8).c_str(), "second!");

  // A finite lag: the task runs by itself once it passed.
  FakeCann::SetStreamLag(std::chrono::milliseconds(30));
  Upload(staging, "later!!", 8);
  aclshmemx_putmem_on_stream(heap, staging, 8, 0, stream);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (Download(heap, 8) != std::string("later!!", 8) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_STREQ(Download(heap, 8).c_str(), "later!!");
  EXPECT_EQ(aclrtDestroyEvent(event), ACL_SUCCESS);
  EXPECT_EQ(aclrtDestroyStream(other), ACL_SUCCESS);
  EXPECT_EQ(aclrtDestroyStream(stream), ACL_SUCCESS);
  EXPECT_EQ(aclrtFree(staging), ACL_SUCCESS);
  EXPECT_EQ(aclshmem_finalize(), ACLSHMEM_SUCCESS);
}

TEST_F(CannFakesTest, GraphCaptureRecordsTasksAndRefusesSynchronizationAndBlockingCopies) {
  InitSinglePe();
  auto* heap = static_cast<char*>(aclshmem_malloc(8));
  void* staging = nullptr;
  ASSERT_EQ(aclrtMalloc(&staging, 8, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  Upload(staging, "graph!!", 8);
  aclrtStream stream = nullptr;
  ASSERT_EQ(aclrtCreateStream(&stream), ACL_SUCCESS);

  ASSERT_EQ(aclmdlRICaptureBegin(stream, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL), ACL_SUCCESS);
  EXPECT_EQ(aclmdlRICaptureBegin(stream, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL), ACL_ERROR_RT_STREAM_CAPTURED);
  aclmdlRICaptureStatus status = ACL_MODEL_RI_CAPTURE_STATUS_NONE;
  aclmdlRI model = nullptr;
  ASSERT_EQ(aclmdlRICaptureGetInfo(stream, &status, &model), ACL_SUCCESS);
  EXPECT_EQ(status, ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE);
  aclshmemx_putmem_on_stream(heap, staging, 8, 0, stream);   // recorded, not run
  ASSERT_EQ(aclmdlRICaptureEnd(stream, &model), ACL_SUCCESS);
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(aclrtSynchronizeStream(stream), ACL_SUCCESS);
  EXPECT_EQ(Download(heap, 8), std::string(8, '\0'));
  ASSERT_EQ(aclmdlRIExecuteAsync(model, stream), ACL_SUCCESS);   // the replay runs it
  EXPECT_EQ(aclrtSynchronizeStream(stream), ACL_SUCCESS);
  EXPECT_STREQ(Download(heap, 8).c_str(), "graph!!");
  EXPECT_EQ(aclmdlRIDestroy(model), ACL_SUCCESS);

  // A synchronization of the captured stream and a blocking copy fail and invalidate the capture.
  ASSERT_EQ(aclmdlRICaptureBegin(stream, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL), ACL_SUCCESS);
  EXPECT_EQ(aclrtSynchronizeStream(stream), ACL_ERROR_RT_STREAM_CAPTURED);
  EXPECT_EQ(aclrtSynchronizeStreamWithTimeout(stream, 1000), ACL_ERROR_RT_STREAM_CAPTURED);
  ASSERT_EQ(aclmdlRICaptureGetInfo(stream, &status, &model), ACL_SUCCESS);
  EXPECT_EQ(status, ACL_MODEL_RI_CAPTURE_STATUS_INVALIDATED);
  EXPECT_EQ(aclmdlRICaptureEnd(stream, &model), ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED);
  EXPECT_EQ(model, nullptr);
  ASSERT_EQ(aclmdlRICaptureBegin(stream, ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL), ACL_SUCCESS);
  char host[8] = {};
  EXPECT_EQ(aclrtMemcpy(host, 8, heap, 8, ACL_MEMCPY_DEVICE_TO_HOST), ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT);
  EXPECT_EQ(aclmdlRICaptureEnd(stream, &model), ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED);
  // RELAXED allows a blocking copy.
  ASSERT_EQ(aclmdlRICaptureBegin(stream, ACL_MODEL_RI_CAPTURE_MODE_RELAXED), ACL_SUCCESS);
  EXPECT_EQ(aclrtMemcpy(host, 8, heap, 8, ACL_MEMCPY_DEVICE_TO_HOST), ACL_SUCCESS);
  ASSERT_EQ(aclmdlRICaptureEnd(stream, &model), ACL_SUCCESS);
  EXPECT_EQ(aclmdlRIDestroy(model), ACL_SUCCESS);
  EXPECT_EQ(aclmdlRICaptureEnd(stream, &model), ACL_ERROR_RT_STREAM_NOT_CAPTURED);
  EXPECT_EQ(aclrtDestroyStream(stream), ACL_SUCCESS);
  EXPECT_EQ(aclrtFree(staging), ACL_SUCCESS);
  EXPECT_EQ(aclshmem_finalize(), ACLSHMEM_SUCCESS);
}

TEST_F(CannFakesTest, CountersCountSynchronizationsBlockingCopiesTasksAndMallocs) {
  InitSinglePe();
  auto* heap = static_cast<char*>(aclshmem_malloc(64));
  aclrtStream stream = nullptr;
  ASSERT_EQ(aclrtCreateStream(&stream), ACL_SUCCESS);
  void* pinned = nullptr;
  ASSERT_EQ(aclrtMallocHost(&pinned, 64), ACL_SUCCESS);
  FakeCann::ResetCounters();
  void* staging = nullptr;
  ASSERT_EQ(aclrtMalloc(&staging, 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);   // 1 malloc
  Upload(staging, std::string(64, 'c').data(), 64);                               // 1 blocking copy
  aclshmemx_putmem_on_stream(heap, staging, 64, 0, stream);                      // 1 task
  aclshmemx_signal_op_on_stream(reinterpret_cast<int32_t*>(heap), 1, ACLSHMEM_SIGNAL_ADD, 0, stream);   // 1 task
  ASSERT_EQ(aclrtMemcpyAsync(heap, 64, pinned, 64, ACL_MEMCPY_HOST_TO_DEVICE, stream), ACL_SUCCESS);   // 1 task
  std::string pageable(64, 'p');
  ASSERT_EQ(aclrtMemcpyAsync(heap, 64, pageable.data(), 64, ACL_MEMCPY_HOST_TO_DEVICE, stream),
            ACL_SUCCESS);                                                        // 1 task, 1 blocking copy
  ASSERT_EQ(aclrtSynchronizeStream(stream), ACL_SUCCESS);                         // 1 synchronization
  const FakeCounters mine = FakeCann::Counters();
  EXPECT_EQ(mine.device_mallocs, 1u);
  EXPECT_EQ(mine.blocking_copies, 2u);
  EXPECT_EQ(mine.device_tasks, 4u);
  EXPECT_EQ(mine.stream_synchronizations, 1u);
  // Other threads count for themselves and in the total.
  std::thread([] {
    ASSERT_EQ(aclrtSetDevice(1), ACL_SUCCESS);
    void* buffer = nullptr;
    ASSERT_EQ(aclrtMalloc(&buffer, 8, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
    EXPECT_EQ(FakeCann::Counters().device_mallocs, 1u);
    EXPECT_EQ(aclrtFree(buffer), ACL_SUCCESS);
  }).join();
  EXPECT_EQ(FakeCann::Counters().device_mallocs, 1u);
  EXPECT_EQ(FakeCann::TotalCounters().device_mallocs, 2u);
  FakeCann::ResetCounters();
  EXPECT_EQ(FakeCann::Counters().device_tasks, 0u);
  EXPECT_EQ(FakeCann::TotalCounters().device_mallocs, 0u);
  EXPECT_EQ(aclrtFreeHost(pinned), ACL_SUCCESS);
  EXPECT_EQ(aclrtFree(staging), ACL_SUCCESS);
  EXPECT_EQ(aclrtDestroyStream(stream), ACL_SUCCESS);
  EXPECT_EQ(aclshmem_finalize(), ACLSHMEM_SUCCESS);
}

TEST_F(CannFakesTest, TheUniqueIdBindsToAnInterfaceAsTheConfigStorePluginChoosesIt) {
  struct Case {
    const char* ifname;   // null: unset
    int code;
  };
  // store_net_utils.h:395-456: a prefix and a family after ':' (no ':' finds nothing); never a loopback interface;
  // IPv6 needs a routable address (eth0 has only a link-local one here); unset picks the first usable interface.
  for (const Case& c : {Case{nullptr, ACLSHMEM_SUCCESS}, Case{"eth:inet4", ACLSHMEM_SUCCESS},
                        Case{"eth0:inet4", ACLSHMEM_SUCCESS}, Case{"docker0:inet4", ACLSHMEM_SUCCESS},
                        Case{"eth0:anything", ACLSHMEM_SUCCESS}, Case{"eth0", ACLSHMEM_INVALID_PARAM},
                        Case{"lo:inet4", ACLSHMEM_INVALID_PARAM}, Case{"eth0:inet6", ACLSHMEM_INVALID_PARAM},
                        Case{"bogus0:inet4", ACLSHMEM_INVALID_PARAM}, Case{":inet4", ACLSHMEM_INVALID_PARAM}}) {
    SCOPED_TRACE(c.ifname != nullptr ? c.ifname : "unset");
    if (c.ifname != nullptr) {
      ASSERT_EQ(setenv("SHMEM_UID_SOCK_IFNAME", c.ifname, 1), 0);
    } else {
      ASSERT_EQ(unsetenv("SHMEM_UID_SOCK_IFNAME"), 0);
    }
    aclshmemx_uniqueid_t uid{};
    EXPECT_EQ(aclshmemx_get_uniqueid(&uid), c.code);
  }
  ASSERT_EQ(unsetenv("SHMEM_UID_SOCK_IFNAME"), 0);
}

TEST_F(CannFakesTest, PinnedHostMemoryMakesAsyncCopiesOnlyEnqueue) {
  ASSERT_EQ(aclrtSetDevice(0), ACL_SUCCESS);
  FakeCann::SetStreamLag(FakeCann::kLagUntilDemanded);
  void* npu = nullptr;
  ASSERT_EQ(aclrtMalloc(&npu, 8, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  void* pinned = nullptr;
  ASSERT_EQ(aclrtMallocHost(&pinned, 8), ACL_SUCCESS);
  std::memcpy(pinned, "pinned!", 8);
  aclrtStream stream = nullptr;
  ASSERT_EQ(aclrtCreateStream(&stream), ACL_SUCCESS);
  ASSERT_EQ(aclrtMemcpyAsync(npu, 8, pinned, 8, ACL_MEMCPY_HOST_TO_DEVICE, stream), ACL_SUCCESS);
  EXPECT_EQ(Download(npu, 8), std::string(8, '\0'));   // only enqueued: the lagging stream has not run it
  EXPECT_EQ(aclrtSynchronizeStream(stream), ACL_SUCCESS);
  EXPECT_STREQ(Download(npu, 8).c_str(), "pinned!");
  EXPECT_EQ(aclrtFreeHost(pinned), ACL_SUCCESS);
  EXPECT_EQ(aclrtFreeHost(pinned), ACL_ERROR_RT_PARAM_INVALID);
  EXPECT_EQ(aclrtDestroyStream(stream), ACL_SUCCESS);
  EXPECT_EQ(aclrtFree(npu), ACL_SUCCESS);
}

TEST_F(CannFakesTest, DestroyingAStreamWithASpinningWaitHangsAndIsCounted) {
  InitSinglePe();
  FakeCann::SetHangLimit(std::chrono::milliseconds(100));
  auto* signal = static_cast<int32_t*>(aclshmem_malloc(4));
  const int32_t zero = 0;
  Upload(signal, &zero, sizeof(zero));
  aclrtStream stream = nullptr;
  ASSERT_EQ(aclrtCreateStream(&stream), ACL_SUCCESS);
  aclshmemx_signal_wait_until_on_stream(signal, ACLSHMEM_CMP_EQ, 1, stream);
  EXPECT_EQ(aclrtSynchronizeStreamWithTimeout(stream, 20), ACL_ERROR_RT_STREAM_SYNC_TIMEOUT);
  // An NPU would block here for good: the fake counts the hang and gives up.
  EXPECT_EQ(aclrtDestroyStream(stream), ACL_ERROR_RT_INTERNAL_ERROR);
  EXPECT_EQ(FakeCann::Hangs(), 1u);
  EXPECT_EQ(aclshmem_finalize(), ACLSHMEM_SUCCESS);
}

TEST_F(CannFakesTest, AclnnOperatorsRunOnTheStreamInTwoPhases) {
  ASSERT_EQ(aclrtSetDevice(0), ACL_SUCCESS);
  void* a = nullptr;
  void* b = nullptr;
  void* workspace = nullptr;
  ASSERT_EQ(aclrtMalloc(&a, 16, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  ASSERT_EQ(aclrtMalloc(&b, 16, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  ASSERT_EQ(aclrtMalloc(&workspace, kAclnnWorkspaceBytes, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  const float left[4] = {1, 2, 3, 4}, right[4] = {10, -20, 30, -40};
  Upload(a, left, 16);
  Upload(b, right, 16);
  const int64_t dims[1] = {4};
  aclTensor* ta = aclCreateTensor(dims, 1, ACL_FLOAT, nullptr, 0, ACL_FORMAT_ND, dims, 1, a);
  aclTensor* tb = aclCreateTensor(dims, 1, ACL_FLOAT, nullptr, 0, ACL_FORMAT_ND, dims, 1, b);
  float one = 1;
  aclScalar* alpha = aclCreateScalar(&one, ACL_FLOAT);
  ASSERT_TRUE(ta != nullptr && tb != nullptr && alpha != nullptr);
  EXPECT_EQ(FakeCann::LiveAclnnObjects(), 3u);
  aclrtStream stream = nullptr;
  ASSERT_EQ(aclrtCreateStream(&stream), ACL_SUCCESS);
  uint64_t size = 0;
  aclOpExecutor* executor = nullptr;
  ASSERT_EQ(aclnnInplaceAddGetWorkspaceSize(ta, tb, alpha, &size, &executor), ACL_SUCCESS);
  EXPECT_EQ(size, kAclnnWorkspaceBytes);
  EXPECT_EQ(aclnnInplaceAdd(nullptr, 0, executor, stream), kAclnnErrParamInvalid);   // the workspace is required
  ASSERT_EQ(aclnnInplaceAddGetWorkspaceSize(ta, tb, alpha, &size, &executor), ACL_SUCCESS);
  ASSERT_EQ(aclnnInplaceAdd(workspace, size, executor, stream), ACL_SUCCESS);
  ASSERT_EQ(aclnnMaximumGetWorkspaceSize(ta, tb, ta, &size, &executor), ACL_SUCCESS);
  ASSERT_EQ(aclnnMaximum(workspace, size, executor, stream), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(stream), ACL_SUCCESS);
  float result[4];
  ASSERT_EQ(aclrtMemcpy(result, 16, a, 16, ACL_MEMCPY_DEVICE_TO_HOST), ACL_SUCCESS);
  EXPECT_EQ(std::vector<float>(result, result + 4), (std::vector<float>{11, -18, 33, -36}));   // max(a + b, b)
  // Host memory faults the kernel, as on an NPU.
  aclTensor* host = aclCreateTensor(dims, 1, ACL_FLOAT, nullptr, 0, ACL_FORMAT_ND, dims, 1, result);
  ASSERT_EQ(aclnnMinimumGetWorkspaceSize(ta, host, ta, &size, &executor), ACL_SUCCESS);
  ASSERT_EQ(aclnnMinimum(workspace, size, executor, stream), ACL_SUCCESS);
  EXPECT_EQ(aclrtSynchronizeStream(stream), ACL_ERROR_RT_AICORE_EXCEPTION);
  EXPECT_EQ(aclnnCastGetWorkspaceSize(ta, ACL_FLOAT16, tb, &size, &executor), kAclnnErrParamInvalid);
  for (aclTensor* t : {ta, tb, host}) EXPECT_EQ(aclDestroyTensor(t), ACL_SUCCESS);
  EXPECT_EQ(aclDestroyScalar(alpha), ACL_SUCCESS);
  EXPECT_EQ(FakeCann::LiveAclnnObjects(), 0u);
  ASSERT_EQ(aclrtDestroyStream(stream), ACL_SUCCESS);
  for (void* p : {a, b, workspace}) EXPECT_EQ(aclrtFree(p), ACL_SUCCESS);
}

}  // namespace
}  // namespace hp::fakes
