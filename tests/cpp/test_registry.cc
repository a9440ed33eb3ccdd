#include "runtime/registry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "runtime/logging.h"
#include "test_support.h"

namespace hp::shmem {
namespace {

constexpr std::uintptr_t kBase = 0x7f0000000000;

using testutil::Contains;

TEST(RegistryTest, StateNames) {
  EXPECT_STREQ(AllocationStateName(AllocationState::kActive), "active");
  EXPECT_STREQ(AllocationStateName(AllocationState::kLeaked), "leaked");
  EXPECT_STREQ(AllocationStateName(AllocationState::kFreed), "freed");
}

TEST(RegistryTest, RegisterRecordsEveryField) {
  AllocationRegistry registry;
  const std::uint64_t expected = AllocationRegistry::PeekNextId();
  const std::uint64_t id = registry.Register(3, kBase + 0x40, 0x40, 100, 128, "train.py:12");
  EXPECT_GT(id, 0u);
  EXPECT_EQ(id, expected);
  EXPECT_EQ(AllocationRegistry::PeekNextId(), id + 1);

  Result<AllocationInfo> info = registry.Get(id);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->id, id);
  EXPECT_EQ(info->lifecycle, 3u);
  EXPECT_EQ(info->base, kBase + 0x40);
  EXPECT_EQ(info->offset, 0x40u);
  EXPECT_EQ(info->bytes, 100u);
  EXPECT_EQ(info->reserved, 128u);
  EXPECT_EQ(info->state, AllocationState::kActive);
  EXPECT_EQ(info->call_site, "train.py:12");
}

TEST(RegistryTest, IdsAreMonotonicAndSurviveReset) {
  AllocationRegistry registry;
  const std::uint64_t a = registry.Register(1, kBase, 0, 64, 64, "");
  const std::uint64_t b = registry.Register(1, kBase + 64, 64, 64, 64, "");
  EXPECT_GT(b, a);
  ASSERT_TRUE(registry.MarkFreed(b).ok());
  registry.Reset();
  // The heap may hand the same address out again; the id is still new.
  const std::uint64_t c = registry.Register(2, kBase, 0, 64, 64, "");
  EXPECT_GT(c, b);
  AllocationRegistry other;   // the counter is process-wide, not per registry
  const std::uint64_t d = other.Register(1, kBase, 0, 64, 64, "");
  EXPECT_GT(d, c);
}

TEST(RegistryTest, FreeAndDoubleFree) {
  AllocationRegistry registry;
  const std::uint64_t id = registry.Register(1, kBase, 0, 4096, 4096, "");
  Result<AllocationInfo> freed = registry.MarkFreed(id);
  ASSERT_TRUE(freed.ok()) << freed.status().ToString();
  EXPECT_EQ(freed->id, id);
  EXPECT_EQ(freed->state, AllocationState::kFreed);
  EXPECT_EQ(freed->bytes, 4096u);
  EXPECT_TRUE(registry.Active().empty());
  EXPECT_EQ(registry.allocated_bytes(), 0u);

  Result<AllocationInfo> again = registry.MarkFreed(id);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kStateError);
  EXPECT_EQ(again.status().message(), "allocation was already freed: allocation_id=" + std::to_string(id));

  Result<AllocationInfo> get = registry.Get(id);
  ASSERT_FALSE(get.ok());
  EXPECT_EQ(get.status().code(), StatusCode::kStateError);
  EXPECT_EQ(get.status().message(), "allocation was already freed: allocation_id=" + std::to_string(id));
}

TEST(RegistryTest, FreeOfUnknownId) {
  AllocationRegistry registry;
  const std::uint64_t future = AllocationRegistry::PeekNextId() + 1000;
  for (std::uint64_t id : {std::uint64_t{0}, future}) {
    Result<AllocationInfo> result = registry.MarkFreed(id);
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.status().code(), StatusCode::kStateError);
    EXPECT_EQ(result.status().message(), "allocation is not registered: allocation_id=" + std::to_string(id));
  }
  // An id from before the last Reset belongs to an ended lifecycle: not registered here any more.
  const std::uint64_t old = registry.Register(1, kBase, 0, 64, 64, "");
  registry.Reset();
  Result<AllocationInfo> stale = registry.MarkFreed(old);
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.status().message(), "allocation is not registered: allocation_id=" + std::to_string(old));
}

