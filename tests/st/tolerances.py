"""Tolerances of floating-point results, derived from the dtype and the length of the reductions.

Two computations of the same sums in different orders (blocked kernels, another BLAS, another CPU) round
differently. Each sum of ``n`` terms is within ``gamma_n * sum(|term|)`` of the exact sum, where
``gamma_n = n*u / (1 - n*u)`` and ``u`` is the dtype's unit roundoff (Higham, Accuracy and Stability of Numerical
Algorithms, §3.1 and §3.5); two such results differ by at most twice that. The bounds hold on every machine, so
a test that uses them does not depend on the CPU it runs on.
"""

from __future__ import annotations

import torch


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the distance from 1 to the next representable number of ``dtype`` (2^-24 for float32)."""
    return torch.finfo(dtype).eps / 2


def gamma(terms: int, dtype: torch.dtype) -> float:
    """``gamma_n`` for sums of ``terms`` terms accumulated in ``dtype``."""
    nu = terms * unit_roundoff(dtype)
    assert nu < 1, f"{terms} terms are too many for a bound in {dtype}"
    return nu / (1 - nu)


def assert_sums_close(ours: torch.Tensor, reference: torch.Tensor, terms: int, what: str) -> None:
    """``ours`` equals ``reference`` up to the order of sums of at most ``terms`` terms (every rounding step on
    the longest path counted where values pass through several layers), norm-wise: each element within
    ``2 * gamma_terms`` of itself plus ``2 * gamma_terms * max|reference|``."""
    bound = 2 * gamma(terms, reference.dtype)
    scale = reference.abs().max().item() if reference.numel() else 0.0
    torch.testing.assert_close(ours, reference, rtol=bound, atol=bound * scale, msg=lambda m: f"{what}: {m}")


def assert_matmul_close(ours: torch.Tensor, a: torch.Tensor, b: torch.Tensor, what: str = "matmul") -> None:
    """``ours`` equals ``a @ b`` to rounding: elementwise within ``2 * gamma_k * (|a| @ |b|)``, k = a's columns."""
    reference = a @ b
    bound = 2 * gamma(a.shape[-1], a.dtype) * (a.abs() @ b.abs())
    excess = (ours - reference).abs() - bound
    assert (excess <= 0).all(), f"{what}: beyond rounding by up to {excess.max().item():g} at {(excess > 0).nonzero()[:5]}"
