// The ascend device on the CANN fakes: the init sequence, the lifecycle and its failures, device drift, memory
// through CANN's heap with the runtime's guards, the stream-enqueued data plane and the mapping of CANN's codes.
// As on an NPU, the heap is out of the host's reach (a host dereference crashes): the tests read and write it with
// aclrtMemcpy, and pass NPU buffers (aclrtMalloc) where CANN needs device memory.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "acl/acl.h"
#include "fake_cann.h"
#include "runtime/ascend/ascend_device.h"
#include "runtime/ascend/cann_status.h"
#include "runtime/logging.h"
#include "runtime/runtime.h"
#include "shmem.h"
#include "test_support.h"
#include "thread_bootstrap.h"

namespace hp::shmem {
namespace {

using ascend::AscendDevice;
using ascend::AscendDeviceOptions;
using fakes::FakeCall;
using fakes::FakeCann;
using testutil::Contains;
using testutil::HasError;
using testutil::IsOk;
using testutil::kMiB;

DeviceInitArgs Args(int rank, int world_size, std::size_t heap_size = 3 * kMiB, double timeout_sec = 5.0) {
  DeviceInitArgs args;
  args.rank = rank;
  args.world_size = world_size;
  args.heap_size = heap_size;
  args.timeout_sec = timeout_sec;
  return args;
}

Config AscendConfig(double timeout_sec = 5.0) {
  Config config;
  config.device = "ascend";
  config.heap_size = 2 * kMiB;
  config.timeout_sec = timeout_sec;
  return config;
}

// Every simulated process (thread) selects its NPU first, as torch.npu.set_device would: rank r uses npu:r.
template <typename Fn>
void RunNpuRanks(int world_size, Fn&& fn) {
  testutil::RunRanks(world_size, [&](int rank, Bootstrap& bootstrap) {
    ASSERT_EQ(aclrtSetDevice(rank), ACL_SUCCESS);
    fn(rank, bootstrap);
  });
}

// The calls a rank made (its thread's device is npu:rank).
std::vector<FakeCall> CallsOf(int device, const std::string& name = "") {
  std::vector<FakeCall> mine;
  for (const FakeCall& call : FakeCann::Calls()) {
    if (call.device == device && (name.empty() || call.name == name)) mine.push_back(call);
  }
  return mine;
}

// NPU memory outside the symmetric heap, as a torch_npu tensor holds it.
class NpuBuffer {
 public:
  explicit NpuBuffer(std::size_t bytes) {
    EXPECT_EQ(aclrtMalloc(&data_, bytes, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  }
  explicit NpuBuffer(const std::vector<char>& contents) : NpuBuffer(contents.size()) {
    EXPECT_EQ(aclrtMemcpy(data_, contents.size(), contents.data(), contents.size(), ACL_MEMCPY_HOST_TO_DEVICE),
              ACL_SUCCESS);
  }
  ~NpuBuffer() { EXPECT_EQ(aclrtFree(data_), ACL_SUCCESS); }
  NpuBuffer(const NpuBuffer&) = delete;
  NpuBuffer& operator=(const NpuBuffer&) = delete;
  void* data() const { return data_; }

 private:
  void* data_ = nullptr;
};

// Host copies of NPU memory (the heap or an NpuBuffer).
std::vector<char> ReadNpu(const void* npu, std::size_t bytes) {
  std::vector<char> host(bytes);
  EXPECT_EQ(aclrtMemcpy(host.data(), bytes, npu, bytes, ACL_MEMCPY_DEVICE_TO_HOST), ACL_SUCCESS);
  return host;
}

void WriteNpu(void* npu, const void* host, std::size_t bytes) {
  EXPECT_EQ(aclrtMemcpy(npu, bytes, host, bytes, ACL_MEMCPY_HOST_TO_DEVICE), ACL_SUCCESS);
}

std::size_t IndexOf(const std::vector<FakeCall>& calls, const std::string& name) {
  for (std::size_t i = 0; i < calls.size(); ++i) {
    if (calls[i].name == name) return i;
  }
  return calls.size();
}

class AscendDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override { FakeCann::Reset(); }
  void TearDown() override {
    FakeCann::Reset();
    Logger::SetLevel(LogLevel::kWarning);
  }
};

TEST_F(AscendDeviceTest, InitDecidesTlsFirstThenBroadcastsRankZerosUniqueId) {
  RunNpuRanks(2, [](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 2, 3 * kMiB, 2.5), bootstrap)));
    EXPECT_EQ(device.device_id(), rank);
    EXPECT_EQ(device.soc_name(), "Ascend910B1");
    EXPECT_EQ(device.local_mem_size(), 4 * kMiB);   // 2 MiB pages
    EXPECT_EQ(device.heap_size(), 4 * kMiB + ACLSHMEM_EXTRA_SIZE);   // CANN maps 6 MiB more for itself
    EXPECT_NE(device.heap_base(), 0u);

    const std::vector<FakeCall> calls = CallsOf(rank);
    const std::size_t tls = IndexOf(calls, "aclshmemx_set_conf_store_tls");
    const std::size_t args = IndexOf(calls, "aclshmemx_set_attr_uniqueid_args");
    const std::size_t init = IndexOf(calls, "aclshmemx_init_attr");
    ASSERT_LT(init, calls.size());
    EXPECT_LT(tls, args);
    EXPECT_LT(args, init);
    EXPECT_EQ(calls[tls].value, 0);   // no HYPER_PARALLEL_SHMEM_TLS_INFO: off
    const std::size_t uid = IndexOf(calls, "aclshmemx_get_uniqueid");
    if (rank == 0) {
      EXPECT_LT(tls, uid);
      EXPECT_LT(uid, args);
    } else {
      EXPECT_EQ(uid, calls.size());   // only the root creates the id
    }

    const auto record = FakeCann::LastInit();
    ASSERT_TRUE(record.has_value());
    EXPECT_EQ(record->bootstrap_flags, ACLSHMEMX_INIT_WITH_UNIQUEID);
    EXPECT_EQ(record->attr.my_pe, rank);
    EXPECT_EQ(record->attr.n_pes, 2);
    EXPECT_EQ(record->attr.local_mem_size, 4 * kMiB);
    EXPECT_EQ(record->attr.option_attr.shm_init_timeout, 3u);
    EXPECT_EQ(record->attr.option_attr.control_operation_timeout, 3u);
    EXPECT_EQ(record->attr.option_attr.data_op_engine_type, ACLSHMEM_DATA_OP_MTE);   // one host: no RoCE
    EXPECT_FALSE(device.uses_roce());
    // Unique-id mode: CANN's own bootstrap waits are 120 s whatever option_attr says.
    EXPECT_EQ(record->init_timeout_s, 120u);
    EXPECT_EQ(record->control_timeout_s, 120u);
    EXPECT_TRUE(record->tls_decided);
    EXPECT_FALSE(record->tls_enable);
    EXPECT_FALSE(record->tls_effective);
    EXPECT_EQ(record->uid.version, ACLSHMEM_UNIQUEID_VERSION);
    const auto uids = testutil::GatherValue(bootstrap, record->uid);
    EXPECT_EQ(std::memcmp(&uids[0], &uids[1], sizeof(uids[0])), 0);   // one id, broadcast
    ASSERT_TRUE(bootstrap.Barrier().ok());
    EXPECT_TRUE(IsOk(device.Finalize()));
  });
  EXPECT_EQ(FakeCann::CallsNamed("aclshmemx_get_uniqueid").size(), 1u);
  EXPECT_EQ(FakeCann::LiveStreams(), 0u);
  EXPECT_EQ(FakeCann::LiveSessions(), 0u);
}

TEST_F(AscendDeviceTest, TlsInfoIsRefusedSinceV151RunsTheConfigStoreWithoutTls) {
  const std::string settings = "tls.enable:true;tls.ca.path:/etc/ssl/ca.pem;";
  RunNpuRanks(2, [&](int rank, Bootstrap& bootstrap) {
    AscendDeviceOptions options;
    if (rank == 1) options.tls_info = settings;   // one rank asks: every rank fails, agreed
    AscendDevice device(options);
    EXPECT_TRUE(HasError(device.Init(Args(rank, 2), bootstrap), StatusCode::kInvalidArgument,
                         "preparing CANN SHMEM failed: rank=1 (`HYPER_PARALLEL_SHMEM_TLS_INFO` must be unset with "
                         "CANN SHMEM v1.5.1 (its unique-id bootstrap runs the config store without TLS whatever "
                         "aclshmemx_set_conf_store_tls says: init_config_store() turns it off), but got 44 "
                         "characters"));
    EXPECT_TRUE(CallsOf(rank, "aclshmemx_init_attr").empty());
    EXPECT_EQ(aclshmemx_init_status(), ACLSHMEM_STATUS_NOT_INITIALIZED);

  });
  RunNpuRanks(1, [&](int rank, Bootstrap& bootstrap) {
    AscendDevice plain;
    ::testing::internal::CaptureStderr();
    ASSERT_TRUE(IsOk(plain.Init(Args(rank, 1), bootstrap)));
    const std::string log = ::testing::internal::GetCapturedStderr();
    EXPECT_TRUE(Contains(log, "WARNING")) << log;
    EXPECT_TRUE(Contains(log, "CANN SHMEM's config store runs without TLS (v1.5.1 has no TLS in unique-id mode)"))
        << log;
    EXPECT_EQ(log.find('\n'), log.size() - 1) << "one line: " << log;
    const auto record = FakeCann::LastInit();
    ASSERT_TRUE(record.has_value());
    EXPECT_FALSE(record->tls_enable);
    EXPECT_FALSE(record->tls_effective);
    ASSERT_TRUE(IsOk(plain.Finalize()));
  });
}

TEST_F(AscendDeviceTest, DoubleInitIsRejectedAndReinitAfterFinalizeWorks) {
  RunNpuRanks(2, [](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 2), bootstrap)));
    EXPECT_TRUE(HasError(device.Init(Args(rank, 2), bootstrap), StatusCode::kStateError,
                         "ascend device is already initialised: rank=" + std::to_string(rank)));
    AscendDevice second;   // another user of CANN SHMEM in the same process
    EXPECT_TRUE(HasError(second.Init(Args(rank, 2), bootstrap), StatusCode::kStateError,
                         "CANN SHMEM is already initialised in this process: init_status=2"));
    ASSERT_TRUE(IsOk(device.Finalize()));
    EXPECT_EQ(aclshmemx_init_status(), ACLSHMEM_STATUS_NOT_INITIALIZED);
    ASSERT_TRUE(IsOk(second.Init(Args(rank, 2), bootstrap)));
    ASSERT_TRUE(IsOk(second.Finalize()));
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 2), bootstrap)));   // the same object, a new lifecycle
    ASSERT_TRUE(IsOk(device.Finalize()));
  });
  EXPECT_EQ(FakeCann::LiveStreams(), 0u);
  EXPECT_EQ(FakeCann::LiveSessions(), 0u);
}

TEST_F(AscendDeviceTest, InitFailureOnOneRankLeavesEveryRankClean) {
  // Rank 1's CANN init succeeds but its stream does not: rank 0 finished init too, and must undo it.
  RunNpuRanks(2, [](int rank, Bootstrap& bootstrap) {
    if (rank == 1) FakeCann::FailNext("aclrtCreateStream", ACL_ERROR_RT_INTERNAL_ERROR);
    AscendDevice device;
    EXPECT_TRUE(HasError(device.Init(Args(rank, 2), bootstrap), StatusCode::kDeviceError,
                         "initialising CANN SHMEM failed: rank=1 (aclrtCreateStream failed: cann_error_code=507000"));
    EXPECT_EQ(aclshmemx_init_status(), ACLSHMEM_STATUS_NOT_INITIALIZED);
    EXPECT_EQ(device.heap_base(), 0u);
    EXPECT_TRUE(HasError(device.Allocate(64, 64).status(), StatusCode::kStateError, "not initialised"));
    ASSERT_TRUE(bootstrap.Barrier().ok());
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 2), bootstrap)));   // nothing left behind
    ASSERT_TRUE(IsOk(device.Finalize()));
  });
  EXPECT_EQ(FakeCann::LiveStreams(), 0u);
  EXPECT_EQ(FakeCann::LiveSessions(), 0u);
}

TEST_F(AscendDeviceTest, InitFailureInCannIsAgreedAndKeepsTheCannCode) {
  RunNpuRanks(2, [](int rank, Bootstrap& bootstrap) {
    FakeCann::FailNext("aclshmemx_init_attr", ACLSHMEM_BOOTSTRAP_ERROR);
    AscendDevice device;
    EXPECT_TRUE(HasError(device.Init(Args(rank, 2), bootstrap), StatusCode::kDeviceError,
                         "initialising CANN SHMEM failed: rank=0 (aclshmemx_init_attr failed: cann_error_code=-6 "
                         "(ACLSHMEM_BOOTSTRAP_ERROR)"));
    // The root's failure to create the id reaches every rank before anyone initialises.
    if (rank == 0) FakeCann::FailNext("aclshmemx_get_uniqueid", ACLSHMEM_INNER_ERROR);
    EXPECT_TRUE(HasError(device.Init(Args(rank, 2), bootstrap), StatusCode::kDeviceError,
                         "aclshmemx_get_uniqueid failed: cann_error_code=-4 (ACLSHMEM_INNER_ERROR) rank=0"));
  });
  EXPECT_EQ(FakeCann::CallsNamed("aclshmemx_init_attr").size(), 2u);
  EXPECT_EQ(FakeCann::LiveStreams(), 0u);
}

TEST_F(AscendDeviceTest, AFailedFinalizeIsTerminal) {
  RunNpuRanks(1, [](int rank, Bootstrap& bootstrap) {
    {
      AscendDevice device;
      ASSERT_TRUE(IsOk(device.Init(Args(rank, 1), bootstrap)));
      FakeCann::FailNext("aclshmem_finalize", ACLSHMEM_INNER_ERROR);
      EXPECT_TRUE(HasError(device.Finalize(), StatusCode::kDeviceError,
                           "aclshmem_finalize failed: cann_error_code=-4 (ACLSHMEM_INNER_ERROR)"));
      EXPECT_TRUE(HasError(device.Allocate(64, 64).status(), StatusCode::kStateError,
                           "ascend device failed to finalize and cannot be used again: op=Allocate"));
      EXPECT_TRUE(HasError(device.Init(Args(rank, 1), bootstrap), StatusCode::kStateError, "cannot be used again"));
      EXPECT_TRUE(HasError(device.Finalize(), StatusCode::kStateError, "cannot be used again"));
    }
    // Through the runtime: the lifecycle ends in kFailed.
    EXPECT_EQ(aclshmem_finalize(), ACLSHMEM_SUCCESS);   // clean the fake's PE for the next init
    Runtime runtime;
    ASSERT_TRUE(IsOk(runtime.Init(AscendConfig(), std::make_unique<AscendDevice>(), bootstrap)));
    FakeCann::FailNext("aclshmem_finalize", ACLSHMEM_INNER_ERROR);
    EXPECT_TRUE(HasError(runtime.Shutdown(bootstrap), StatusCode::kDeviceError,
                         "device finalize failed, the runtime cannot be used again: aclshmem_finalize failed: "
                         "cann_error_code=-4"));
    EXPECT_EQ(runtime.state(), LifecycleState::kFailed);
    EXPECT_TRUE(Contains(runtime.Snapshot().latest_failure, "cann_error_code=-4 (ACLSHMEM_INNER_ERROR)"));
  });
}