TEST(RegistryTest, StorageReleaseLeaksAnActiveAllocation) {
  AllocationRegistry registry;
  const std::uint64_t kept = registry.Register(1, kBase, 0, 64, 64, "a.py:1");
  const std::uint64_t lost = registry.Register(1, kBase + 64, 64, 100, 128, "a.py:2");
  EXPECT_EQ(registry.allocated_bytes(), 192u);

  EXPECT_TRUE(registry.MarkStorageReleased(lost));
  EXPECT_FALSE(registry.MarkStorageReleased(lost));   // already leaked: logged once only
  EXPECT_EQ(registry.allocated_bytes(), 192u);        // the heap block is still reserved

  std::vector<AllocationInfo> leaked = registry.Leaked();
  ASSERT_EQ(leaked.size(), 1u);
  EXPECT_EQ(leaked[0].id, lost);
  EXPECT_EQ(leaked[0].state, AllocationState::kLeaked);
  EXPECT_EQ(leaked[0].call_site, "a.py:2");
  std::vector<AllocationInfo> active = registry.Active();
  ASSERT_EQ(active.size(), 1u);
  EXPECT_EQ(active[0].id, kept);

  Result<AllocationInfo> get = registry.Get(lost);
  ASSERT_TRUE(get.ok());
  EXPECT_EQ(get->state, AllocationState::kLeaked);

  // A leaked allocation can no longer be freed, nor found by address.
  Result<AllocationInfo> free_leaked = registry.MarkFreed(lost);
  ASSERT_FALSE(free_leaked.ok());
  EXPECT_EQ(free_leaked.status().code(), StatusCode::kStateError);
  EXPECT_EQ(free_leaked.status().message(), "allocation was leaked (its storage was released before free): "
                                            "allocation_id=" + std::to_string(lost));
  EXPECT_FALSE(registry.FindActive(kBase + 64, 8).ok());
}

TEST(RegistryTest, StorageReleaseIsIgnoredAfterFreeAndForUnknownIds) {
  AllocationRegistry registry;
  const std::uint64_t id = registry.Register(1, kBase, 0, 64, 64, "");
  ASSERT_TRUE(registry.MarkFreed(id).ok());
  EXPECT_FALSE(registry.MarkStorageReleased(id));
  EXPECT_FALSE(registry.MarkStorageReleased(AllocationRegistry::PeekNextId() + 5));
  EXPECT_TRUE(registry.Leaked().empty());
  EXPECT_EQ(registry.allocated_bytes(), 0u);
}

TEST(RegistryTest, LeakTableIsOrderedById) {
  AllocationRegistry registry;
  std::vector<std::uint64_t> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(registry.Register(1, kBase + 64 * i, 64 * i, 64, 64, ""));
  EXPECT_TRUE(registry.MarkStorageReleased(ids[3]));
  EXPECT_TRUE(registry.MarkStorageReleased(ids[0]));
  EXPECT_TRUE(registry.MarkStorageReleased(ids[4]));
  std::vector<AllocationInfo> leaked = registry.Leaked();
  ASSERT_EQ(leaked.size(), 3u);
  EXPECT_EQ(leaked[0].id, ids[0]);
  EXPECT_EQ(leaked[1].id, ids[3]);
  EXPECT_EQ(leaked[2].id, ids[4]);
  std::vector<AllocationInfo> active = registry.Active();
  ASSERT_EQ(active.size(), 2u);
  EXPECT_EQ(active[0].id, ids[1]);
  EXPECT_EQ(active[1].id, ids[2]);
  registry.Reset();
  EXPECT_TRUE(registry.Leaked().empty());
  EXPECT_TRUE(registry.Active().empty());
}

TEST(RegistryTest, AllocatedBytesAndHighWaterMark) {
  AllocationRegistry registry;
  EXPECT_EQ(registry.allocated_bytes(), 0u);
  EXPECT_EQ(registry.max_allocated_bytes(), 0u);
  const std::uint64_t a = registry.Register(1, kBase, 0, 1000, 1024, "");
  const std::uint64_t b = registry.Register(1, kBase + 1024, 1024, 10, 64, "");
  EXPECT_EQ(registry.allocated_bytes(), 1088u);
  EXPECT_EQ(registry.max_allocated_bytes(), 1088u);
  ASSERT_TRUE(registry.MarkFreed(a).ok());
  EXPECT_EQ(registry.allocated_bytes(), 64u);
  EXPECT_EQ(registry.max_allocated_bytes(), 1088u);
  EXPECT_TRUE(registry.MarkStorageReleased(b));   // leaked bytes still count
  EXPECT_EQ(registry.allocated_bytes(), 64u);
  registry.Register(1, kBase, 0, 2048, 2048, "");
  EXPECT_EQ(registry.allocated_bytes(), 2112u);
  EXPECT_EQ(registry.max_allocated_bytes(), 2112u);
  registry.Reset();
  EXPECT_EQ(registry.allocated_bytes(), 0u);
  EXPECT_EQ(registry.max_allocated_bytes(), 0u);
  registry.Register(2, kBase, 0, 64, 64, "");
  EXPECT_EQ(registry.max_allocated_bytes(), 64u);
}

