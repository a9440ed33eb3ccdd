"""Core components of HyperParallel."""