TEST_F(AscendDeviceTest, EveryOperationRejectsAChangedCurrentDevice) {
  RunNpuRanks(1, [](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 1), bootstrap)));
    auto buffer = device.Allocate(256, 64);
    ASSERT_TRUE(buffer.ok());
    char local[16] = {};
    ASSERT_EQ(aclrtSetDevice(1), ACL_SUCCESS);
    const std::string drift = "current device must be npu:0 (fixed at acquire_shmem), but got npu:1";
    EXPECT_TRUE(HasError(device.Allocate(64, 64).status(), StatusCode::kInvalidArgument, drift));
    EXPECT_TRUE(HasError(device.Free(buffer.value()), StatusCode::kInvalidArgument, drift));
    EXPECT_TRUE(HasError(device.Put(buffer.value(), local, 16, 0, kDefaultStream, nullptr),
                         StatusCode::kInvalidArgument, drift));
    EXPECT_TRUE(HasError(device.Get(local, buffer.value(), 16, 0, kDefaultStream, nullptr),
                         StatusCode::kInvalidArgument, drift));
    EXPECT_TRUE(HasError(device.Signal(buffer.value(), SignalWidth::k32, 1, SignalOp::kSet, 0, kDefaultStream),
                         StatusCode::kInvalidArgument, drift));
    EXPECT_TRUE(HasError(device.WaitSignal(buffer.value(), SignalWidth::k32, CompareOp::kEq, 0, kDefaultStream),
                         StatusCode::kInvalidArgument, drift));
    EXPECT_TRUE(HasError(device.Barrier(kDefaultStream), StatusCode::kInvalidArgument, drift));
    EXPECT_TRUE(HasError(device.CopyToHeap(buffer.value(), local, 16), StatusCode::kInvalidArgument, drift));
    EXPECT_TRUE(HasError(device.CopyFromHeap(local, buffer.value(), 16), StatusCode::kInvalidArgument, drift));
    EXPECT_TRUE(HasError(device.CreateStream().status(), StatusCode::kInvalidArgument, drift));
    EXPECT_TRUE(HasError(device.SynchronizeStream(kDefaultStream), StatusCode::kInvalidArgument, drift));
    EXPECT_TRUE(HasError(device.Quiesce(), StatusCode::kInvalidArgument, drift));
    EXPECT_TRUE(FakeCann::CallsNamed("aclshmemx_putmem_on_stream").empty());
    EXPECT_TRUE(FakeCann::CallsNamed("aclrtMemcpy").empty());
    // Back on npu:0 everything works; a finalize from elsewhere releases on npu:0 and restores the caller's NPU.
    ASSERT_EQ(aclrtSetDevice(0), ACL_SUCCESS);
    EXPECT_TRUE(IsOk(device.Free(buffer.value())));
    ASSERT_EQ(aclrtSetDevice(1), ACL_SUCCESS);
    EXPECT_TRUE(IsOk(device.Finalize()));
    int32_t current = -1;
    ASSERT_EQ(aclrtGetDevice(&current), ACL_SUCCESS);
    EXPECT_EQ(current, 1);
    EXPECT_EQ(aclshmemx_init_status(), ACLSHMEM_STATUS_NOT_INITIALIZED);
  });
}

TEST_F(AscendDeviceTest, NoNpuSelectedFailsWithTheAclCode) {
  testutil::RunRanks(1, [](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    EXPECT_TRUE(HasError(device.Init(Args(rank, 1), bootstrap), StatusCode::kStateError,
                         "aclrtGetDevice failed: cann_error_code=107002 (ACL_ERROR_RT_CONTEXT_NULL) rank=0"));
  });
}

TEST_F(AscendDeviceTest, MemoryComesFromCannsHeapAndIdsAreNeverReusedOnAddressReuse) {
  RunNpuRanks(2, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(runtime.Init(AscendConfig(), std::make_unique<AscendDevice>(), bootstrap)));
    auto first = runtime.Allocate(4096, 0, "test");
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    EXPECT_FALSE(CallsOf(rank, "aclshmem_align").empty());
    ASSERT_TRUE(IsOk(runtime.Free(first->id, "test")));
    EXPECT_EQ(CallsOf(rank, "aclshmem_free").back().address, first->base);
    auto second = runtime.Allocate(4096, 0, "test");
    ASSERT_TRUE(second.ok());
    EXPECT_EQ(second->base, first->base);   // CANN's best fit hands the address out again
    EXPECT_NE(second->id, first->id);
    EXPECT_TRUE(HasError(runtime.Free(first->id, "test"), StatusCode::kStateError, "already freed"));
    ASSERT_TRUE(IsOk(runtime.Free(second->id, "test")));
    ASSERT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST_F(AscendDeviceTest, LeakAndUseAfterFreeGuardsHoldOnThisDevice) {
  RunNpuRanks(2, [](int, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(runtime.Init(AscendConfig(), std::make_unique<AscendDevice>(), bootstrap)));
    auto freed = runtime.Allocate(256, 0, "test");
    auto leaked = runtime.Allocate(256, 0, "test");
    ASSERT_TRUE(freed.ok() && leaked.ok());
    ASSERT_TRUE(IsOk(runtime.Free(freed->id, "test")));
    char src[16] = {};
    EXPECT_TRUE(HasError(runtime.Put(reinterpret_cast<void*>(freed->base), src, 16, 16, 0, kDefaultStream, nullptr),
                         StatusCode::kInvalidArgument, "`dst`"));
    EXPECT_TRUE(HasError(runtime.Free(freed->id, "test"), StatusCode::kStateError, "already freed"));
    runtime.OnStorageReleased(leaked->id);
    ASSERT_EQ(runtime.Snapshot().leaked.size(), 1u);
    EXPECT_EQ(runtime.Snapshot().leaked[0].id, leaked->id);
    EXPECT_TRUE(HasError(runtime.Free(leaked->id, "test"), StatusCode::kStateError, "state=leaked"));
    ASSERT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST_F(AscendDeviceTest, AllocationFailureIsOutOfMemoryAndShowsInLatestFailure) {
  RunNpuRanks(1, [](int, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(runtime.Init(AscendConfig(), std::make_unique<AscendDevice>(), bootstrap)));
    EXPECT_TRUE(HasError(runtime.Allocate(64 * kMiB, 0, "test").status(), StatusCode::kOutOfMemory,
                         "aclshmem_align failed: cann_error_code=-8 (ACLSHMEM_MALLOC_FAILED) requested=67108864 "
                         "alignment=64 local_mem_size=2097152 heap_size=8388608 (the symmetric heap has no gap that "
                         "large"));
    EXPECT_TRUE(Contains(runtime.Snapshot().latest_failure, "cann_error_code=-8"));
    ASSERT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST_F(AscendDeviceTest, AMallocWhoseBarrierFailsIsATimeoutNotAFullHeap) {
  // CANN answers NULL for both (shmem_mm.cpp:46-53); the heap has room, so the barrier failed.
  RunNpuRanks(1, [](int, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(runtime.Init(AscendConfig(), std::make_unique<AscendDevice>(), bootstrap)));
    for (const char* call : {"aclshmem_align", "aclshmem_malloc"}) {
      FakeCann::FailNext(std::string(fakes::kControlBarrier) + ":" + call, ACLSHMEM_SMEM_ERROR);
      const std::size_t alignment = std::string(call) == "aclshmem_align" ? 0 : 16;
      EXPECT_TRUE(HasError(runtime.Allocate(256, alignment, "test").status(), StatusCode::kTimeout,
                           std::string(call) + " failed: cann_error_code=-3 (ACLSHMEM_SMEM_ERROR) requested=256 "
                           "alignment=" + (alignment == 0 ? "64" : "16") + " local_mem_size=2097152 "
                           "heap_size=8388608 (the heap has room for it, so CANN's closing control barrier failed: a "
                           "peer missing or later than CANN's 120 s control timeout"));
    }
    // Fragmented rather than full: what is left in total would hold it, no gap does.
    auto a = runtime.Allocate(kMiB, 0, "a");
    auto b = runtime.Allocate(kMiB / 2, 0, "b");
    auto c = runtime.Allocate(kMiB, 0, "c");
    ASSERT_TRUE(a.ok() && b.ok() && c.ok());
    ASSERT_TRUE(IsOk(runtime.Free(a->id, "a")));
    ASSERT_TRUE(IsOk(runtime.Free(c->id, "c")));
    EXPECT_TRUE(HasError(runtime.Allocate(2 * kMiB, 0, "big").status(), StatusCode::kOutOfMemory,
                         "(the symmetric heap has no gap that large"));
    ASSERT_TRUE(IsOk(runtime.Free(b->id, "b")));
    ASSERT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST_F(AscendDeviceTest, SmallAlignmentsUseMallocAndPeerAddressesGoThroughAclshmemPtr) {
  RunNpuRanks(2, [](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 2), bootstrap)));
    auto small = device.Allocate(10, 16);
    ASSERT_TRUE(small.ok());
    EXPECT_EQ(CallsOf(rank, "aclshmem_malloc").size(), 1u);
    EXPECT_EQ(device.ReservedBytes(small.value()), 16u);
    auto big = device.Allocate(1000, 4096);
    ASSERT_TRUE(big.ok());
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(big.value()) % 4096, 0u);
    EXPECT_EQ(CallsOf(rank, "aclshmem_align").back().value, 4096);

    const auto bigs = testutil::GatherValue(bootstrap, big.value());
    auto peer = device.PeerAddress(static_cast<char*>(big.value()) + 100, 1 - rank);
    ASSERT_TRUE(peer.ok()) << peer.status().ToString();
    EXPECT_EQ(peer.value(), static_cast<char*>(bigs[static_cast<std::size_t>(1 - rank)]) + 100);
    EXPECT_TRUE(HasError(device.PeerAddress(big.value(), 2).status(), StatusCode::kInvalidArgument,
                         "`pe` must be in [0, 2), but got 2"));
    int outside = 0;
    EXPECT_TRUE(HasError(device.PeerAddress(&outside, 0).status(), StatusCode::kInvalidArgument,
                         "`symmetric` must be an address inside the symmetric heap"));
    EXPECT_TRUE(HasError(device.Free(&outside), StatusCode::kInvalidArgument,
                         "`ptr` must be an allocation of the ascend device"));
    ASSERT_TRUE(bootstrap.Barrier().ok());
    EXPECT_TRUE(IsOk(device.Free(small.value())));
    EXPECT_TRUE(IsOk(device.Free(big.value())));
    ASSERT_TRUE(IsOk(device.Finalize()));
  });
}

TEST_F(AscendDeviceTest, DataPlaneCallsCarryTheStreamBytesAndPe) {
  RunNpuRanks(2, [](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 2), bootstrap)));
    auto buffer = device.Allocate(4096, 64);
    auto signal = device.Allocate(4, 64);
    ASSERT_TRUE(buffer.ok() && signal.ok());
    const std::int32_t zero = 0;
    WriteNpu(signal.value(), &zero, sizeof(zero));
    auto stream = device.CreateStream();
    ASSERT_TRUE(stream.ok());
    const int peer = 1 - rank;
    ASSERT_TRUE(bootstrap.Barrier().ok());

    const NpuBuffer src(std::vector<char>(1000, static_cast<char>('a' + rank)));
    ASSERT_TRUE(IsOk(device.Put(buffer.value(), src.data(), 1000, peer, stream.value(), nullptr)));
    const FakeCall put = CallsOf(rank, "aclshmemx_putmem_on_stream").back();
    EXPECT_EQ(put.stream, stream.value());
    EXPECT_EQ(put.bytes, 1000u);
    EXPECT_EQ(put.target_pe, peer);
    EXPECT_EQ(put.address, reinterpret_cast<std::uintptr_t>(buffer.value()));
    FakeCann::ResetCounters();
    ASSERT_TRUE(IsOk(device.Signal(signal.value(), SignalWidth::k32, 5, SignalOp::kAdd, peer, stream.value())));
    // One task: the put before it was a blocking one, which quiets before its kernel ends, so no quiet precedes it.
    EXPECT_EQ(FakeCann::Counters().device_tasks, 1u);
    EXPECT_TRUE(CallsOf(rank, "aclshmemx_quiet_on_stream").empty());
    const std::vector<FakeCall> calls = CallsOf(rank);
    const FakeCall& sig = calls.back();
    EXPECT_EQ(sig.name, "aclshmemx_signal_op_on_stream");
    EXPECT_EQ(sig.stream, stream.value());
    EXPECT_EQ(sig.value, 5);
    EXPECT_EQ(sig.op, ACLSHMEM_SIGNAL_ADD);
    EXPECT_EQ(sig.target_pe, peer);

    ASSERT_TRUE(IsOk(device.WaitSignal(signal.value(), SignalWidth::k32, CompareOp::kGe, 5, stream.value())));
    const FakeCall wait = CallsOf(rank, "aclshmemx_signal_wait_until_on_stream").back();
    EXPECT_EQ(wait.op, ACLSHMEM_CMP_GE);
    EXPECT_EQ(wait.value, 5);
    EXPECT_EQ(wait.stream, stream.value());
    ASSERT_TRUE(IsOk(device.SynchronizeStream(stream.value())));
    EXPECT_EQ(ReadNpu(buffer.value(), 1000)[999], static_cast<char>('a' + peer));

    // The default stream: the device's own, synchronized (bounded) before the call returns.
    const NpuBuffer back(1000);
    ASSERT_TRUE(IsOk(device.Get(back.data(), buffer.value(), 1000, peer, kDefaultStream, nullptr)));
    const std::vector<FakeCall> after = CallsOf(rank);
    EXPECT_EQ(after[after.size() - 2].name, "aclshmemx_getmem_on_stream");
    EXPECT_EQ(after[after.size() - 2].stream, device.default_stream());
    EXPECT_EQ(after[after.size() - 2].target_pe, peer);
    EXPECT_EQ(after.back().name, "aclrtSynchronizeStreamWithTimeout");
    EXPECT_EQ(after.back().value, 5000);
    EXPECT_EQ(ReadNpu(back.data(), 1000)[0], static_cast<char>('a' + rank));   // what this rank put into the peer
    ASSERT_TRUE(IsOk(device.Barrier(stream.value())));
    const std::vector<FakeCall> barriers = CallsOf(rank, "aclshmemx_barrier_on_stream");
    ASSERT_FALSE(barriers.empty());
    EXPECT_EQ(barriers.back().stream, stream.value());
    EXPECT_EQ(barriers.back().value, ACLSHMEM_TEAM_WORLD);   // one host, one HCCS group: the world is the node
    ASSERT_TRUE(IsOk(device.SynchronizeStream(stream.value())));
    ASSERT_TRUE(IsOk(device.DestroyStream(stream.value())));
    EXPECT_TRUE(HasError(device.DestroyStream(stream.value()), StatusCode::kInvalidArgument,
                         "`stream` must be a live stream of the ascend device"));
    ASSERT_TRUE(IsOk(device.Finalize()));
  });
}

TEST_F(AscendDeviceTest, TheHeapIsReachedFromTheHostOnlyThroughAclrtMemcpy) {
  RunNpuRanks(1, [](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    const char text[] = "records";
    char back[sizeof(text)] = {};
    EXPECT_TRUE(HasError(device.CopyToHeap(back, text, sizeof(text)), StatusCode::kStateError,
                         "ascend device is not initialised: op=CopyToHeap"));
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 1), bootstrap)));
    EXPECT_TRUE(FakeCann::IsDeviceMemory(reinterpret_cast<void*>(device.heap_base()), device.heap_size()));
    auto buffer = device.Allocate(64, 64);
    ASSERT_TRUE(buffer.ok());
    char* heap = static_cast<char*>(buffer.value());
    FakeCann::ClearCalls();
    ASSERT_TRUE(IsOk(device.CopyToHeap(heap + 8, text, sizeof(text))));
    ASSERT_TRUE(IsOk(device.CopyFromHeap(back, heap + 8, sizeof(text))));
    EXPECT_STREQ(back, "records");
    const std::vector<FakeCall> copies = FakeCann::CallsNamed("aclrtMemcpy");
    ASSERT_EQ(copies.size(), 2u);
    EXPECT_EQ(copies[0].op, ACL_MEMCPY_HOST_TO_DEVICE);
    EXPECT_EQ(copies[0].address, reinterpret_cast<std::uintptr_t>(heap + 8));
    EXPECT_EQ(copies[0].bytes, sizeof(text));
    EXPECT_EQ(copies[1].op, ACL_MEMCPY_DEVICE_TO_HOST);
    EXPECT_EQ(copies[1].address, reinterpret_cast<std::uintptr_t>(back));

    // Only this rank's heap; zero bytes are no-ops; CANN's failures keep their code.
    const std::string heap_range = "must lie inside this rank's symmetric heap [" + Hex(device.heap_base()) + "," +
                                   Hex(device.heap_base() + device.heap_size()) + "), but got [";
    EXPECT_TRUE(HasError(device.CopyToHeap(back, text, 1), StatusCode::kInvalidArgument,
                         "`symmetric_dst` " + heap_range + Hex(reinterpret_cast<std::uintptr_t>(back))));
    char* end = reinterpret_cast<char*>(device.heap_base() + device.heap_size());
    EXPECT_TRUE(HasError(device.CopyFromHeap(back, end - 4, 8), StatusCode::kInvalidArgument,
                         "`symmetric_src` " + heap_range));
    EXPECT_TRUE(IsOk(device.CopyToHeap(end, text, 0)));
    EXPECT_EQ(FakeCann::CallsNamed("aclrtMemcpy").size(), 2u);
    FakeCann::FailNext("aclrtMemcpy", ACL_ERROR_RT_INTERNAL_ERROR);
    EXPECT_TRUE(HasError(device.CopyToHeap(heap, text, 8), StatusCode::kDeviceError,
                         "aclrtMemcpy failed: cann_error_code=507000 (ACL_ERROR) op=CopyToHeap kind=host_to_device "
                         "bytes=8 heap_offset=" + Hex(reinterpret_cast<std::uintptr_t>(heap) - device.heap_base())));
    ASSERT_TRUE(IsOk(device.Free(heap)));
    ASSERT_TRUE(IsOk(device.Finalize()));
  });
}

