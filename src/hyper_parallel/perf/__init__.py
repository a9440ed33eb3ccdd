"""``hp-shmem-perf``: nccl-tests-style bandwidth and latency of HyperParallel SHMEM, beside gloo's.

Run ``hp-shmem-perf --help`` (or ``python -m hyper_parallel.perf --help``); ``docs/perf.md`` explains the
columns and the method. Modules:

* :mod:`.config` the command line, :mod:`.launch` the local ranks, :mod:`.cli` the entry point, :mod:`.mpi`
  running under mpiexec and MPI's side (``--baseline gloo,mpi``);
* :mod:`.ops` the table of operations and their nccl-tests accounting, :mod:`.cases` how each rank runs them;
* :mod:`.timing` the one timing loop, :mod:`.runner` one rank's run;
* :mod:`.report` the table, JSON and plot, :mod:`.progress` the progress bar, :mod:`.units` sizes and types;
* :mod:`.mindspore` the MindSpore sibling (``python -m hyper_parallel.perf.mindspore`` under msrun): ours beside
  mccl, on the same timing loop, accounting and table.

Importing this package imports no torch: the launcher starts fast and checks its flags first.
"""
