// The teams and their collectives (runtime/team.h, runtime/collectives/engine.h): the binding's entries, the
// small-message ones without pybind11's dispatcher (fast_call.h).
#pragma once

#include <pybind11/pybind11.h>

namespace hp::shmem::torch_binding {

// Adds plain_eager, team_create, team_release, team_describe, team_barrier, all_gather, all_reduce, reduce_scatter,
// all_to_all, send, recv, agree, refuse and give_up to `m`.
void RegisterTeams(pybind11::module_& m);

}  // namespace hp::shmem::torch_binding