TEST_F(AscendDeviceTest, HostBuffersFailWhereCannNeedsDeviceMemory) {
  RunNpuRanks(1, [](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 1), bootstrap)));
    auto buffer = device.Allocate(64, 64);
    ASSERT_TRUE(buffer.ok());
    char host[16] = "host memory";
    const std::string fault = "aclrtSynchronizeStreamWithTimeout failed: cann_error_code=507015 (ACL_ERROR)";
    EXPECT_TRUE(HasError(device.Put(buffer.value(), host, 16, 0, kDefaultStream, nullptr), StatusCode::kDeviceError,
                         fault + " op=Put"));
    EXPECT_TRUE(HasError(device.Get(host, buffer.value(), 16, 0, kDefaultStream, nullptr), StatusCode::kDeviceError,
                         fault + " op=Get"));
    EXPECT_EQ(ReadNpu(buffer.value(), 16), std::vector<char>(16, '\0'));
    EXPECT_STREQ(host, "host memory");
    ASSERT_TRUE(IsOk(device.Free(buffer.value())));
    ASSERT_TRUE(IsOk(device.Finalize()));
  });
}

TEST_F(AscendDeviceTest, CopyIsAnAsyncDeviceToDeviceMemcpyOnTheStream) {
  RunNpuRanks(2, [](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    char host[16] = "host memory";
    EXPECT_TRUE(HasError(device.Copy(host, host + 8, 4, kDefaultStream, nullptr), StatusCode::kStateError,
                         "ascend device is not initialised: op=Copy"));
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 2), bootstrap)));
    auto heap = device.Allocate(4096, 64);
    ASSERT_TRUE(heap.ok());
    char* buffer = static_cast<char*>(heap.value());
    auto stream = device.CreateStream();
    ASSERT_TRUE(stream.ok());
    const int peer = 1 - rank;
    ASSERT_TRUE(bootstrap.Barrier().ok());

    // NPU memory outside the heap (a tensor's) into the heap, then a put of those bytes to the peer, in stream
    // order: the copy is only enqueued, and the buffer it was given stays alive until the stream is synchronized.
    auto tensor = std::make_shared<NpuBuffer>(std::vector<char>(1000, static_cast<char>('k' + rank)));
    const std::size_t synchronized = CallsOf(rank, "aclrtSynchronizeStreamWithTimeout").size();
    ASSERT_TRUE(IsOk(device.Copy(buffer, tensor->data(), 1000, stream.value(), tensor)));
    const std::vector<FakeCall> copies = CallsOf(rank, "aclrtMemcpyAsync");
    ASSERT_EQ(copies.size(), 1u);
    EXPECT_EQ(copies[0].stream, stream.value());
    EXPECT_EQ(copies[0].op, ACL_MEMCPY_DEVICE_TO_DEVICE);
    EXPECT_EQ(copies[0].address, reinterpret_cast<std::uintptr_t>(buffer));
    EXPECT_EQ(copies[0].bytes, 1000u);
    EXPECT_EQ(CallsOf(rank, "aclrtSynchronizeStreamWithTimeout").size(), synchronized);   // only enqueued
    std::weak_ptr<NpuBuffer> watched = tensor;
    tensor.reset();
    EXPECT_FALSE(watched.expired());
    ASSERT_TRUE(IsOk(device.Put(buffer + 2048, buffer, 1000, peer, stream.value(), nullptr)));
    ASSERT_TRUE(IsOk(device.Barrier(stream.value())));
    ASSERT_TRUE(IsOk(device.SynchronizeStream(stream.value())));
    EXPECT_TRUE(watched.expired());
    EXPECT_EQ(ReadNpu(buffer + 2048, 1000), std::vector<char>(1000, static_cast<char>('k' + peer)));

    // The heap into NPU memory on the default stream: synchronized (bounded) before the call returns.
    const NpuBuffer back(1000);
    ASSERT_TRUE(IsOk(device.Copy(back.data(), buffer + 2048, 1000, kDefaultStream, nullptr)));
    const std::vector<FakeCall> after = CallsOf(rank);
    EXPECT_EQ(after[after.size() - 2].name, "aclrtMemcpyAsync");
    EXPECT_EQ(after[after.size() - 2].stream, device.default_stream());
    EXPECT_EQ(after.back().name, "aclrtSynchronizeStreamWithTimeout");
    EXPECT_EQ(ReadNpu(back.data(), 1000), std::vector<char>(1000, static_cast<char>('k' + peer)));

    // Zero bytes call nothing; host memory is refused when submitted, with ACL's code; a failure keeps its code.
    const std::size_t made = CallsOf(rank, "aclrtMemcpyAsync").size();
    EXPECT_TRUE(IsOk(device.Copy(host, buffer, 0, stream.value(), nullptr)));
    EXPECT_EQ(CallsOf(rank, "aclrtMemcpyAsync").size(), made);
    EXPECT_TRUE(HasError(device.Copy(host, buffer, 16, stream.value(), nullptr), StatusCode::kInvalidArgument,
                         "arguments of aclrtMemcpyAsync must be valid for CANN, but got cann_error_code=107000 "
                         "(ACL_ERROR_RT_PARAM_INVALID) op=Copy kind=device_to_device bytes=16 dst=" +
                             Hex(reinterpret_cast<std::uintptr_t>(host))));
    EXPECT_STREQ(host, "host memory");
    FakeCann::FailNext("aclrtMemcpyAsync", ACL_ERROR_RT_INTERNAL_ERROR);
    EXPECT_TRUE(HasError(device.Copy(back.data(), buffer, 16, stream.value(), nullptr), StatusCode::kDeviceError,
                         "aclrtMemcpyAsync failed: cann_error_code=507000 (ACL_ERROR) op=Copy"));
    ASSERT_TRUE(IsOk(device.SynchronizeStream(stream.value())));
    ASSERT_TRUE(IsOk(device.DestroyStream(stream.value())));
    ASSERT_TRUE(bootstrap.Barrier().ok());
    ASSERT_TRUE(IsOk(device.Free(buffer)));
    ASSERT_TRUE(IsOk(device.Finalize()));
  });
}

TEST_F(AscendDeviceTest, CollectiveChecksWorkWithTheHeapOutOfTheHostsReach) {
  // The runtime's allocation, free and shutdown checks exchange records in the heap: on an NPU the host can only
  // copy them in and out, and every rank must still see every other rank's record.
  RunNpuRanks(3, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(runtime.Init(AscendConfig(), std::make_unique<AscendDevice>(), bootstrap)));
    const DebugSnapshot snapshot = runtime.Snapshot();
    EXPECT_TRUE(FakeCann::IsDeviceMemory(reinterpret_cast<void*>(snapshot.heap_base), snapshot.heap_size));

    auto agreed = runtime.Allocate(1024, 0, "test");
    ASSERT_TRUE(agreed.ok()) << agreed.status().ToString();
    EXPECT_TRUE(FakeCann::IsDeviceMemory(reinterpret_cast<void*>(agreed->base), 1024));
    // Rank 2 asks for another size: every rank learns it from the exchanged records.
    auto disagreed = runtime.Allocate(rank == 2 ? 512 : 256, 0, "test");
    EXPECT_TRUE(HasError(disagreed.status(), StatusCode::kMismatch, "ranks disagree on a symmetric allocation"));
    // Agreed before CANN's collective malloc (sequence 3: each allocation exchanges its request, then its result),
    // so that no rank entered CANN's barrier.
    const std::string theirs =
        rank == 2 ? "rank=0 op=Empty sequence=3 bytes=256" : "rank=2 op=Empty sequence=3 bytes=512";
    EXPECT_TRUE(Contains(disagreed.status().message(), theirs)) << disagreed.status().message();
    EXPECT_EQ(CallsOf(rank, "aclshmem_malloc").size() + CallsOf(rank, "aclshmem_align").size(), 2u);   // control, 1024

    // A live allocation refuses shutdown on every rank, naming the holders.
    EXPECT_TRUE(HasError(runtime.Shutdown(bootstrap), StatusCode::kStateError,
                         "shutdown refused: live allocations remain (free them, then close again): rank0=1 rank1=1 "
                         "rank2=1"));
    ASSERT_TRUE(IsOk(runtime.Free(agreed->id, "test")));
    ASSERT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
    EXPECT_FALSE(CallsOf(rank, "aclrtMemcpy").empty());
    // Every record crossed between heaps (NPU to NPU), never from or into host memory.
    for (const FakeCall& put : CallsOf(rank, "aclshmemx_putmem_on_stream")) EXPECT_NE(put.target_pe, rank);
    EXPECT_TRUE(CallsOf(rank, "aclshmemx_getmem_on_stream").empty());
  });
  EXPECT_EQ(FakeCann::LiveSessions(), 0u);
}

TEST_F(AscendDeviceTest, SignalsAreInt32) {
  RunNpuRanks(1, [](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 1), bootstrap)));
    auto signal = device.Allocate(8, 64);
    ASSERT_TRUE(signal.ok());
    EXPECT_TRUE(HasError(device.Signal(signal.value(), SignalWidth::k64, 1, SignalOp::kSet, 0, kDefaultStream),
                         StatusCode::kTypeError, "`signal_tensor` must be int32 on the ascend device"));
    EXPECT_TRUE(HasError(device.Signal(signal.value(), SignalWidth::k32, std::int64_t{1} << 40, SignalOp::kSet, 0,
                                       kDefaultStream),
                         StatusCode::kInvalidArgument, "`value` must fit in int32 on the ascend device, but got"));
    EXPECT_TRUE(FakeCann::CallsNamed("aclshmemx_signal_op_on_stream").empty());
    ASSERT_TRUE(IsOk(device.Finalize()));
  });
}

TEST_F(AscendDeviceTest, ChunksAtTheLimitAndZeroBytesAreValidatedNoOps) {
  RunNpuRanks(1, [](int, Bootstrap& bootstrap) {
    AscendDeviceOptions options;
    options.max_transfer_bytes = 4096;
    Runtime runtime;
    ASSERT_TRUE(IsOk(runtime.Init(AscendConfig(), std::make_unique<AscendDevice>(options), bootstrap)));
    auto buffer = runtime.Allocate(3 * 4096, 0, "test");
    ASSERT_TRUE(buffer.ok());
    auto* dst = reinterpret_cast<char*>(buffer->base);
    const std::size_t size = 2 * 4096 + 100;
    const NpuBuffer src(std::vector<char>(size, 'x'));
    FakeCann::ClearCalls();
    ASSERT_TRUE(IsOk(runtime.Put(dst, src.data(), size, size, 0, kDefaultStream, nullptr)));
    auto puts = FakeCann::CallsNamed("aclshmemx_putmem_on_stream");
    ASSERT_EQ(puts.size(), 3u);
    EXPECT_EQ(puts[0].bytes, 4096u);
    EXPECT_EQ(puts[1].bytes, 4096u);
    EXPECT_EQ(puts[2].bytes, 100u);
    EXPECT_EQ(puts[1].address, buffer->base + 4096);
    EXPECT_EQ(puts[2].address, buffer->base + 8192);
    EXPECT_EQ(ReadNpu(dst, size)[size - 1], 'x');

    FakeCann::ClearCalls();
    ASSERT_TRUE(IsOk(runtime.Put(dst, src.data(), 4096, 4096, 0, kDefaultStream, nullptr)));
    EXPECT_EQ(FakeCann::CallsNamed("aclshmemx_putmem_on_stream").size(), 1u);

    FakeCann::ClearCalls();
    ASSERT_TRUE(IsOk(runtime.Put(dst, src.data(), 0, 0, 0, kDefaultStream, nullptr)));
    ASSERT_TRUE(IsOk(runtime.Get(src.data(), dst, 0, 0, 0, kDefaultStream, nullptr)));
    EXPECT_TRUE(FakeCann::CallsNamed("aclshmemx_putmem_on_stream").empty());
    EXPECT_TRUE(FakeCann::CallsNamed("aclshmemx_getmem_on_stream").empty());
    ASSERT_TRUE(IsOk(runtime.Free(buffer->id, "test")));
    ASSERT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST_F(AscendDeviceTest, DeviceRejectsOversizedCallsAndTreatsZeroBytesAsNoOps) {
  RunNpuRanks(1, [](int rank, Bootstrap& bootstrap) {
    AscendDeviceOptions options;
    options.max_transfer_bytes = 4096;
    AscendDevice device(options);
    EXPECT_EQ(AscendDevice().max_transfer_bytes(), std::size_t{1} << 31);
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 1), bootstrap)));
    auto buffer = device.Allocate(8192, 64);
    ASSERT_TRUE(buffer.ok());
    std::vector<char> src(8192);
    EXPECT_TRUE(HasError(device.Put(buffer.value(), src.data(), 4097, 0, kDefaultStream, nullptr),
                         StatusCode::kInvalidArgument, "`bytes` of one device call must be at most 4096, but got 4097"));
    EXPECT_TRUE(IsOk(device.Put(buffer.value(), src.data(), 0, 0, kDefaultStream, nullptr)));
    EXPECT_TRUE(IsOk(device.Get(src.data(), buffer.value(), 0, 0, kDefaultStream, nullptr)));
    EXPECT_TRUE(HasError(device.Put(buffer.value(), src.data(), 0, 1, kDefaultStream, nullptr),
                         StatusCode::kInvalidArgument, "`pe` must be in [0, 1), but got 1"));
    EXPECT_TRUE(FakeCann::CallsNamed("aclshmemx_putmem_on_stream").empty());
    EXPECT_TRUE(FakeCann::CallsNamed("aclshmemx_getmem_on_stream").empty());
    ASSERT_TRUE(IsOk(device.Finalize()));
  });
}

TEST_F(AscendDeviceTest, StreamWaitStreamOrdersThroughAnEvent) {
  RunNpuRanks(1, [](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 1), bootstrap)));
    auto signal = device.Allocate(4, 64);
    auto data = device.Allocate(64, 64);
    ASSERT_TRUE(signal.ok() && data.ok());
    const std::vector<char> zeros(64, '\0');
    WriteNpu(signal.value(), zeros.data(), 4);
    WriteNpu(data.value(), zeros.data(), 64);
    auto waited = device.CreateStream();
    auto waiter = device.CreateStream();
    ASSERT_TRUE(waited.ok() && waiter.ok());
    ASSERT_TRUE(IsOk(device.WaitSignal(signal.value(), SignalWidth::k32, CompareOp::kEq, 1, waited.value())));
    ASSERT_TRUE(IsOk(device.StreamWaitStream(waiter.value(), waited.value())));
    EXPECT_EQ(CallsOf(rank, "aclrtRecordEvent").back().stream, waited.value());
    EXPECT_EQ(CallsOf(rank, "aclrtStreamWaitEvent").back().stream, waiter.value());
    const NpuBuffer text(std::vector<char>{'o', 'r', 'd', 'e', 'r', 'e', 'd', '\0'});
    auto keep = std::make_shared<int>(1);
    std::weak_ptr<int> kept = keep;
    ASSERT_TRUE(IsOk(device.Put(data.value(), text.data(), 8, 0, waiter.value(), std::move(keep))));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(ReadNpu(data.value(), 1)[0], '\0');   // still behind the wait
    EXPECT_FALSE(kept.expired());                            // its buffers are kept until the stream syncs
    ASSERT_TRUE(IsOk(device.Signal(signal.value(), SignalWidth::k32, 1, SignalOp::kSet, 0, kDefaultStream)));
    ASSERT_TRUE(IsOk(device.SynchronizeStream(waiter.value())));
    EXPECT_STREQ(ReadNpu(data.value(), 8).data(), "ordered");
    EXPECT_TRUE(kept.expired());
    ASSERT_TRUE(IsOk(device.Quiesce()));
    EXPECT_EQ(FakeCann::LiveEvents(), 0u);   // destroyed once every stream drained
    ASSERT_TRUE(IsOk(device.Finalize()));
  });
  EXPECT_EQ(FakeCann::LiveStreams(), 0u);
}