TEST(RegistryTest, FindActiveInside) {
  AllocationRegistry registry;
  const std::uint64_t a = registry.Register(1, kBase, 0, 4096, 4096, "");
  const std::uint64_t b = registry.Register(1, kBase + 4096, 4096, 100, 128, "");
  struct Case {
    std::uintptr_t address;
    std::size_t bytes;
    std::uint64_t id;
  };
  const Case cases[] = {
      {kBase, 4096, a},           {kBase, 1, a},          {kBase + 4000, 96, a}, {kBase + 4095, 1, a},
      {kBase + 4096, 100, b},     {kBase + 4096, 0, b},   {kBase + 4150, 46, b}, {kBase + 4196, 0, b},
      {kBase + 100, 0, a},
  };
  for (const Case& c : cases) {
    Result<AllocationInfo> found = registry.FindActive(c.address, c.bytes);
    ASSERT_TRUE(found.ok()) << Hex(c.address) << " " << c.bytes << ": " << found.status().ToString();
    EXPECT_EQ(found->id, c.id) << Hex(c.address);
  }
}

TEST(RegistryTest, FindActivePastTheEnd) {
  AllocationRegistry registry;
  const std::uint64_t id = registry.Register(1, kBase, 0, 4096, 4096, "");
  Result<AllocationInfo> result = registry.FindActive(kBase + 4000, 200);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(result.status().message(),
            "`tensor` must lie inside its symmetric allocation, but got bytes [" + Hex(kBase + 4000) + "," +
                Hex(kBase + 4200) + ") past the end of allocation_id=" + std::to_string(id) + " (base=" +
                Hex(kBase) + " bytes=4096)");

  // A range whose end would wrap around the address space is past the end too, not inside.
  Result<AllocationInfo> wrap = registry.FindActive(kBase + 8, static_cast<std::size_t>(-1));
  ASSERT_FALSE(wrap.ok());
  EXPECT_TRUE(Contains(wrap.status().message(), "past the end of allocation_id=" + std::to_string(id)));
}

TEST(RegistryTest, FindActiveInTheReservedTailIsPastTheEnd) {
  AllocationRegistry registry;
  const std::uint64_t id = registry.Register(1, kBase, 0, 100, 128, "");
  Result<AllocationInfo> result = registry.FindActive(kBase + 110, 4);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().message(),
            "`tensor` must lie inside its symmetric allocation, but got bytes [" + Hex(kBase + 110) + "," +
                Hex(kBase + 114) + ") past the end of allocation_id=" + std::to_string(id) + " (base=" +
                Hex(kBase) + " bytes=100)");
}

TEST(RegistryTest, FindActiveOutside) {
  AllocationRegistry registry;
  registry.Register(1, kBase + 0x1000, 0x1000, 64, 64, "");
  registry.Register(1, kBase + 0x3000, 0x3000, 64, 64, "");
  for (std::uintptr_t address : {kBase, kBase + 0x2000, kBase + 0x1040 + 1, kBase + 0x4000, std::uintptr_t{0}}) {
    Result<AllocationInfo> result = registry.FindActive(address, 4);
    ASSERT_FALSE(result.ok()) << Hex(address);
    EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(result.status().message(), "`tensor` must be a symmetric tensor allocated by shmem.empty, but got an "
                                         "address " + Hex(address) + " outside every active allocation");
  }
  AllocationRegistry empty;
  Result<AllocationInfo> none = empty.FindActive(kBase, 0);
  ASSERT_FALSE(none.ok());
  EXPECT_TRUE(Contains(none.status().message(), "outside every active allocation"));
}

TEST(RegistryTest, FindActiveZeroByteAllocation) {
  AllocationRegistry registry;
  const std::uint64_t before = registry.Register(1, kBase, 0, 64, 64, "");
  const std::uint64_t zero = registry.Register(1, kBase + 64, 64, 0, 64, "");
  const std::uint64_t after = registry.Register(1, kBase + 128, 128, 64, 64, "");
  Result<AllocationInfo> found = registry.FindActive(kBase + 64, 0);
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(found->id, zero);
  EXPECT_EQ(found->bytes, 0u);
  // Reading a byte of a zero-byte allocation runs past its end.
  Result<AllocationInfo> one = registry.FindActive(kBase + 64, 1);
  ASSERT_FALSE(one.ok());
  EXPECT_TRUE(Contains(one.status().message(), "past the end of allocation_id=" + std::to_string(zero) +
                                                   " (base=" + Hex(kBase + 64) + " bytes=0)"));
  EXPECT_EQ(registry.FindActive(kBase, 64)->id, before);
  EXPECT_EQ(registry.FindActive(kBase + 128, 0)->id, after);
}

