"""MultiCore components: the SHMEM runtime lives in :mod:`hyper_parallel.core.multicore.shmem`."""