TEST_F(AscendDeviceTest, CallersStreamIsUsedAsIsButNeverDestroyed) {
  RunNpuRanks(1, [](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 1), bootstrap)));
    aclrtStream current = nullptr;   // what torch_npu's current stream would be
    ASSERT_EQ(aclrtCreateStream(&current), ACL_SUCCESS);
    const auto handle = reinterpret_cast<StreamHandle>(current);
    ASSERT_TRUE(IsOk(device.Barrier(handle)));
    ASSERT_FALSE(CallsOf(rank, "aclshmemx_barrier_on_stream").empty());
    EXPECT_EQ(CallsOf(rank, "aclshmemx_barrier_on_stream").back().stream, handle);
    FakeCann::ClearCalls();
    ASSERT_TRUE(IsOk(device.Quiesce()));
    EXPECT_FALSE(FakeCann::CallsNamed("aclrtSynchronizeStreamWithTimeout").empty());
    EXPECT_TRUE(HasError(device.DestroyStream(handle), StatusCode::kInvalidArgument,
                         "`stream` must be a live stream of the ascend device"));
    ASSERT_TRUE(IsOk(device.Finalize()));
    EXPECT_EQ(aclrtDestroyStream(current), ACL_SUCCESS);   // still the caller's
  });
}

TEST_F(AscendDeviceTest, TimeoutsAndStreamFailuresKeepTheCannCode) {
  RunNpuRanks(1, [](int, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(runtime.Init(AscendConfig(0.2), std::make_unique<AscendDevice>(), bootstrap)));
    auto signal = runtime.Allocate(4, 0, "test");
    ASSERT_TRUE(signal.ok());
    auto stream = runtime.CreateStream();
    ASSERT_TRUE(stream.ok());
    const NpuBuffer src(8);
    FakeCann::FailNext("aclshmemx_putmem_on_stream", ACL_ERROR_RT_AICORE_EXCEPTION);
    ASSERT_TRUE(IsOk(runtime.Put(reinterpret_cast<void*>(signal->base), src.data(), 4, 4, 0, stream.value(),
                                 nullptr)));
    EXPECT_TRUE(HasError(runtime.SynchronizeStream(stream.value()), StatusCode::kDeviceError,
                         "aclrtSynchronizeStreamWithTimeout failed: cann_error_code=507015 (ACL_ERROR)"));
    EXPECT_TRUE(Contains(runtime.Snapshot().latest_failure, "cann_error_code=507015"));

    const auto* address = reinterpret_cast<const void*>(signal->base);
    EXPECT_TRUE(HasError(runtime.WaitSignal(address, SignalWidth::k32, CompareOp::kEq, 7, kDefaultStream),
                         StatusCode::kTimeout,
                         "aclrtSynchronizeStreamWithTimeout failed: cann_error_code=507046 "
                         "(ACL_ERROR_RT_STREAM_SYNC_TIMEOUT) op=WaitSignal"));
    const std::string latest = runtime.Snapshot().latest_failure;
    EXPECT_TRUE(Contains(latest, "cann_error_code=507046")) << latest;
    EXPECT_TRUE(Contains(latest, "cmp=eq expected=7 timeout_sec=0.2")) << latest;
    // Release the stuck wait so that the lifecycle can end.
    ASSERT_TRUE(IsOk(runtime.Signal(address, SignalWidth::k32, 7, SignalOp::kSet, 0, stream.value())));
    ASSERT_TRUE(IsOk(runtime.SynchronizeStream(stream.value())));
    ASSERT_TRUE(IsOk(runtime.DestroyStream(stream.value())));
    ASSERT_TRUE(IsOk(runtime.Free(signal->id, "test")));
    ASSERT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

// ---- CANN SHMEM v1.5.1 as it really behaves (third_party/shmem_patches/README.md) ----

template <typename T>
std::vector<T> ReadValues(const void* npu, std::size_t count) {
  std::vector<T> values(count);
  EXPECT_EQ(aclrtMemcpy(values.data(), count * sizeof(T), npu, count * sizeof(T), ACL_MEMCPY_DEVICE_TO_HOST),
            ACL_SUCCESS);
  return values;
}

template <typename T>
void WriteValues(void* npu, const std::vector<T>& values) {
  WriteNpu(npu, values.data(), values.size() * sizeof(T));
}

TEST_F(AscendDeviceTest, HeapHoldsCannsOwnStructuresAndUserMemoryMayEndPastLocalMemSize) {
  RunNpuRanks(1, [](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 1, 2 * kMiB), bootstrap)));
    EXPECT_EQ(device.heap_size(), 2 * kMiB + 6 * kMiB);
    // Init took its signal word (512 B), every team's sync pool (5 MiB) and counters (128 KiB) first.
    constexpr std::size_t kCannOwn = 512 + SYNC_POOL_SIZE + SYNC_COUNTERS_SIZE;
    static_assert(kCannOwn == 5374464, "about 5.13 MiB");
    auto first = device.Allocate(64, 16);
    ASSERT_TRUE(first.ok());
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(first.value()) - device.heap_base(), kCannOwn);
    // What is left runs past local_mem_size: the in-heap checks use the whole mapped range.
    const std::size_t rest = device.heap_size() - kCannOwn - 64;
    auto last = device.Allocate(rest, 16);
    ASSERT_TRUE(last.ok()) << last.status().ToString();
    char* end = static_cast<char*>(last.value()) + rest;
    EXPECT_GT(reinterpret_cast<std::uintptr_t>(end) - device.heap_base(), device.local_mem_size());
    const int value = 42;
    ASSERT_TRUE(IsOk(device.CopyToHeap(end - sizeof(value), &value, sizeof(value))));
    EXPECT_TRUE(HasError(device.Allocate(16, 16).status(), StatusCode::kOutOfMemory,
                         "local_mem_size=2097152 heap_size=8388608 (the symmetric heap has no gap that large; CANN's "
                         "own structures take about 5.13 MiB of it)"));
    ASSERT_TRUE(IsOk(device.Finalize()));
  });
}

TEST_F(AscendDeviceTest, ARankThatRefusesNeverLeavesItsPeerInsideCannsMalloc) {
  // CANN's own barrier would hold rank 0 for its full timeout: the runtime's bounded exchange must end it first.
  FakeCann::SetCannDefaultTimeout(std::chrono::seconds(30));
  RunNpuRanks(2, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(runtime.Init(AscendConfig(0.3), std::make_unique<AscendDevice>(), bootstrap)));
    const std::size_t mallocs = CallsOf(rank, "aclshmem_malloc").size() + CallsOf(rank, "aclshmem_align").size();
    const auto started = std::chrono::steady_clock::now();
    // Rank 1 refuses before any exchange (an alignment it alone gets wrong); rank 0 asks correctly.
    auto allocation = runtime.Allocate(256, rank == 1 ? 3 : 0, "test");
    ASSERT_FALSE(allocation.ok());
    if (rank == 0) {
      EXPECT_TRUE(HasError(allocation.status(), StatusCode::kTimeout,
                           "collective check did not complete on every rank: rank=0 op=Empty sequence=1 bytes=256"));
      EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10));
    } else {
      EXPECT_TRUE(HasError(allocation.status(), StatusCode::kInvalidArgument,
                           "`alignment` must be a power of two, but got 3"));
    }
    // Rank 0 never entered CANN's malloc.
    EXPECT_EQ(CallsOf(rank, "aclshmem_malloc").size() + CallsOf(rank, "aclshmem_align").size(), mallocs);
    ASSERT_TRUE(bootstrap.Barrier().ok());
    // Rank 1 arrives at the device barrier rank 0 timed out in, so that rank 0's stream drains and both finalize.
    if (rank == 1) {
      EXPECT_TRUE(IsOk(runtime.Barrier(kDefaultStream)));
    }
    ASSERT_TRUE(bootstrap.Barrier().ok());
  });
  EXPECT_EQ(FakeCann::Hangs(), 0u);
  EXPECT_EQ(FakeCann::LiveSessions(), 0u);
}

TEST_F(AscendDeviceTest, ATimedOutWaitIsReleasedAndDrainedSoNothingHangs) {
  FakeCann::SetHangLimit(std::chrono::seconds(5));
  RunNpuRanks(1, [](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 1, 2 * kMiB, 0.2), bootstrap)));
    auto signal = device.Allocate(4, 16);
    ASSERT_TRUE(signal.ok());
    WriteValues<std::int32_t>(signal.value(), {0});
    auto stream = device.CreateStream();
    ASSERT_TRUE(stream.ok());
    ASSERT_TRUE(IsOk(device.WaitSignal(signal.value(), SignalWidth::k32, CompareOp::kGt, 5, stream.value())));
    EXPECT_TRUE(HasError(device.SynchronizeStream(stream.value()), StatusCode::kTimeout,
                         "(ACL_ERROR_RT_STREAM_SYNC_TIMEOUT) op=SynchronizeStream"));
    // The device ended the spinning wait with the first value that satisfies it, then drained the stream.
    EXPECT_EQ(ReadValues<std::int32_t>(signal.value(), 1)[0], 6);
    EXPECT_TRUE(IsOk(device.SynchronizeStream(stream.value())));
    // The default stream: the same release inside the call.
    WriteValues<std::int32_t>(signal.value(), {0});
    EXPECT_TRUE(HasError(device.WaitSignal(signal.value(), SignalWidth::k32, CompareOp::kNe, 0, kDefaultStream),
                         StatusCode::kTimeout, "released the stream's waits by writing each awaited value"));
    EXPECT_EQ(ReadValues<std::int32_t>(signal.value(), 1)[0], 1);
    ASSERT_TRUE(IsOk(device.DestroyStream(stream.value())));
    ASSERT_TRUE(IsOk(device.Free(signal.value())));
    ASSERT_TRUE(IsOk(device.Finalize()));
  });
  EXPECT_EQ(FakeCann::Hangs(), 0u);
  EXPECT_EQ(FakeCann::LiveStreams(), 0u);
}

TEST_F(AscendDeviceTest, AWaitThatCannotBeReleasedLeavesItsStreamAloneAndFinalizeRefusesToHang) {
  FakeCann::SetHangLimit(std::chrono::seconds(5));
  RunNpuRanks(1, [](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 1, 2 * kMiB, 0.2), bootstrap)));
    auto signal = device.Allocate(4, 16);
    ASSERT_TRUE(signal.ok());
    WriteValues<std::int32_t>(signal.value(), {0});
    auto stream = device.CreateStream();
    ASSERT_TRUE(stream.ok());
    // No int32 is greater than INT32_MAX: nothing can release this wait.
    ASSERT_TRUE(IsOk(device.WaitSignal(signal.value(), SignalWidth::k32, CompareOp::kGt,
                                       std::numeric_limits<std::int32_t>::max(), stream.value())));
    EXPECT_TRUE(HasError(device.SynchronizeStream(stream.value()), StatusCode::kTimeout,
                         "the stream could not be drained: it is never destroyed"));
    EXPECT_TRUE(HasError(device.DestroyStream(stream.value()), StatusCode::kStateError,
                         "stream still runs a kernel that never ends and cannot be destroyed"));
    EXPECT_TRUE(HasError(device.Finalize(), StatusCode::kStateError,
                         "so CANN SHMEM cannot be finalized in this process: stuck_streams=1"));
    // Only the test can end the fake kernel: the value it waits for does not exist, so the stream is cancelled.
    FakeCann::Reset();
  });
  EXPECT_EQ(FakeCann::Hangs(), 0u);
}

TEST_F(AscendDeviceTest, AnyFailedCannInitIsFinalizedWhateverStateItLeft) {
  struct Case {
    const char* stage;     // the control barrier of CANN's init that fails
    StatusCode code;       // what CANN's answer maps to
    const char* answer;
    const char* left;      // aclshmemx_init_status after the failure
  };
  for (const Case& c : {Case{"init_device_state", StatusCode::kDeviceError, "cann_error_code=-3 (ACLSHMEM_SMEM_ERROR)",
                             "NOT_INITIALIZED"},
                        Case{"aclshmemi_signal_init", StatusCode::kDeviceError,
                             "cann_error_code=-4 (ACLSHMEM_INNER_ERROR)", "SHM_CREATED"},
                        Case{"aclshmemx_init_attr", StatusCode::kDeviceError, "cann_error_code=-3 (ACLSHMEM_SMEM_ERROR)",
                             "IS_INITIALIZED"}}) {
    SCOPED_TRACE(c.stage);
    FakeCann::Reset();
    RunNpuRanks(1, [&c](int rank, Bootstrap& bootstrap) {
      FakeCann::FailNext(std::string(fakes::kControlBarrier) + ":" + c.stage, ACLSHMEM_SMEM_ERROR);
      AscendDevice device;
      EXPECT_TRUE(HasError(device.Init(Args(rank, 1), bootstrap), c.code,
                           std::string("aclshmemx_init_attr failed: ") + c.answer));
      EXPECT_TRUE(IsOk(device.Init(Args(rank, 1), bootstrap))) << "a clean retry";
      ASSERT_TRUE(IsOk(device.Finalize()));
    });
    // Every failure was finalized: CANN's stream and bootstrap were released.
    EXPECT_EQ(FakeCann::CallsNamed("aclshmem_finalize").size(), 2u);
    EXPECT_EQ(FakeCann::LiveStreams(), 0u);
    EXPECT_EQ(FakeCann::LiveSessions(), 0u);
  }
  // The state CANN left is reported, and ACLSHMEM_SMEM_ERROR explained.
  FakeCann::Reset();
  RunNpuRanks(1, [](int rank, Bootstrap& bootstrap) {
    FakeCann::FailNext(std::string(fakes::kControlBarrier) + ":init_device_state", ACLSHMEM_SMEM_ERROR);
    AscendDevice device;
    EXPECT_TRUE(HasError(device.Init(Args(rank, 1), bootstrap), StatusCode::kDeviceError,
                         "(CANN left init_status=NOT_INITIALIZED behind, released by aclshmem_finalize; "
                         "ACLSHMEM_SMEM_ERROR is how v1.5.1 reports a control barrier that failed (a peer missing, or "
                         "later than CANN's 120 s) or its memory layer failing)"));
    FakeCann::FailNext(std::string(fakes::kControlBarrier) + ":aclshmemi_signal_init", ACLSHMEM_SMEM_ERROR);
    EXPECT_TRUE(HasError(device.Init(Args(rank, 1), bootstrap), StatusCode::kDeviceError,
                         "(CANN left init_status=SHM_CREATED behind, released by aclshmem_finalize)"));
    FakeCann::FailNext(std::string(fakes::kControlBarrier) + ":aclshmemx_init_attr", ACLSHMEM_SMEM_ERROR);
    EXPECT_TRUE(HasError(device.Init(Args(rank, 1), bootstrap), StatusCode::kDeviceError,
                         "(CANN left init_status=IS_INITIALIZED behind, released by aclshmem_finalize;"));

    // When finalize cannot release it either, the device says CANN is unusable in this process.
    FakeCann::FailNext(std::string(fakes::kControlBarrier) + ":aclshmemi_signal_init", ACLSHMEM_SMEM_ERROR);
    FakeCann::FailNext("aclshmem_finalize", ACLSHMEM_INNER_ERROR);
    AscendDevice stuck;
    EXPECT_TRUE(HasError(stuck.Init(Args(rank, 1), bootstrap), StatusCode::kDeviceError,
                         "(CANN left init_status=SHM_CREATED behind, which aclshmem_finalize did not release: "
                         "init_status=SHM_CREATED; CANN SHMEM cannot be initialised again in this process"));
    EXPECT_TRUE(HasError(stuck.Init(Args(rank, 1), bootstrap), StatusCode::kStateError, "cannot be used again"));
    EXPECT_EQ(aclshmem_finalize(), ACLSHMEM_SUCCESS);   // clean the fake's PE
  });
}

TEST_F(AscendDeviceTest, AMissingPeerFailsCannsFirstBarrierAndEveryRankFinalizes) {
  FakeCann::SetCannDefaultTimeout(std::chrono::milliseconds(300));
  RunNpuRanks(2, [](int rank, Bootstrap& bootstrap) {
    // Rank 1's CANN init fails before any barrier; rank 0 waits in init_device_state's and gets ACLSHMEM_SMEM_ERROR
    // with its status still NOT_INITIALIZED: the device finalizes anyway, which releases CANN's stream.
    if (rank == 1) FakeCann::FailNext("aclshmemx_init_attr", ACLSHMEM_BOOTSTRAP_ERROR);
    AscendDevice device;
    const Status failed = device.Init(Args(rank, 2), bootstrap);
    EXPECT_TRUE(HasError(failed, StatusCode::kDeviceError, "initialising CANN SHMEM failed"));
    if (rank == 0) {
      EXPECT_TRUE(Contains(failed.message(), "cann_error_code=-3 (ACLSHMEM_SMEM_ERROR)")) << failed.message();
      EXPECT_TRUE(Contains(failed.message(), "CANN left init_status=NOT_INITIALIZED behind, released by "
                                             "aclshmem_finalize")) << failed.message();
    }
    EXPECT_EQ(CallsOf(rank, "aclshmem_finalize").size(), 1u);
    EXPECT_EQ(aclshmemx_init_status(), ACLSHMEM_STATUS_NOT_INITIALIZED);
  });
  EXPECT_EQ(FakeCann::LiveStreams(), 0u);
  EXPECT_EQ(FakeCann::LiveSessions(), 0u);
}

