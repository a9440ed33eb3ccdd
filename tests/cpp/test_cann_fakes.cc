// The fakes themselves: the v1.5.1 layouts CANN documents, and the behaviour the ascend device's tests rely on
// (best-fit reuse of freed addresses, ordered asynchronous streams, failures surfacing at synchronize, NPU memory the
// host cannot touch).
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
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
  EXPECT_EQ(Download(zeroed, 32), std::string(32, '\0'));
  // The barrier that ends every allocation: a failed one releases the block and answers NULL.
  FakeCann::FailNext("aclshmemi_control_barrier_all", ACLSHMEM_TIMEOUT_ERROR);
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

TEST_F(CannFakesTest, AFailedInitKeepsItsHeapUntilFinalize) {
  ASSERT_EQ(aclrtSetDevice(0), ACL_SUCCESS);
  aclshmemx_uniqueid_t uid{};
  ASSERT_EQ(aclshmemx_get_uniqueid(&uid), ACLSHMEM_SUCCESS);
  aclshmemx_init_attr_t attr{};
  ASSERT_EQ(aclshmemx_set_attr_uniqueid_args(0, 1, 2 << 20, &uid, &attr), ACLSHMEM_SUCCESS);
  FakeCann::FailNext("aclshmemi_control_barrier_all", ACLSHMEM_TIMEOUT_ERROR);
  EXPECT_EQ(aclshmemx_init_attr(ACLSHMEMX_INIT_WITH_UNIQUEID, &attr), ACLSHMEM_TIMEOUT_ERROR);
  EXPECT_EQ(aclshmemx_init_status(), ACLSHMEM_STATUS_SHM_CREATED);   // no rollback
  EXPECT_EQ(aclshmemx_init_attr(ACLSHMEMX_INIT_WITH_UNIQUEID, &attr), ACLSHMEM_INNER_ERROR);   // "repeatedly"
  EXPECT_EQ(aclshmem_malloc(16), nullptr);
  EXPECT_EQ(aclshmem_finalize(), ACLSHMEM_SUCCESS);
  EXPECT_EQ(aclshmemx_init_status(), ACLSHMEM_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(FakeCann::LiveSessions(), 0u);
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

TEST_F(CannFakesTest, PesOnAnotherHostNeedRoce) {
  for (const int engines : {static_cast<int>(ACLSHMEM_DATA_OP_MTE), ACLSHMEM_DATA_OP_MTE | ACLSHMEM_DATA_OP_ROCE}) {
    FakeCann::Reset();
    shmem::testutil::RunRanks(2, [engines](int rank, shmem::Bootstrap& bootstrap) {
      aclshmemx_uniqueid_t uid{};
      aclshmemx_init_attr_t attr{};
      ASSERT_NO_FATAL_FAILURE(PrepareUniqueIdPe(rank, 2, bootstrap, &uid, &attr));
      FakeCann::SetNode("host" + std::to_string(rank));
      attr.option_attr.data_op_engine_type = static_cast<data_op_engine_type_t>(engines);
      ASSERT_EQ(aclshmemx_init_attr(ACLSHMEMX_INIT_WITH_UNIQUEID, &attr), ACLSHMEM_SUCCESS);
      void* target = aclshmem_malloc(8);
      void* staging = nullptr;
      ASSERT_EQ(aclrtMalloc(&staging, 8, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
      aclrtStream stream = nullptr;
      ASSERT_EQ(aclrtCreateStream(&stream), ACL_SUCCESS);
      aclshmemx_putmem_on_stream(target, staging, 8, 1 - rank, stream);
      const bool roce = (engines & ACLSHMEM_DATA_OP_ROCE) != 0;
      EXPECT_EQ(aclrtSynchronizeStream(stream), roce ? ACL_SUCCESS : ACL_ERROR_RT_AICORE_EXCEPTION);
      EXPECT_EQ(aclshmem_ptr(target, 1 - rank) != nullptr, roce);
      ASSERT_EQ(aclrtDestroyStream(stream), ACL_SUCCESS);
      ASSERT_EQ(aclrtFree(staging), ACL_SUCCESS);
      ASSERT_TRUE(bootstrap.Barrier().ok());
      EXPECT_EQ(aclshmem_finalize(), ACLSHMEM_SUCCESS);
    });
  }
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
