// Atomic access to plain integers that live in memory shared between processes.
//
// std::atomic cannot be placed over bytes another process created, so the host device uses the GCC builtins
// on naturally aligned integers, which are lock-free for 4- and 8-byte words on every supported target.
#pragma once

#include <cstdint>

namespace hp::shmem::host {

template <typename T>
inline T LoadAcquire(const T* address) {
  return __atomic_load_n(address, __ATOMIC_ACQUIRE);
}
template <typename T>
inline T LoadSeqCst(const T* address) {
  return __atomic_load_n(address, __ATOMIC_SEQ_CST);
}
template <typename T>
inline void StoreSeqCst(T* address, T value) {
  __atomic_store_n(address, value, __ATOMIC_SEQ_CST);
}
template <typename T>
inline T FetchAddSeqCst(T* address, T value) {
  return __atomic_fetch_add(address, value, __ATOMIC_SEQ_CST);
}
inline void FullFence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace hp::shmem::host