TEST_F(AscendDeviceTest, RanksOnSeveralHostsAddRoceWhichCarriesPutGetAndSetButNotAddOrInPlaceAccess) {
  RunNpuRanks(2, [](int rank, Bootstrap& bootstrap) {
    const std::string host = "host" + std::to_string(rank);
    FakeCann::SetNode(host);
    AscendDeviceOptions options;
    options.node_name = host;
    AscendDevice device(options);
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 2), bootstrap)));
    EXPECT_TRUE(device.uses_roce());
    EXPECT_EQ(FakeCann::LastInit()->attr.option_attr.data_op_engine_type,
              ACLSHMEM_DATA_OP_MTE | ACLSHMEM_DATA_OP_ROCE);
    EXPECT_EQ(device.nodes(), (std::vector<int>{0, 1}));   // two hosts: two nodes
    EXPECT_TRUE(device.reaches_remotely(1 - rank));
    EXPECT_FALSE(device.reaches_remotely(rank));
    auto buffer = device.Allocate(8, 16);
    ASSERT_TRUE(buffer.ok());
    const NpuBuffer src(std::vector<char>(8, static_cast<char>('a' + rank)));
    ASSERT_TRUE(IsOk(device.Put(buffer.value(), src.data(), 8, 1 - rank, kDefaultStream, nullptr)));
    ASSERT_TRUE(IsOk(device.Signal(buffer.value(), SignalWidth::k32, 7, SignalOp::kSet, 1 - rank, kDefaultStream)));
    ASSERT_TRUE(bootstrap.Barrier().ok());
    const std::vector<char> got = ReadNpu(buffer.value(), 8);
    EXPECT_EQ(std::vector<char>(got.begin() + 4, got.end()), std::vector<char>(4, static_cast<char>('a' + 1 - rank)));
    EXPECT_EQ(ReadValues<std::int32_t>(buffer.value(), 1)[0], 7);
    const std::string peer = std::to_string(1 - rank);
    EXPECT_TRUE(HasError(device.Signal(buffer.value(), SignalWidth::k32, 1, SignalOp::kAdd, 1 - rank, kDefaultStream),
                         StatusCode::kStateError,
                         "pe lies outside this rank's node (signal add is an MTE atomic at aclshmem_ptr's address, "
                         "which reaches this node only, RoCE or not): op=Signal(add) pe=" + peer + " pe_node=" + peer + " (host=host" +
                         peer + " hccs_group=0) rank=" + std::to_string(rank)));
    EXPECT_TRUE(HasError(device.PeerAddress(buffer.value(), 1 - rank).status(), StatusCode::kStateError,
                         "pe lies outside this rank's node (this NPU maps the heaps of its own node only (MTE: the "
                         "same host and HCCS group), and a kernel touching another node's address faults): "
                         "op=PeerAddress pe=" + peer));
    // The node barrier is each host's own: no CANN barrier spans the hosts (it would fault).
    ASSERT_TRUE(IsOk(device.Barrier(kDefaultStream)));
    EXPECT_EQ(CallsOf(rank, "aclshmemx_barrier_all_on_stream").size(), 0u);
    ASSERT_TRUE(bootstrap.Barrier().ok());
    ASSERT_TRUE(IsOk(device.Finalize()));
  });
}

TEST_F(AscendDeviceTest, SixteenNpusOnOneHostAreTwoNodesAndNothingOneSidedCrossesThem) {
  RunNpuRanks(16, [](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 16), bootstrap)));
    std::vector<int> expected(16, 0);
    for (int pe = 8; pe < 16; ++pe) expected[static_cast<std::size_t>(pe)] = 8;
    EXPECT_EQ(device.nodes(), expected);
    EXPECT_FALSE(device.uses_roce());   // one host: RoCE stays off
    const int across = rank ^ 8;
    EXPECT_FALSE(device.reaches_remotely(across));
    auto buffer = device.Allocate(64, 64);
    ASSERT_TRUE(buffer.ok());
    const NpuBuffer src(std::vector<char>(64, 'x'));
    const std::string facts = "op=Put pe=" + std::to_string(across) + " pe_node=" + std::to_string(across / 8 * 8) +
                              " (host=";
    EXPECT_TRUE(HasError(device.Put(buffer.value(), src.data(), 64, across, kDefaultStream, nullptr),
                         StatusCode::kStateError,
                         "pe lies outside this rank's node (this NPU reaches other nodes over RoCE only, which is on "
                         "only when the ranks span several hosts; without it put, get and signal do nothing on the "
                         "NPU): " + facts));
    EXPECT_TRUE(HasError(device.Get(src.data(), buffer.value(), 64, across, kDefaultStream, nullptr),
                         StatusCode::kStateError, "op=Get pe=" + std::to_string(across)));
    EXPECT_TRUE(HasError(device.Signal(buffer.value(), SignalWidth::k32, 1, SignalOp::kSet, across, kDefaultStream),
                         StatusCode::kStateError, "op=Signal(set) pe=" + std::to_string(across)));
    EXPECT_TRUE(HasError(device.Signal(buffer.value(), SignalWidth::k32, 1, SignalOp::kAdd, across, kDefaultStream),
                         StatusCode::kStateError,
                         "(signal add is an MTE atomic at aclshmem_ptr's address, which reaches this node only, RoCE or "
                         "not): op=Signal(add) pe=" + std::to_string(across)));
    EXPECT_TRUE(HasError(device.PeerAddress(buffer.value(), across).status(), StatusCode::kStateError,
                         "hccs_group=" + std::to_string(across / 8) + ") rank=" + std::to_string(rank) + " node=" +
                             std::to_string(rank / 8 * 8) + " (host="));
    EXPECT_TRUE(HasError(device.Reduce(src.data(), buffer.value(), 16, DataType::kFloat32, ReduceOp::kSum,
                                       {rank, across}, kDefaultStream, nullptr),
                         StatusCode::kStateError, "op=Reduce pe=" + std::to_string(across)));
    // Inside the node everything works, and the barrier is the node's CANN team.
    const int beside = rank ^ 1;
    ASSERT_TRUE(IsOk(device.Put(buffer.value(), src.data(), 64, beside, kDefaultStream, nullptr)));
    EXPECT_NE(device.PeerAddress(buffer.value(), beside).value(), nullptr);
    ASSERT_TRUE(IsOk(device.Barrier(kDefaultStream)));
    const std::vector<FakeCall> barriers = CallsOf(rank, "aclshmemx_barrier_on_stream");
    ASSERT_FALSE(barriers.empty());
    EXPECT_NE(barriers.back().value, ACLSHMEM_TEAM_WORLD);
    const FakeCall split = CallsOf(rank, "aclshmem_team_split_strided").back();
    EXPECT_EQ(split.target_pe, rank / 8 * 8);   // pe_start
    EXPECT_EQ(split.value, 1);                  // pe_stride
    EXPECT_EQ(split.bytes, 8u);                 // pe_size
    ASSERT_TRUE(bootstrap.Barrier().ok());
    ASSERT_TRUE(IsOk(device.Finalize()));
  });
}

TEST_F(AscendDeviceTest, TheNodesFollowTheLogicalNpuIdsAndSpanStridedTeams) {
  // ASCEND_RT_VISIBLE_DEVICES=0,8,1,9,...: even ranks are logical 0-7, odd ranks logical 8-15.
  std::string interleaved;
  for (int i = 0; i < 8; ++i) interleaved += std::to_string(i) + "," + std::to_string(i + 8) + (i < 7 ? "," : "");
  ASSERT_EQ(setenv("ASCEND_RT_VISIBLE_DEVICES", interleaved.c_str(), 1), 0);
  RunNpuRanks(4, [](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 4), bootstrap)));
    EXPECT_EQ(device.logical_device_id(), rank / 2 + (rank % 2) * 8);
    EXPECT_EQ(device.nodes(), (std::vector<int>{0, 1, 0, 1}));
    const FakeCall split = CallsOf(rank, "aclshmem_team_split_strided").back();
    EXPECT_EQ(split.target_pe, rank % 2);
    EXPECT_EQ(split.value, 2);
    ASSERT_TRUE(IsOk(device.Barrier(kDefaultStream)));
    ASSERT_TRUE(bootstrap.Barrier().ok());
    ASSERT_TRUE(IsOk(device.Finalize()));
  });
  // A list that does not name the device's logical NPU is refused before CANN is touched.
  ASSERT_EQ(setenv("ASCEND_RT_VISIBLE_DEVICES", "0,x", 1), 0);
  RunNpuRanks(2, [](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    EXPECT_TRUE(HasError(device.Init(Args(rank, 2), bootstrap), StatusCode::kInvalidArgument,
                         "preparing CANN SHMEM failed: rank=1 (`ASCEND_RT_VISIBLE_DEVICES` must list the logical NPU "
                         "of device 1 as a number, but got \"0,x\")"));
  });
  ASSERT_EQ(unsetenv("ASCEND_RT_VISIBLE_DEVICES"), 0);
  // On another SoC the groups do not apply: one host is one node.
  FakeCann::SetSocName("Ascend910_9391");
  RunNpuRanks(16, [](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 16), bootstrap)));
    EXPECT_EQ(device.nodes(), std::vector<int>(16, 0));
    ASSERT_TRUE(bootstrap.Barrier().ok());
    ASSERT_TRUE(IsOk(device.Finalize()));
  });
}

TEST_F(AscendDeviceTest, TheRuntimeLetsPutGetAndSetReachOtherNodesOnlyWhereTheDeviceDoes) {
  RunNpuRanks(2, [](int rank, Bootstrap& bootstrap) {
    const std::string host = "host" + std::to_string(rank);
    FakeCann::SetNode(host);
    AscendDeviceOptions options;
    options.node_name = host;
    Runtime runtime;
    ASSERT_TRUE(IsOk(runtime.Init(AscendConfig(), std::make_unique<AscendDevice>(options), bootstrap)));
    auto allocation = runtime.Allocate(64, 64, "test");
    ASSERT_TRUE(allocation.ok());
    void* base = reinterpret_cast<void*>(allocation->base);
    const NpuBuffer src(std::vector<char>(64, 'r'));
    const int peer = 1 - rank;
    EXPECT_TRUE(IsOk(runtime.Put(base, src.data(), 64, 64, peer, kDefaultStream, nullptr)));
    EXPECT_TRUE(IsOk(runtime.Get(src.data(), base, 64, 64, peer, kDefaultStream, nullptr)));
    EXPECT_TRUE(IsOk(runtime.Signal(base, SignalWidth::k32, 1, SignalOp::kSet, peer, kDefaultStream)));
    EXPECT_TRUE(HasError(runtime.Signal(base, SignalWidth::k32, 1, SignalOp::kAdd, peer, kDefaultStream),
                         StatusCode::kStateError,
                         "pe lies on another node (the ascend device reaches other nodes for put, get and signal set "
                         "only: signal add and in-place peer access need mapped memory (MTE)): op=signal pe=" +
                             std::to_string(peer) + " pe_node=" + std::to_string(peer) + " rank=" +
                             std::to_string(rank) + " node=" + std::to_string(rank)));
    EXPECT_TRUE(HasError(runtime.PeerAddress(base, 64, peer, "tensor").status(), StatusCode::kStateError,
                         "op=peer_tensor pe=" + std::to_string(peer)));
    ASSERT_TRUE(bootstrap.Barrier().ok());
    ASSERT_TRUE(IsOk(runtime.Free(allocation->id, "test")));
    ASSERT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST_F(AscendDeviceTest, UnknownSignalAndCompareOpsAreRefusedBeforeTheKernelIgnoresThem) {
  RunNpuRanks(1, [](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 1), bootstrap)));
    auto signal = device.Allocate(4, 16);
    ASSERT_TRUE(signal.ok());
    FakeCann::ClearCalls();
    EXPECT_TRUE(HasError(device.Signal(signal.value(), SignalWidth::k32, 1, static_cast<SignalOp>(7), 0,
                                       kDefaultStream),
                         StatusCode::kInvalidArgument, "`op` must be set or add, but got 7"));
    EXPECT_TRUE(HasError(device.WaitSignal(signal.value(), SignalWidth::k32, static_cast<CompareOp>(9), 1,
                                           kDefaultStream),
                         StatusCode::kInvalidArgument, "`cmp` must be eq, ne, gt, ge, lt or le, but got 9"));
    EXPECT_TRUE(FakeCann::CallsNamed("aclshmemx_signal_op_on_stream").empty());
    EXPECT_TRUE(FakeCann::CallsNamed("aclshmemx_signal_wait_until_on_stream").empty());
    ASSERT_TRUE(IsOk(device.Finalize()));
  });
}

TEST_F(AscendDeviceTest, NothingSynchronizesOrCopiesBlockingWhileTheCallersStreamIsCaptured) {
  RunNpuRanks(1, [](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 1), bootstrap)));
    auto buffer = device.Allocate(64, 64);
    ASSERT_TRUE(buffer.ok());
    aclrtStream captured = nullptr;   // torch_npu's current stream under NPUGraph capture
    ASSERT_EQ(aclrtCreateStream(&captured), ACL_SUCCESS);
    const auto handle = reinterpret_cast<StreamHandle>(captured);
    const NpuBuffer src(std::vector<char>(64, 'g'));
    ASSERT_EQ(aclmdlRICaptureBegin(captured, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL), ACL_SUCCESS);
    // Enqueueing is what a capture records.
    ASSERT_TRUE(IsOk(device.Put(buffer.value(), src.data(), 64, rank, handle, nullptr)));
    const std::string stream = Hex(handle);
    EXPECT_TRUE(HasError(device.SynchronizeStream(handle), StatusCode::kStateError,
                         "SynchronizeStream cannot run while stream " + stream + " is being captured "
                         "(aclmdlRICaptureBegin): it would synchronize the stream, which a graph capture does not "
                         "allow (the capture would fail): capture_status=active"));
    int host = 0;
    const std::size_t copies = FakeCann::CallsNamed("aclrtMemcpy").size();
    EXPECT_TRUE(HasError(device.CopyToHeap(buffer.value(), &host, sizeof(host)), StatusCode::kStateError,
                         "CopyToHeap cannot run while stream " + stream + " is being captured (aclmdlRICaptureBegin): "
                         "it would run a blocking aclrtMemcpy"));
    EXPECT_TRUE(HasError(device.CopyFromHeap(&host, buffer.value(), sizeof(host)), StatusCode::kStateError,
                         "CopyFromHeap cannot run while stream " + stream));
    EXPECT_TRUE(HasError(device.Quiesce(), StatusCode::kStateError, "Quiesce cannot run while stream " + stream));
    EXPECT_EQ(FakeCann::CallsNamed("aclrtMemcpy").size(), copies);   // refused before ACL saw them
    // The capture was never invalidated: it ends well, and its replay does the put.
    aclmdlRI model = nullptr;
    ASSERT_EQ(aclmdlRICaptureEnd(captured, &model), ACL_SUCCESS);
    EXPECT_EQ(ReadNpu(buffer.value(), 64), std::vector<char>(64, '\0'));
    ASSERT_EQ(aclmdlRIExecuteAsync(model, captured), ACL_SUCCESS);
    ASSERT_TRUE(IsOk(device.SynchronizeStream(handle)));
    EXPECT_EQ(ReadNpu(buffer.value(), 64), std::vector<char>(64, 'g'));
    ASSERT_EQ(aclmdlRIDestroy(model), ACL_SUCCESS);
    ASSERT_TRUE(IsOk(device.Finalize()));
    ASSERT_EQ(aclrtDestroyStream(captured), ACL_SUCCESS);
  });
}

