// What the collective families share: how a message is cut into parts, and how the rows of the first sync tell
// which path every member takes. Internal to ccsrc/runtime/collectives.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "runtime/team.h"

namespace hp::shmem::collectives {

inline std::size_t RoundDown(std::size_t value, std::size_t unit) { return value / unit * unit; }

// Bounds of part `index` when `count` elements are cut into `parts` near-equal parts.
inline std::pair<std::size_t, std::size_t> Part(std::size_t count, int parts, int index) {
  const std::size_t step = (count + static_cast<std::size_t>(parts) - 1) / static_cast<std::size_t>(parts);
  const std::size_t lo = std::min(static_cast<std::size_t>(index) * step, count);
  return {lo, std::min(lo + step, count)};
}

// What a rank tells its peers about its refusal or its failure: at most a statement's bytes, NUL-terminated.
inline std::vector<char> StatementBytes(const std::string& text) {
  std::vector<char> bytes(kStatementBytes, '\0');
  std::memcpy(bytes.data(), text.data(), std::min(text.size(), kStatementBytes - 1));
  return bytes;
}

// Every member's `column` holds the same heap offset (not -1): peers may address each other's copies of it.
inline bool SameSymmetric(const std::vector<Fingerprint>& rows, int column) {
  const std::int64_t first = rows[0].where[column];
  if (first < 0) return false;
  for (const Fingerprint& row : rows) {
    if (row.where[column] != first) return false;
  }
  return true;
}

// Every member published the address of its `column` tensor: the device reaches their memory, every rank takes the
// path (the rows are the same on every rank).
inline bool EveryAddress(const std::vector<Fingerprint>& rows, int column) {
  for (const Fingerprint& row : rows) {
    if (row.address[column] == 0) return false;
  }
  return true;
}

// [a, a + a_bytes) and [b, b + b_bytes) share a byte.
inline bool Overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  const auto lo_a = reinterpret_cast<std::uintptr_t>(a);
  const auto lo_b = reinterpret_cast<std::uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && lo_a < lo_b + b_bytes && lo_b < lo_a + a_bytes;
}

}  // namespace hp::shmem::collectives
