// The numbering of every enum a face passes across its seam, defined once here and exported to every face: the torch
// binding makes each a function returning a dict (reduce_ops(), ...), the C ABI returns them all as one JSON document
// (hp_shmem_numberings_json), and the Python layers read them from there instead of writing the numbers again.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ops/wire_format.h"
#include "runtime/status.h"
#include "runtime/team.h"

namespace hp::shmem {

// One enum's numbering: its name as the faces export it ("reduce_ops") and every value's (name, number).
struct Numbering {
  const char* name;
  std::vector<std::pair<std::string, int>> values;
};

// status_codes, dtypes, reduce_ops, signal_ops, compare_ops, wire_formats, call_roles, collectives,
// lifecycle_states.
const std::vector<Numbering>& Numberings();

// {"status_codes": {"OK": 0, ...}, "dtypes": {...}, ...}.
std::string NumberingsJson();

// A wire format's number (wire_formats: 0 the tensor's own dtype, else ops::LowFormat + 1, as fingerprints carry it).
Result<std::optional<ops::LowFormat>> WireFromNumber(int wire);
int WireNumber(std::optional<ops::LowFormat> wire);

// A call role's number (call_roles).
Result<CallRole> CallRoleFromNumber(int role);

}  // namespace hp::shmem