TEST_F(AscendDeviceTest, UniqueIdFailuresNameTheInterfaceVariablesAndTheirForm) {
  // SHMEM_UID_SOCK_IFNAME is a name prefix that needs its family (store_net_utils.h:237-260, 352): without the colon
  // CANN finds nothing; with it a prefix is enough.
  for (const char* bad : {"bogus0:inet4", "eth0"}) {
    ASSERT_EQ(setenv("SHMEM_UID_SOCK_IFNAME", bad, 1), 0);
    RunNpuRanks(2, [bad](int rank, Bootstrap& bootstrap) {
      AscendDevice device;
      EXPECT_TRUE(HasError(device.Init(Args(rank, 2), bootstrap), StatusCode::kInvalidArgument,
                           std::string("`SHMEM_UID_SESSION_ID` or `SHMEM_UID_SOCK_IFNAME` must let CANN find an "
                                       "address of rank 0's host (ip:port, or an interface-name prefix with its family "
                                       "after a colon, e.g. eth0:inet4; with neither, CANN takes the first up, running, "
                                       "non-loopback, non-virtual interface), but got SHMEM_UID_SESSION_ID=unset "
                                       "SHMEM_UID_SOCK_IFNAME=") + bad + " (aclshmemx_get_uniqueid failed on rank 0: "
                                       "cann_error_code=-1 (ACLSHMEM_INVALID_PARAM))"));
    });
  }
  ASSERT_EQ(setenv("SHMEM_UID_SOCK_IFNAME", "eth:inet4", 1), 0);
  RunNpuRanks(2, [](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 2), bootstrap)));
    if (rank == 0) {
      EXPECT_EQ(FakeCann::LastInit()->uid_sock_ifname, "eth:inet4");   // passed through to CANN
    }
    ASSERT_TRUE(bootstrap.Barrier().ok());
    ASSERT_TRUE(IsOk(device.Finalize()));
  });
  ASSERT_EQ(unsetenv("SHMEM_UID_SOCK_IFNAME"), 0);
  // Other failures keep CANN's code and name both variables.
  RunNpuRanks(2, [](int rank, Bootstrap& bootstrap) {
    if (rank == 0) FakeCann::FailNext("aclshmemx_get_uniqueid", ACLSHMEM_BOOTSTRAP_ERROR);
    AscendDevice device;
    EXPECT_TRUE(HasError(device.Init(Args(rank, 2), bootstrap), StatusCode::kDeviceError,
                         "aclshmemx_get_uniqueid failed: cann_error_code=-6 (ACLSHMEM_BOOTSTRAP_ERROR) rank=0 "
                         "SHMEM_UID_SESSION_ID=unset SHMEM_UID_SOCK_IFNAME=unset"));
  });
}

TEST_F(AscendDeviceTest, ReductionsRunOnTheStreamThroughAclnnReadingPeersInPlace) {
  constexpr int kRanks = 3;
  constexpr std::size_t kCount = 5;
  const std::size_t objects_before = FakeCann::LiveAclnnObjects();
  RunNpuRanks(kRanks, [](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(rank, kRanks), bootstrap)));
    auto f32 = device.Allocate(kCount * 4, 16);
    auto i32 = device.Allocate(kCount * 4, 16);
    auto f16 = device.Allocate(kCount * 2, 16);
    ASSERT_TRUE(f32.ok() && i32.ok() && f16.ok());
    std::vector<float> mine(kCount);
    std::vector<std::int32_t> ints(kCount);
    for (std::size_t i = 0; i < kCount; ++i) {
      mine[i] = static_cast<float>((rank + 1) * (i + 1)) * (i % 2 == 0 ? 1.0f : -1.0f);
      ints[i] = (rank + 1) * 1000 + static_cast<std::int32_t>(i);
    }
    WriteValues(f32.value(), mine);
    WriteValues(i32.value(), ints);
    // float16 1, 2, 3 on ranks 0, 1, 2 (0x3c00, 0x4000, 0x4200): exact in fp16.
    const std::uint16_t half[kRanks] = {0x3c00, 0x4000, 0x4200};
    WriteValues(f16.value(), std::vector<std::uint16_t>(kCount, half[rank]));
    ASSERT_TRUE(IsOk(device.Barrier(kDefaultStream)));

    const std::vector<int> all = {0, 1, 2};
    const NpuBuffer out(kCount * 4);
    const auto expect = [&](ReduceOp op, std::size_t i) {
      std::vector<float> values;
      for (int r = 0; r < kRanks; ++r) {
        values.push_back(static_cast<float>((r + 1) * (i + 1)) * (i % 2 == 0 ? 1.0f : -1.0f));
      }
      switch (op) {
        case ReduceOp::kSum: return values[0] + values[1] + values[2];
        case ReduceOp::kAvg: return (values[0] + values[1] + values[2]) / 3.0f;
        case ReduceOp::kMax: return std::max({values[0], values[1], values[2]});
        case ReduceOp::kMin: return std::min({values[0], values[1], values[2]});
      }
      return 0.0f;
    };
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
      ASSERT_TRUE(IsOk(device.Reduce(out.data(), f32.value(), kCount, DataType::kFloat32, op, all, kDefaultStream,
                                     nullptr)));
      const std::vector<float> got = ReadValues<float>(out.data(), kCount);
      for (std::size_t i = 0; i < kCount; ++i) {
        // One rounding per step of a float32 reduction of 3 values (sum, then the division of avg).
        EXPECT_NEAR(got[i], expect(op, i), 4 * std::numeric_limits<float>::epsilon() * std::fabs(expect(op, i)))
            << ReduceOpName(op) << " element " << i;
      }
    }
    // A subset of the ranks, on an explicit stream with a kept buffer, into int32.
    auto stream = device.CreateStream();
    ASSERT_TRUE(stream.ok());
    auto kept = std::make_shared<int>(0);
    ASSERT_TRUE(IsOk(device.Reduce(out.data(), i32.value(), kCount, DataType::kInt32, ReduceOp::kSum, {2, 0},
                                   stream.value(), kept)));
    EXPECT_GT(kept.use_count(), 1);
    ASSERT_TRUE(IsOk(device.SynchronizeStream(stream.value())));
    EXPECT_EQ(kept.use_count(), 1);
    const auto sums = ReadValues<std::int32_t>(out.data(), kCount);
    for (std::size_t i = 0; i < kCount; ++i) EXPECT_EQ(sums[i], 4000 + 2 * static_cast<std::int32_t>(i));
    // float16, in place on every rank's own copy: the peers must have read before anyone overwrites.
    ASSERT_TRUE(IsOk(device.Barrier(kDefaultStream)));
    ASSERT_TRUE(IsOk(device.Reduce(f16.value(), f16.value(), kCount, DataType::kFloat16, ReduceOp::kMax, all,
                                   kDefaultStream, nullptr)));
    EXPECT_EQ(ReadValues<std::uint16_t>(f16.value(), kCount), std::vector<std::uint16_t>(kCount, 0x4200));
    ASSERT_TRUE(IsOk(device.Barrier(kDefaultStream)));
    for (const FakeCall& call : CallsOf(rank, "aclnnInplaceAdd")) EXPECT_NE(call.stream, 0u);
    EXPECT_FALSE(CallsOf(rank, "aclnnInplaceDivs").empty());
    EXPECT_FALSE(CallsOf(rank, "aclnnMaximum").empty());
    EXPECT_FALSE(CallsOf(rank, "aclnnMinimum").empty());
    ASSERT_TRUE(IsOk(device.DestroyStream(stream.value())));
    ASSERT_TRUE(bootstrap.Barrier().ok());
    ASSERT_TRUE(IsOk(device.Finalize()));
  });
  // Every descriptor and workspace was released once the streams synchronized.
  EXPECT_EQ(FakeCann::LiveAclnnObjects(), objects_before);
  EXPECT_EQ(FakeCann::LiveDeviceAllocations(), 0u);
}

TEST_F(AscendDeviceTest, ReductionFailuresKeepTheAclnnStatusAndRejectBrokenContracts) {
  RunNpuRanks(1, [](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 1), bootstrap)));
    auto buffer = device.Allocate(64, 16);
    ASSERT_TRUE(buffer.ok());
    const NpuBuffer out(64);
    EXPECT_TRUE(IsOk(device.Reduce(buffer.value(), buffer.value(), 16, DataType::kFloat32, ReduceOp::kMax, {0},
                                   kDefaultStream, nullptr)));   // one source in place: nothing to combine
    EXPECT_TRUE(IsOk(device.Reduce(out.data(), buffer.value(), 16, DataType::kFloat32, ReduceOp::kMax, {0},
                                   kDefaultStream, nullptr)));   // a copy, no operator either
    EXPECT_TRUE(HasError(device.Reduce(out.data(), buffer.value(), 8, DataType::kInt32, ReduceOp::kAvg, {0},
                                       kDefaultStream, nullptr),
                         StatusCode::kInvalidArgument, "`op` must be sum, max or min for int32, but got avg"));
    EXPECT_TRUE(HasError(device.Reduce(out.data(), buffer.value(), 8, DataType::kFloat32, ReduceOp::kSum, {1},
                                       kDefaultStream, nullptr),
                         StatusCode::kInvalidArgument, "`pe` must be in [0, 1), but got 1"));
    EXPECT_TRUE(CallsOf(rank, "aclnnMaximum").empty());
    ASSERT_TRUE(IsOk(device.Finalize()));
  });
  RunNpuRanks(2, [](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 2), bootstrap)));
    auto buffer = device.Allocate(64, 16);
    ASSERT_TRUE(buffer.ok());
    const NpuBuffer out(64);
    FakeCann::FailNext("aclnnMaximumGetWorkspaceSize", fakes::kAclnnErrParamInvalid);
    EXPECT_TRUE(HasError(device.Reduce(out.data(), buffer.value(), 16, DataType::kFloat32, ReduceOp::kMax, {0, 1},
                                       kDefaultStream, nullptr),
                         StatusCode::kDeviceError,
                         "aclnnMaximumGetWorkspaceSize failed: aclnn_status=161002 op=Reduce reduce_op=max "
                         "dtype=float32 count=16 pes=2 source_pe=1"));
    ASSERT_TRUE(IsOk(device.SynchronizeStream(kDefaultStream)));
    ASSERT_TRUE(bootstrap.Barrier().ok());
    ASSERT_TRUE(IsOk(device.Finalize()));
  });
}

// ---- stream-ordered staging and reads (the engine's deferred checks) ------------------------------------------------

TEST_F(AscendDeviceTest, StagingAndReadsRunInStreamOrderWithoutTheHostWaiting) {
  RunNpuRanks(1, [](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 1), bootstrap)));
    auto row = device.Allocate(128, 64);
    ASSERT_TRUE(row.ok());
    WriteNpu(row.value(), std::string(128, '0').data(), 128);
    auto stream = device.CreateStream();
    ASSERT_TRUE(stream.ok());
    FakeCann::SetStreamLag(FakeCann::kLagUntilDemanded);   // the NPU runs nothing until someone waits for it
    FakeCann::ResetCounters();
    std::string host(128, 'r');
    ASSERT_TRUE(IsOk(device.StageFromHost(row.value(), host.data(), host.size(), stream.value())));
    host.assign(128, 'x');   // the bytes were taken at the call: the caller may reuse its memory
    auto token = device.ReadLater(row.value(), 128, stream.value());
    ASSERT_TRUE(token.ok()) << token.status().ToString();
    std::string seen(128, '?');
    for (int ask = 0; ask < 3; ++ask) {   // asking never makes the stream run
      auto ready = device.TakeRead(token.value(), seen.data());
      ASSERT_TRUE(ready.ok()) << ready.status().ToString();
      EXPECT_FALSE(ready.value());
    }
    const fakes::FakeCounters counters = FakeCann::Counters();
    EXPECT_EQ(counters.stream_synchronizations, 0u);
    EXPECT_EQ(counters.blocking_copies, 0u);
    EXPECT_EQ(counters.device_tasks, 4u);   // two copies, each followed by its event
    EXPECT_EQ(seen, std::string(128, '?'));
    EXPECT_EQ(ReadNpu(row.value(), 128), std::vector<char>(128, '0'));   // nor has the staging run
    // Once the NPU got that far (the test waits for it itself), the read holds the staged row, and is taken once.
    ASSERT_EQ(aclrtSynchronizeStream(reinterpret_cast<aclrtStream>(stream.value())), ACL_SUCCESS);
    auto ready = device.TakeRead(token.value(), seen.data());
    ASSERT_TRUE(ready.ok()) << ready.status().ToString();
    EXPECT_TRUE(ready.value());
    EXPECT_EQ(seen, std::string(128, 'r'));
    EXPECT_TRUE(HasError(device.TakeRead(token.value(), seen.data()).status(), StatusCode::kInvalidArgument,
                         "`token` must be a read started by ReadLater and not taken yet, but got " +
                             std::to_string(token.value())));
    // NPU memory outside the heap (a tensor's storage: MoE's split tables) is staged and read the same way.
    const NpuBuffer outside(64);
    ASSERT_TRUE(IsOk(device.StageFromHost(outside.data(), std::string(64, 'o').data(), 64, stream.value())));
    auto outside_token = device.ReadLater(outside.data(), 64, stream.value());
    ASSERT_TRUE(outside_token.ok()) << outside_token.status().ToString();
    ASSERT_TRUE(IsOk(device.SynchronizeStream(stream.value())));
    std::string outside_seen(64, '\0');
    auto outside_ready = device.TakeRead(outside_token.value(), outside_seen.data());
    ASSERT_TRUE(outside_ready.ok() && outside_ready.value());
    EXPECT_EQ(outside_seen, std::string(64, 'o'));
    ASSERT_TRUE(IsOk(device.SynchronizeStream(stream.value())));
    ASSERT_TRUE(IsOk(device.DestroyStream(stream.value())));
    ASSERT_TRUE(IsOk(device.Finalize()));
  });
  // Finalize gave every page-locked buffer and event back.
  EXPECT_EQ(FakeCann::LiveEvents(), 0u);
}

TEST_F(AscendDeviceTest, StagingBuffersAndEventsArePooledAndReusedOnlyOnceTheirCopyRan) {
  RunNpuRanks(1, [](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 1), bootstrap)));
    auto rows = device.Allocate(2 * 64, 64);
    ASSERT_TRUE(rows.ok());
    char* first = static_cast<char*>(rows.value());
    char* second = first + 64;
    aclrtStream caller = nullptr;   // the torch_npu current stream
    ASSERT_EQ(aclrtCreateStream(&caller), ACL_SUCCESS);
    const auto stream = reinterpret_cast<StreamHandle>(caller);
    FakeCann::SetStreamLag(FakeCann::kLagUntilDemanded);
    FakeCann::ResetCounters();
    // Two rows staged before the stream ran either: the first one's buffer is still to be copied, so the second
    // cannot have it.
    ASSERT_TRUE(IsOk(device.StageFromHost(first, std::string(64, 'a').data(), 64, stream)));
    ASSERT_TRUE(IsOk(device.StageFromHost(second, std::string(64, 'b').data(), 64, stream)));
    EXPECT_EQ(FakeCann::Counters().host_mallocs, 2u);
    EXPECT_EQ(FakeCann::Counters().events_created, 2u);
    ASSERT_EQ(aclrtSynchronizeStream(caller), ACL_SUCCESS);
    EXPECT_EQ(ReadNpu(first, 64), std::vector<char>(64, 'a'));
    EXPECT_EQ(ReadNpu(second, 64), std::vector<char>(64, 'b'));
    // Warm: a staging and a read take pooled buffers and events, and allocate nothing.
    FakeCann::ResetCounters();
    ASSERT_TRUE(IsOk(device.StageFromHost(first, std::string(64, 'c').data(), 64, stream)));
    auto token = device.ReadLater(first, 64, stream);
    ASSERT_TRUE(token.ok());
    ASSERT_EQ(aclrtSynchronizeStream(caller), ACL_SUCCESS);
    std::string seen(64, '?');
    auto ready = device.TakeRead(token.value(), seen.data());
    ASSERT_TRUE(ready.ok() && ready.value());
    EXPECT_EQ(seen, std::string(64, 'c'));
    const fakes::FakeCounters warm = FakeCann::Counters();
    EXPECT_EQ(warm.host_mallocs, 0u);
    EXPECT_EQ(warm.events_created, 0u);
    EXPECT_EQ(warm.device_mallocs, 0u);
    EXPECT_TRUE(FakeCann::CallsNamed("aclrtMallocHost").size() == 2u);   // the two of the cold calls only
    ASSERT_TRUE(IsOk(device.Finalize()));
    EXPECT_EQ(FakeCann::CallsNamed("aclrtFreeHost").size(), 2u);
    ASSERT_EQ(aclrtDestroyStream(caller), ACL_SUCCESS);
  });
  EXPECT_EQ(FakeCann::LiveEvents(), 0u);
}