TEST(RegistryTest, FindActiveAfterFreeAndReuseOfTheAddress) {
  AllocationRegistry registry;
  const std::uint64_t first = registry.Register(1, kBase, 0, 64, 64, "");
  ASSERT_TRUE(registry.MarkFreed(first).ok());
  EXPECT_FALSE(registry.FindActive(kBase, 8).ok());
  const std::uint64_t second = registry.Register(1, kBase, 0, 64, 64, "");
  Result<AllocationInfo> found = registry.FindActive(kBase, 8);
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(found->id, second);
  EXPECT_NE(first, second);
}

// ContainsActive is FindActive's answer without the error: the same on every range around allocations of every kind
// (a zero-byte one, a reserved tail, a freed one, a gap), wrapping ranges included.
TEST(RegistryTest, ContainsActiveAnswersAsFindActive) {
  AllocationRegistry registry;
  registry.Register(1, kBase, 0, 100, 128, "");
  registry.Register(1, kBase + 128, 128, 0, 64, "");
  const std::uint64_t freed = registry.Register(1, kBase + 192, 192, 64, 64, "");
  registry.Register(1, kBase + 320, 320, 64, 64, "");
  ASSERT_TRUE(registry.MarkFreed(freed).ok());
  EXPECT_FALSE(AllocationRegistry().ContainsActive(kBase, 0));
  int inside = 0;
  for (std::uintptr_t address = kBase - 8; address < kBase + 400; address += 4) {
    for (std::size_t bytes : {std::size_t{0}, std::size_t{1}, std::size_t{4}, std::size_t{28}, std::size_t{64},
                              std::size_t{100}, static_cast<std::size_t>(-1)}) {
      const bool found = registry.FindActive(address, bytes).ok();
      EXPECT_EQ(registry.ContainsActive(address, bytes), found) << Hex(address) << " " << bytes;
      inside += found ? 1 : 0;
    }
  }
  EXPECT_GT(inside, 0);
}

TEST(RegistryTest, ForgetDropsTheRecordButNotTheId) {
  AllocationRegistry registry;
  const std::uint64_t id = registry.Register(1, kBase, 0, 64, 128, "");
  registry.Forget(id);
  EXPECT_TRUE(registry.Active().empty());
  EXPECT_EQ(registry.allocated_bytes(), 0u);
  EXPECT_FALSE(registry.FindActive(kBase, 8).ok());
  Result<AllocationInfo> get = registry.Get(id);
  ASSERT_FALSE(get.ok());
  EXPECT_EQ(get.status().message(), "allocation is not registered: allocation_id=" + std::to_string(id));
  // Forgotten, not freed: a later free names it unknown.
  Result<AllocationInfo> free = registry.MarkFreed(id);
  ASSERT_FALSE(free.ok());
  EXPECT_EQ(free.status().message(), "allocation is not registered: allocation_id=" + std::to_string(id));
  EXPECT_FALSE(registry.MarkStorageReleased(id));
  registry.Forget(id);   // forgetting twice is harmless
  const std::uint64_t next = registry.Register(1, kBase, 0, 64, 128, "");
  EXPECT_GT(next, id);
}

TEST(RegistryTest, ConcurrentRegistrationGivesUniqueIds) {
  AllocationRegistry registry;
  constexpr int kThreads = 8;
  constexpr int kPerThread = 500;
  std::vector<std::vector<std::uint64_t>> ids(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&registry, &ids, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const std::uintptr_t base = kBase + (static_cast<std::uintptr_t>(t) * kPerThread + i) * 64;
        const std::uint64_t id = registry.Register(1, base, 0, 64, 64, "");
        ids[t].push_back(id);
        if (i % 3 == 0) {
          EXPECT_TRUE(registry.MarkFreed(id).ok());
        } else if (i % 3 == 1) {
          EXPECT_TRUE(registry.FindActive(base, 64).ok());
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  std::set<std::uint64_t> unique;
  for (const auto& per_thread : ids) {
    EXPECT_TRUE(std::is_sorted(per_thread.begin(), per_thread.end()));   // monotonic within a thread
    unique.insert(per_thread.begin(), per_thread.end());
  }
  EXPECT_EQ(unique.size(), static_cast<std::size_t>(kThreads * kPerThread));
  const std::size_t freed_per_thread = (kPerThread + 2) / 3;
  const std::size_t live = static_cast<std::size_t>(kThreads) * (kPerThread - freed_per_thread);
  EXPECT_EQ(registry.Active().size(), live);
  EXPECT_EQ(registry.allocated_bytes(), live * 64);
}

}  // namespace
}  // namespace hp::shmem
