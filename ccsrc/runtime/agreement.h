// Making rank-local outcomes of a collective step the same on every rank.
#pragma once

#include "runtime/bootstrap.h"
#include "runtime/status.h"

namespace hp::shmem {

// Exchanges every rank's `local` outcome of `step` over `bootstrap` and returns the same Status on every rank: OK
// when every rank succeeded, otherwise the failure of the lowest failed rank, as
// "<step> failed: rank=<r> (<its message>)" with its code. A rank that failed alone thus never leaves the others
// waiting in the next collective step.
Status AgreeOnStatus(Bootstrap& bootstrap, const Status& local, const char* step);

}  // namespace hp::shmem