TEST_F(AscendDeviceTest, OnTheDefaultStreamStagingAndReadsCompleteBeforeTheyReturn) {
  RunNpuRanks(1, [](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 1), bootstrap)));
    auto row = device.Allocate(64, 64);
    ASSERT_TRUE(row.ok());
    FakeCann::SetStreamLag(FakeCann::kLagUntilDemanded);
    FakeCann::ResetCounters();
    ASSERT_TRUE(IsOk(device.StageFromHost(row.value(), std::string(64, 'd').data(), 64, kDefaultStream)));
    EXPECT_EQ(ReadNpu(row.value(), 64), std::vector<char>(64, 'd'));
    auto token = device.ReadLater(row.value(), 64, kDefaultStream);
    ASSERT_TRUE(token.ok());
    std::string seen(64, '?');
    auto ready = device.TakeRead(token.value(), seen.data());
    ASSERT_TRUE(ready.ok());
    EXPECT_TRUE(ready.value());
    EXPECT_EQ(seen, std::string(64, 'd'));
    EXPECT_EQ(FakeCann::Counters().stream_synchronizations, 2u);   // the rule of the default stream, one per call
    EXPECT_EQ(FakeCann::CallsNamed("aclrtSynchronizeStreamWithTimeout").back().stream, device.default_stream());
    // Nothing to copy: nothing enqueued, and the read is there at once.
    FakeCann::ResetCounters();
    ASSERT_TRUE(IsOk(device.StageFromHost(row.value(), seen.data(), 0, kDefaultStream)));
    auto empty = device.ReadLater(row.value(), 0, kDefaultStream);
    ASSERT_TRUE(empty.ok());
    ready = device.TakeRead(empty.value(), seen.data());
    ASSERT_TRUE(ready.ok() && ready.value());
    EXPECT_EQ(FakeCann::Counters().device_tasks, 0u);
    ASSERT_TRUE(IsOk(device.Finalize()));
    EXPECT_TRUE(HasError(device.StageFromHost(row.value(), seen.data(), 1, kDefaultStream), StatusCode::kStateError,
                         "ascend device is not initialised: op=StageFromHost"));
  });
}

TEST_F(AscendDeviceTest, StagingAndReadsAreRefusedOnACapturedStreamWhoseReplayWouldCopyStaleBytes) {
  RunNpuRanks(1, [](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 1), bootstrap)));
    auto row = device.Allocate(64, 64);
    ASSERT_TRUE(row.ok());
    aclrtStream captured = nullptr;
    ASSERT_EQ(aclrtCreateStream(&captured), ACL_SUCCESS);
    const auto handle = reinterpret_cast<StreamHandle>(captured);
    ASSERT_EQ(aclmdlRICaptureBegin(captured, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL), ACL_SUCCESS);
    const std::string stream = Hex(handle);
    const char fill[64] = {};
    EXPECT_TRUE(HasError(device.StageFromHost(row.value(), fill, 64, handle), StatusCode::kStateError,
                         "StageFromHost cannot run while stream " + stream + " is being captured "
                         "(aclmdlRICaptureBegin): it would record a copy from a page-locked buffer, which every replay "
                         "of the graph would copy again long after this call (stale bytes, or the bytes of a later "
                         "call the buffer went to); the engine's collectives cannot be captured: "
                         "capture_status=active"));
    EXPECT_TRUE(HasError(device.ReadLater(row.value(), 64, handle).status(), StatusCode::kStateError,
                         "ReadLater cannot run while stream " + stream + " is being captured (aclmdlRICaptureBegin): "
                         "it would record a copy into a page-locked buffer, which every replay"));
    // Refused before ACL saw anything: the capture is intact.
    EXPECT_TRUE(FakeCann::CallsNamed("aclrtMemcpyAsync").empty());
    EXPECT_TRUE(FakeCann::CallsNamed("aclrtMallocHost").empty());
    aclmdlRI model = nullptr;
    ASSERT_EQ(aclmdlRICaptureEnd(captured, &model), ACL_SUCCESS);
    ASSERT_EQ(aclmdlRIDestroy(model), ACL_SUCCESS);
    ASSERT_TRUE(IsOk(device.Finalize()));
    ASSERT_EQ(aclrtDestroyStream(captured), ACL_SUCCESS);
  });
}

TEST_F(AscendDeviceTest, WhatEnqueuedCallsKeepIsReleasedOnceAnEventRecordedAfterThemCompleted) {
  RunNpuRanks(1, [](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 1), bootstrap)));
    auto buffer = device.Allocate(16 * 4, 64);
    auto row = device.Allocate(64, 64);
    ASSERT_TRUE(buffer.ok() && row.ok());
    WriteValues(buffer.value(), std::vector<float>(16, 1.0f));
    const NpuBuffer out(16 * 4);
    auto stream = device.CreateStream();
    ASSERT_TRUE(stream.ok());
    FakeCann::SetStreamLag(FakeCann::kLagUntilDemanded);
    const std::size_t objects = FakeCann::LiveAclnnObjects();
    auto kept = std::make_shared<int>(0);
    ASSERT_TRUE(IsOk(device.Reduce(out.data(), buffer.value(), 16, DataType::kFloat32, ReduceOp::kMax, {0, 0},
                                   stream.value(), kept)));
    EXPECT_GT(FakeCann::LiveAclnnObjects(), objects);
    EXPECT_EQ(kept.use_count(), 2);
    // A staged row records an event after the reduction; once it completed, the next staging lets go of what the
    // reduction kept, with nobody synchronizing the device's stream.
    ASSERT_TRUE(IsOk(device.StageFromHost(row.value(), std::string(64, 's').data(), 64, stream.value())));
    EXPECT_EQ(kept.use_count(), 2);
    ASSERT_EQ(aclrtSynchronizeStream(reinterpret_cast<aclrtStream>(stream.value())), ACL_SUCCESS);
    FakeCann::ResetCounters();
    ASSERT_TRUE(IsOk(device.StageFromHost(row.value(), std::string(64, 't').data(), 64, stream.value())));
    EXPECT_EQ(kept.use_count(), 1);
    EXPECT_EQ(FakeCann::LiveAclnnObjects(), objects);
    EXPECT_EQ(FakeCann::Counters().stream_synchronizations, 0u);
    ASSERT_TRUE(IsOk(device.SynchronizeStream(stream.value())));
    EXPECT_EQ(ReadValues<float>(out.data(), 16), std::vector<float>(16, 1.0f));
    ASSERT_TRUE(IsOk(device.Finalize()));
  });
}

// ---- one operator per sum, and nothing allocated once warm ---------------------------------------------------------

void ExpectSumsInOneAclnnAddN(int ranks) {
  constexpr std::size_t kCount = 64;
  RunNpuRanks(ranks, [ranks](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(rank, ranks), bootstrap)));
    auto f32 = device.Allocate(kCount * 4, 64);
    auto i64 = device.Allocate(kCount * 8, 64);
    auto f64 = device.Allocate(kCount * 8, 64);
    ASSERT_TRUE(f32.ok() && i64.ok() && f64.ok());
    // Small integers: every sum is exact in every dtype, whatever the order of the additions.
    std::vector<float> floats(kCount);
    std::vector<std::int64_t> longs(kCount);
    std::vector<double> doubles(kCount);
    for (std::size_t i = 0; i < kCount; ++i) {
      floats[i] = static_cast<float>(rank * 100 + static_cast<int>(i));
      longs[i] = (std::int64_t{1} << 40) * rank + static_cast<std::int64_t>(i);
      doubles[i] = static_cast<double>(floats[i]);
    }
    WriteValues(f32.value(), floats);
    WriteValues(i64.value(), longs);
    WriteValues(f64.value(), doubles);
    ASSERT_TRUE(IsOk(device.Barrier(kDefaultStream)));
    std::vector<int> all(static_cast<std::size_t>(ranks));
    for (int r = 0; r < ranks; ++r) all[static_cast<std::size_t>(r)] = r;
    const int rank_sum = ranks * (ranks - 1) / 2;
    auto stream = device.CreateStream();
    ASSERT_TRUE(stream.ok());
    const NpuBuffer out(kCount * 8);
    auto launches = [rank](const char* name) { return CallsOf(rank, name).size(); };

    // sum: one aclnnAddN over every member's copy, read in place; no pairwise add.
    ASSERT_TRUE(IsOk(device.Reduce(out.data(), f32.value(), kCount, DataType::kFloat32, ReduceOp::kSum, all,
                                   stream.value(), nullptr)));
    EXPECT_EQ(launches("aclnnAddN"), 1u);
    EXPECT_EQ(FakeCann::CallsNamed("aclnnAddNGetWorkspaceSize").back().target_pe, ranks);   // the terms
    EXPECT_EQ(launches("aclnnInplaceAdd"), 0u);
    ASSERT_TRUE(IsOk(device.SynchronizeStream(stream.value())));
    auto sums = ReadValues<float>(out.data(), kCount);
    for (std::size_t i = 0; i < kCount; ++i) {
      EXPECT_EQ(sums[i], static_cast<float>(100 * rank_sum + ranks * static_cast<int>(i))) << i;
    }
    // avg: the same sum, then one division.
    ASSERT_TRUE(IsOk(device.Reduce(out.data(), f32.value(), kCount, DataType::kFloat32, ReduceOp::kAvg, all,
                                   stream.value(), nullptr)));
    EXPECT_EQ(launches("aclnnAddN"), 2u);
    EXPECT_EQ(launches("aclnnInplaceDivs"), 1u);
    // int64, every bit kept.
    ASSERT_TRUE(IsOk(device.Reduce(out.data(), i64.value(), kCount, DataType::kInt64, ReduceOp::kSum, all,
                                   stream.value(), nullptr)));
    EXPECT_EQ(launches("aclnnAddN"), 3u);
    ASSERT_TRUE(IsOk(device.SynchronizeStream(stream.value())));
    const auto totals = ReadValues<std::int64_t>(out.data(), kCount);
    for (std::size_t i = 0; i < kCount; ++i) {
      EXPECT_EQ(totals[i], (std::int64_t{1} << 40) * rank_sum + ranks * static_cast<std::int64_t>(i)) << i;
    }
    // float64 is not an aclnnAddN dtype: n - 1 adds.
    ASSERT_TRUE(IsOk(device.Reduce(out.data(), f64.value(), kCount, DataType::kFloat64, ReduceOp::kSum, all,
                                   stream.value(), nullptr)));
    EXPECT_EQ(launches("aclnnAddN"), 3u);
    EXPECT_EQ(launches("aclnnInplaceAdd"), static_cast<std::size_t>(ranks - 1));
    ASSERT_TRUE(IsOk(device.SynchronizeStream(stream.value())));
    const auto wide = ReadValues<double>(out.data(), kCount);
    for (std::size_t i = 0; i < kCount; ++i) EXPECT_EQ(wide[i], static_cast<double>(sums[i])) << i;
    // Warm: the next sum on the stream allocates nothing (its workspace is the stream's). In place over rank 0's own
    // copy, which nobody else reads meanwhile: the operator sums into its workspace before it writes out.
    ASSERT_TRUE(IsOk(device.Barrier(kDefaultStream)));
    if (rank == 0) {
      FakeCann::ResetCounters();
      ASSERT_TRUE(IsOk(device.Reduce(f32.value(), f32.value(), kCount, DataType::kFloat32, ReduceOp::kSum, all,
                                     stream.value(), nullptr)));
      EXPECT_EQ(FakeCann::Counters().device_mallocs, 0u);
      EXPECT_EQ(FakeCann::Counters().device_tasks, 1u);
      ASSERT_TRUE(IsOk(device.SynchronizeStream(stream.value())));
      EXPECT_EQ(ReadValues<float>(f32.value(), kCount), sums);
    }
    ASSERT_TRUE(IsOk(device.DestroyStream(stream.value())));
    ASSERT_TRUE(bootstrap.Barrier().ok());
    ASSERT_TRUE(IsOk(device.Finalize()));
  });
  EXPECT_EQ(FakeCann::LiveDeviceAllocations(), 0u);
  EXPECT_EQ(FakeCann::LiveAclnnObjects(), 0u);
}

TEST_F(AscendDeviceTest, ASumOverFourPesIsOneAclnnAddN) { ExpectSumsInOneAclnnAddN(4); }
TEST_F(AscendDeviceTest, ASumOverEightPesIsOneAclnnAddN) { ExpectSumsInOneAclnnAddN(8); }

TEST_F(AscendDeviceTest, SumsStayPairwiseWhereTheSocHasNoAclnnAddN) {
  FakeCann::SetSocName("Ascend310P3");
  RunNpuRanks(2, [](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 2), bootstrap)));
    auto f32 = device.Allocate(16 * 4, 64);
    ASSERT_TRUE(f32.ok());
    WriteValues(f32.value(), std::vector<float>(16, static_cast<float>(rank + 1)));
    ASSERT_TRUE(IsOk(device.Barrier(kDefaultStream)));
    const NpuBuffer out(16 * 4);
    ASSERT_TRUE(IsOk(device.Reduce(out.data(), f32.value(), 16, DataType::kFloat32, ReduceOp::kSum, {0, 1},
                                   kDefaultStream, nullptr)));
    EXPECT_EQ(ReadValues<float>(out.data(), 16), std::vector<float>(16, 3.0f));
    EXPECT_TRUE(CallsOf(rank, "aclnnAddNGetWorkspaceSize").empty());
    EXPECT_EQ(CallsOf(rank, "aclnnInplaceAdd").size(), 1u);
    ASSERT_TRUE(bootstrap.Barrier().ok());
    ASSERT_TRUE(IsOk(device.Finalize()));
  });
}

TEST_F(AscendDeviceTest, AStreamsWorkspaceGrowsAndTheOutgrownOneIsFreedOnlyOnceTheStreamRanPastIt) {
  constexpr std::size_t kSmall = 16;
  constexpr std::size_t kLarge = 64 * 1024;   // aclnnAddN's workspace holds its sum: 256 KiB, past the first buffer
  RunNpuRanks(1, [](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 1), bootstrap)));
    auto buffer = device.Allocate(kLarge * 4, 64);
    ASSERT_TRUE(buffer.ok());
    std::vector<float> values(kLarge);
    for (std::size_t i = 0; i < kLarge; ++i) values[i] = static_cast<float>(i % 1000);
    WriteValues(buffer.value(), values);
    const NpuBuffer small(kSmall * 4), large(kLarge * 4);
    auto stream = device.CreateStream();
    ASSERT_TRUE(stream.ok());
    FakeCann::SetStreamLag(FakeCann::kLagUntilDemanded);
    const std::size_t live = FakeCann::LiveDeviceAllocations();
    // The same PE twice: two terms, this rank's copy read twice.
    ASSERT_TRUE(IsOk(device.Reduce(small.data(), buffer.value(), kSmall, DataType::kFloat32, ReduceOp::kSum, {0, 0},
                                   stream.value(), nullptr)));
    EXPECT_EQ(FakeCann::LiveDeviceAllocations(), live + 1);   // the stream's workspace
    ASSERT_TRUE(IsOk(device.Reduce(large.data(), buffer.value(), kLarge, DataType::kFloat32, ReduceOp::kSum, {0, 0},
                                   stream.value(), nullptr)));
    // Grown; the first sum has not run yet and still needs the old one.
    EXPECT_EQ(FakeCann::LiveDeviceAllocations(), live + 2);
    ASSERT_TRUE(IsOk(device.SynchronizeStream(stream.value())));   // a workspace freed early would fault a kernel
    EXPECT_EQ(FakeCann::LiveDeviceAllocations(), live + 1);
    const auto got = ReadValues<float>(large.data(), kLarge);
    for (std::size_t i = 0; i < kLarge; i += 997) EXPECT_EQ(got[i], 2 * values[i]) << i;
    EXPECT_EQ(ReadValues<float>(small.data(), kSmall)[kSmall - 1], 2 * values[kSmall - 1]);
    FakeCann::ResetCounters();
    ASSERT_TRUE(IsOk(device.Reduce(small.data(), buffer.value(), kSmall, DataType::kFloat32, ReduceOp::kAvg, {0, 0},
                                   stream.value(), nullptr)));
    EXPECT_EQ(FakeCann::Counters().device_mallocs, 0u);
    EXPECT_EQ(FakeCann::Counters().device_tasks, 2u);   // one sum, one division
    ASSERT_TRUE(IsOk(device.DestroyStream(stream.value())));
    EXPECT_EQ(FakeCann::LiveDeviceAllocations(), live);   // the stream's workspace went with it
    ASSERT_TRUE(IsOk(device.Finalize()));
  });
}

