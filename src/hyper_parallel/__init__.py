"""HyperParallel SHMEM: symmetric memory and one-sided communication for PyTorch."""

__version__ = "0.1.0"
