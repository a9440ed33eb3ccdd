"""HyperParallel SHMEM: symmetric memory and one-sided communication for PyTorch and MindSpore."""

__version__ = "0.1.0"