TEST_F(AscendDeviceTest, WireFormatsCastWithAclnnCastReadPeersInPlaceAndFp8IsRefusedNamingTheMissingKernel) {
  constexpr std::size_t kCount = 8;
  RunNpuRanks(2, [](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 2), bootstrap)));
    auto codes = device.Allocate(kCount * 2, 16);
    auto again = device.Allocate(kCount * 2, 16);
    ASSERT_TRUE(codes.ok() && again.ok());
    const NpuBuffer wide(kCount * 4), out(kCount * 4);
    const int peer = 1 - rank;
    // Quarters up to 8 are exact in float16: every sum below is exact, the casts round nothing.
    auto value = [](int r, std::size_t i) { return static_cast<float>(r + 1) * (static_cast<float>(i) - 3.0f) * 0.25f; };
    std::vector<float> mine(kCount);
    for (std::size_t i = 0; i < kCount; ++i) mine[i] = value(rank, i);
    WriteValues(wide.data(), mine);
    const WireRun run{nullptr, codes.value()};
    ASSERT_TRUE(IsOk(device.Encode(ops::LowFormat::kFloat16, DataType::kFloat32, wide.data(), kCount, run,
                                   kDefaultStream, nullptr)));
    ASSERT_TRUE(IsOk(device.Barrier(kDefaultStream)));
    // Decode reads the peer's codes in place.
    ASSERT_TRUE(IsOk(device.Decode(ops::LowFormat::kFloat16, run, peer, kCount, DataType::kFloat32, out.data(),
                                   kDefaultStream, nullptr)));
    auto decoded = ReadValues<float>(out.data(), kCount);
    for (std::size_t i = 0; i < kCount; ++i) EXPECT_EQ(decoded[i], value(peer, i)) << i;
    // The owner's step: own values plus the peer's codes, re-encoded, and out decoded from those codes.
    const WireRun reencoded{nullptr, again.value()};
    ASSERT_TRUE(IsOk(device.ReduceEncoded(ops::LowFormat::kFloat16, DataType::kFloat32, ReduceOp::kSum, wide.data(),
                                          run, {peer}, kCount, out.data(), reencoded, kDefaultStream, nullptr)));
    decoded = ReadValues<float>(out.data(), kCount);
    for (std::size_t i = 0; i < kCount; ++i) EXPECT_EQ(decoded[i], value(0, i) + value(1, i)) << i;
    EXPECT_EQ(ReadValues<std::uint16_t>(again.value(), 1)[0], 0xc080);   // -0.75 - 1.5 in float16
    // Every rank's codes averaged in group-rank order, in place over own values: the same on both ranks.
    ASSERT_TRUE(IsOk(device.ReduceEncoded(ops::LowFormat::kFloat16, DataType::kFloat32, ReduceOp::kAvg, nullptr, run,
                                          {0, 1}, kCount, out.data(), WireRun{}, kDefaultStream, nullptr)));
    decoded = ReadValues<float>(out.data(), kCount);
    for (std::size_t i = 0; i < kCount; ++i) EXPECT_EQ(decoded[i], (value(0, i) + value(1, i)) / 2) << i;
    // Warm: the stream's scratch (the decoded terms) and workspace are there already.
    FakeCann::ResetCounters();
    ASSERT_TRUE(IsOk(device.ReduceEncoded(ops::LowFormat::kFloat16, DataType::kFloat32, ReduceOp::kAvg, nullptr, run,
                                          {0, 1}, kCount, out.data(), WireRun{}, kDefaultStream, nullptr)));
    EXPECT_EQ(FakeCann::Counters().device_mallocs, 0u);
    ASSERT_TRUE(IsOk(device.ReduceEncoded(ops::LowFormat::kFloat16, DataType::kFloat32, ReduceOp::kSum, wide.data(),
                                          run, {peer}, kCount, wide.data(), WireRun{}, kDefaultStream, nullptr)));
    decoded = ReadValues<float>(wide.data(), kCount);
    for (std::size_t i = 0; i < kCount; ++i) EXPECT_EQ(decoded[i], value(0, i) + value(1, i)) << i;
    EXPECT_FALSE(CallsOf(rank, "aclnnCast").empty());
    EXPECT_FALSE(CallsOf(rank, "aclnnInplaceDivs").empty());
    ASSERT_TRUE(IsOk(device.Barrier(kDefaultStream)));
    ASSERT_TRUE(bootstrap.Barrier().ok());
    ASSERT_TRUE(IsOk(device.Finalize()));
  });
  RunNpuRanks(1, [](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 1), bootstrap)));
    // Rounding to nearest even, like the NPU's cast; bfloat16 too.
    const std::vector<float> values = {1.0f, -2.5f, 65504.0f, 0.099975586f, 1.0f / 3.0f};
    auto codes = device.Allocate(values.size() * 2, 16);
    ASSERT_TRUE(codes.ok());
    const NpuBuffer wide(values.size() * 4);
    WriteValues(wide.data(), values);
    const WireRun run{nullptr, codes.value()};
    ASSERT_TRUE(IsOk(device.Encode(ops::LowFormat::kFloat16, DataType::kFloat32, wide.data(), values.size(), run,
                                   kDefaultStream, nullptr)));
    EXPECT_EQ(ReadValues<std::uint16_t>(codes.value(), 4), (std::vector<std::uint16_t>{0x3c00, 0xc100, 0x7bff, 0x2e66}));
    ASSERT_TRUE(IsOk(device.Encode(ops::LowFormat::kBFloat16, DataType::kFloat32, wide.data(), values.size(), run,
                                   kDefaultStream, nullptr)));
    EXPECT_EQ(ReadValues<std::uint16_t>(codes.value(), 2), (std::vector<std::uint16_t>{0x3f80, 0xc020}));
    EXPECT_TRUE(IsOk(device.CheckWireFormat(ops::LowFormat::kBFloat16)));
    EXPECT_TRUE(HasError(device.CheckWireFormat(ops::LowFormat::kFloat8E4M3Fn), StatusCode::kDeviceError,
                         "low-precision communication in float8_e4m3fn needs a block-scaled fp8 cast kernel"));
    EXPECT_TRUE(HasError(device.Encode(ops::LowFormat::kFloat8E5M2, DataType::kFloat32, wide.data(), 1, run,
                                       kDefaultStream, nullptr),
                         StatusCode::kDeviceError, "float8_e5m2 needs a block-scaled fp8 cast kernel"));
    EXPECT_TRUE(HasError(device.Encode(ops::LowFormat::kFloat16, DataType::kFloat16, wide.data(), 1, run,
                                       kDefaultStream, nullptr),
                         StatusCode::kInvalidArgument,
                         "`dtype` must be a floating-point dtype wider than float16, but got float16"));
    EXPECT_TRUE(HasError(device.ReduceEncoded(ops::LowFormat::kFloat16, DataType::kFloat32, ReduceOp::kMax, nullptr,
                                              run, {0}, 1, wide.data(), WireRun{}, kDefaultStream, nullptr),
                         StatusCode::kInvalidArgument, "`op` must be sum or avg, but got max"));
    EXPECT_TRUE(HasError(device.Decode(ops::LowFormat::kFloat16, run, 1, 1, DataType::kFloat32, wide.data(),
                                       kDefaultStream, nullptr),
                         StatusCode::kInvalidArgument, "`pe` must be in [0, 1), but got 1"));
    ASSERT_TRUE(IsOk(device.Finalize()));
  });
}

// MoE's wire rows on the NPU (Device::EncodeRows, DecodeRows): one aclnnCast over every row on the caller's stream,
// NPU memory to NPU memory (the fakes fault on host memory there), only enqueued: no synchronization, no blocking
// copy, no page-locked staging through the host. The fp8 rows are refused, as the fp8 runs are.
TEST_F(AscendDeviceTest, MoeWireRowsAreOneCastOnTheStreamAndNeverLeaveTheNpu) {
  constexpr std::size_t kRows = 3, kRowElems = 4, kCount = kRows * kRowElems;
  RunNpuRanks(1, [](int rank, Bootstrap& bootstrap) {
    AscendDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(rank, 1), bootstrap)));
    auto stream = device.CreateStream();
    ASSERT_TRUE(stream.ok());
    // Multiples of 3/8 up to 2.25: exact in bfloat16, so the decoded rows are the values.
    std::vector<float> values(kCount);
    for (std::size_t i = 0; i < kCount; ++i) values[i] = (static_cast<float>(i) - 5.0f) * 0.375f;
    const std::size_t wire_bytes = kRows * ops::WireRowBytes(ops::LowFormat::kBFloat16, kRowElems);
    ASSERT_EQ(wire_bytes, kCount * 2);
    const NpuBuffer wide(kCount * 4), wire(wire_bytes), back(kCount * 4);
    WriteValues(wide.data(), values);
    FakeCann::ResetCounters();
    ASSERT_TRUE(IsOk(device.EncodeRows(ops::LowFormat::kBFloat16, DataType::kFloat32, wide.data(), kRows, kRowElems,
                                       wire.data(), stream.value(), nullptr)));
    ASSERT_TRUE(IsOk(device.DecodeRows(ops::LowFormat::kBFloat16, wire.data(), kRows, kRowElems, DataType::kFloat32,
                                       back.data(), stream.value(), nullptr)));
    const fakes::FakeCounters enqueued = FakeCann::Counters();
    EXPECT_EQ(enqueued.stream_synchronizations, 0u);
    EXPECT_EQ(enqueued.blocking_copies, 0u);
    EXPECT_EQ(enqueued.host_mallocs, 0u);
    EXPECT_EQ(CallsOf(rank, "aclnnCast").size(), 2u);   // one cast each way, whatever the rows
    ASSERT_TRUE(IsOk(device.SynchronizeStream(stream.value())));
    EXPECT_EQ(ReadValues<float>(back.data(), kCount), values);
    EXPECT_EQ(ReadValues<std::uint16_t>(wire.data(), 2), (std::vector<std::uint16_t>{0xbff0, 0xbfc0}));   // -1.875, -1.5
    EXPECT_TRUE(HasError(device.EncodeRows(ops::LowFormat::kFloat8E4M3Fn, DataType::kFloat32, wide.data(), kRows,
                                           kRowElems, wire.data(), stream.value(), nullptr),
                         StatusCode::kDeviceError, "float8_e4m3fn needs a block-scaled fp8 cast kernel"));
    EXPECT_TRUE(HasError(device.DecodeRows(ops::LowFormat::kFloat16, wire.data(), kRows, kRowElems,
                                           DataType::kFloat16, back.data(), stream.value(), nullptr),
                         StatusCode::kInvalidArgument,
                         "`dtype` must be a floating-point dtype wider than float16, but got float16"));
    ASSERT_TRUE(IsOk(device.DestroyStream(stream.value())));
    ASSERT_TRUE(IsOk(device.Finalize()));
  });
}

TEST_F(AscendDeviceTest, RuntimeReduceRunsOnTheAscendDevice) {
  RunNpuRanks(2, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(runtime.Init(AscendConfig(), std::make_unique<AscendDevice>(), bootstrap)));
    auto buffer = runtime.Allocate(4 * sizeof(float), 0, "test");
    ASSERT_TRUE(buffer.ok());
    void* symmetric = reinterpret_cast<void*>(buffer->base);
    WriteValues(symmetric, std::vector<float>(4, static_cast<float>(rank + 1)));
    ASSERT_TRUE(IsOk(runtime.Barrier(kDefaultStream)));
    const NpuBuffer out(4 * sizeof(float));
    ASSERT_TRUE(IsOk(runtime.Reduce(out.data(), 16, symmetric, 16, DataType::kFloat32, ReduceOp::kAvg, {0, 1},
                                    kDefaultStream, nullptr)));
    EXPECT_EQ(ReadValues<float>(out.data(), 4), std::vector<float>(4, 1.5f));
    ASSERT_TRUE(IsOk(runtime.Barrier(kDefaultStream)));
    ASSERT_TRUE(IsOk(runtime.Free(buffer->id, "test")));
    ASSERT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

struct CodeCase {
  int code;
  StatusCode expected;
  const char* name;
};

TEST(CannStatusTest, EveryShmemCodeMapsAndKeepsTheCode) {
  const CodeCase cases[] = {
      {ACLSHMEM_INVALID_PARAM, StatusCode::kInvalidArgument, "ACLSHMEM_INVALID_PARAM"},
      {ACLSHMEM_INVALID_VALUE, StatusCode::kInvalidArgument, "ACLSHMEM_INVALID_VALUE"},
      {ACLSHMEM_SMEM_ERROR, StatusCode::kDeviceError, "ACLSHMEM_SMEM_ERROR"},
      {ACLSHMEM_INNER_ERROR, StatusCode::kDeviceError, "ACLSHMEM_INNER_ERROR"},
      {ACLSHMEM_NOT_INITED, StatusCode::kStateError, "ACLSHMEM_NOT_INITED"},
      {ACLSHMEM_BOOTSTRAP_ERROR, StatusCode::kDeviceError, "ACLSHMEM_BOOTSTRAP_ERROR"},
      {ACLSHMEM_TIMEOUT_ERROR, StatusCode::kTimeout, "ACLSHMEM_TIMEOUT_ERROR"},
      {ACLSHMEM_MALLOC_FAILED, StatusCode::kOutOfMemory, "ACLSHMEM_MALLOC_FAILED"},
      {ACLSHMEM_DL_FUNC_FAILED, StatusCode::kDeviceError, "ACLSHMEM_DL_FUNC_FAILED"},
      {ACLSHMEM_INNER_TIMEOUT, StatusCode::kTimeout, "ACLSHMEM_INNER_TIMEOUT"},
      {ACLSHMEM_UNDER_API_UNLOAD, StatusCode::kDeviceError, "ACLSHMEM_UNDER_API_UNLOAD"},
      {ACLSHMEM_NOT_SUPPORTED, StatusCode::kDeviceError, "ACLSHMEM_NOT_SUPPORTED"},
      {-42, StatusCode::kDeviceError, "unknown"},
  };
  EXPECT_TRUE(ascend::FromShmemCode(ACLSHMEM_SUCCESS, "aclshmem_x").ok());
  for (const CodeCase& c : cases) {
    const Status status = ascend::FromShmemCode(c.code, "aclshmem_x", "pe=1");
    EXPECT_EQ(status.code(), c.expected) << c.name;
    EXPECT_TRUE(Contains(status.message(), "cann_error_code=" + std::to_string(c.code) + " (" + c.name + ") pe=1"))
        << status.message();
    EXPECT_TRUE(Contains(status.message(), "aclshmem_x")) << status.message();
  }
  EXPECT_EQ(ascend::FromShmemCode(ACLSHMEM_INVALID_VALUE, "aclshmem_x").message(),
            "arguments of aclshmem_x must be valid for CANN, but got cann_error_code=-2 (ACLSHMEM_INVALID_VALUE)");
  EXPECT_EQ(ascend::FromShmemCode(ACLSHMEM_TIMEOUT_ERROR, "aclshmem_x", "pe=1").message(),
            "aclshmem_x failed: cann_error_code=-7 (ACLSHMEM_TIMEOUT_ERROR) pe=1");
}

TEST(CannStatusTest, EveryAclCodeMapsAndKeepsTheCode) {
  const CodeCase cases[] = {
      {ACL_ERROR_RT_STREAM_SYNC_TIMEOUT, StatusCode::kTimeout, "ACL_ERROR_RT_STREAM_SYNC_TIMEOUT"},
      {ACL_ERROR_RT_EVENT_SYNC_TIMEOUT, StatusCode::kTimeout, "ACL_ERROR_RT_EVENT_SYNC_TIMEOUT"},
      {ACL_ERROR_RT_WAIT_TIMEOUT, StatusCode::kTimeout, "ACL_ERROR_RT_WAIT_TIMEOUT"},
      {ACL_ERROR_RT_TASK_TIMEOUT, StatusCode::kTimeout, "ACL_ERROR_RT_TASK_TIMEOUT"},
      {ACL_ERROR_RT_MEMORY_ALLOCATION, StatusCode::kOutOfMemory, "ACL_ERROR_RT_MEMORY_ALLOCATION"},
      {ACL_ERROR_RT_DEVICE_OOM, StatusCode::kOutOfMemory, "ACL_ERROR_RT_DEVICE_OOM"},
      {ACL_ERROR_RT_PARAM_INVALID, StatusCode::kInvalidArgument, "ACL_ERROR_RT_PARAM_INVALID"},
      {ACL_ERROR_RT_INVALID_DEVICEID, StatusCode::kInvalidArgument, "ACL_ERROR_RT_INVALID_DEVICEID"},
      {ACL_ERROR_RT_CONTEXT_NULL, StatusCode::kStateError, "ACL_ERROR_RT_CONTEXT_NULL"},
      {ACL_ERROR_RT_INTERNAL_ERROR, StatusCode::kDeviceError, "ACL_ERROR"},
      {ACL_ERROR_RT_AICORE_EXCEPTION, StatusCode::kDeviceError, "ACL_ERROR"},
  };
  EXPECT_TRUE(ascend::FromAclError(ACL_SUCCESS, "aclrtX").ok());
  for (const CodeCase& c : cases) {
    const Status status = ascend::FromAclError(c.code, "aclrtX", "stream=0x1");
    EXPECT_EQ(status.code(), c.expected) << c.name;
    EXPECT_TRUE(Contains(status.message(), "cann_error_code=" + std::to_string(c.code) + " (" + c.name + ")"))
        << status.message();
  }
}

}  // namespace
}  // namespace hp::shmem
