"""Hu et al.'s subspace similarity (lecture_pkg.lora.subspace_similarity) against principal
angles from SciPy, closed forms and the random-subspace expectation."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lecture_pkg.lora import subspace_similarity, subspace_similarity_grid


def _reference(a1: np.ndarray, a2: np.ndarray, i: int, j: int) -> float:
    # NumPy SVD for the bases, SciPy's principal angles: mean of cos^2 over min(i, j) angles
    u = np.linalg.svd(a1, full_matrices=False)[2][:i].T
    v = np.linalg.svd(a2, full_matrices=False)[2][:j].T
    angles = scipy.linalg.subspace_angles(u, v)
    assert len(angles) == min(i, j)
    return float(np.sum(np.cos(angles) ** 2) / min(i, j))


@settings(max_examples=40, deadline=None)
@given(r1=st.integers(1, 8), r2=st.integers(1, 12), d=st.integers(12, 40),
       seed=st.integers(0, 2**16), data=st.data())
def test_matches_principal_angles(r1: int, r2: int, d: int, seed: int, data) -> None:
    gen = torch.Generator().manual_seed(seed)
    a1 = torch.randn(r1, d, generator=gen, dtype=torch.float64)
    # share some directions, so that the overlap is far from both 0 and 1
    shared = min(r1, r2 // 2)
    a2 = torch.cat([a1[:shared], torch.randn(r2 - shared, d, generator=gen,
                                            dtype=torch.float64)])
    i, j = data.draw(st.integers(1, r1)), data.draw(st.integers(1, r2))
    expected = _reference(a1.numpy(), a2.numpy(), i, j)
    assert subspace_similarity(a1, a2, i, j) == pytest.approx(expected, abs=1e-10)
    assert subspace_similarity(a2, a1, j, i) == pytest.approx(expected, abs=1e-10)
    grid = subspace_similarity_grid(a1, a2)
    assert grid.shape == (r1, r2)
    assert grid[i - 1, j - 1].item() == pytest.approx(expected, abs=1e-10)
    assert 0 <= grid.min() and grid.max() <= 1 + 1e-12


def test_closed_forms() -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(8, 64, generator=gen)
    mixed = torch.randn(8, 8, generator=gen) @ a  # the same row space, other singular vectors
    assert subspace_similarity(a, a, 8, 8) == pytest.approx(1, abs=1e-12)
    assert subspace_similarity(a, a, 3, 3) == pytest.approx(1, abs=1e-12)
    assert subspace_similarity(a, mixed, 8, 8) == pytest.approx(1, abs=1e-10)
    # nested: the 8-dim row space of a lies inside the 20-dim one of `bigger`
    bigger = torch.cat([mixed, torch.randn(12, 64, generator=gen)])
    assert subspace_similarity(a, bigger, 8, 20) == pytest.approx(1, abs=1e-10)
    # orthogonal: rows on the first 32 coordinates against rows on the last 32
    left, right = torch.zeros(4, 64), torch.zeros(6, 64)
    left[:, :32] = torch.randn(4, 32, generator=gen)
    right[:, 32:] = torch.randn(6, 32, generator=gen)
    assert subspace_similarity(left, right, 4, 6) == pytest.approx(0, abs=1e-12)
    # one shared direction out of min(i, j) = 2: phi = 1 / 2
    e = torch.eye(10)
    assert subspace_similarity(e[[0, 1]] * torch.tensor([[2.0], [1.0]]),
                               e[[0, 5, 6]] * torch.tensor([[3.0], [2.0], [1.0]]),
                               2, 3) == pytest.approx(0.5, abs=1e-12)


def test_random_subspaces_expectation_is_max_over_d() -> None:
    d, gen = 96, torch.Generator().manual_seed(1)
    fixed = torch.randn(16, d, generator=gen, dtype=torch.float64)
    for i, j in ((1, 16), (4, 16), (8, 8)):
        values = [subspace_similarity(torch.randn(8, d, generator=gen, dtype=torch.float64),
                                      fixed, i, j) for _ in range(400)]
        assert np.mean(values) == pytest.approx(max(i, j) / d, rel=0.1)


def test_scale_and_dtype_do_not_matter() -> None:
    gen = torch.Generator().manual_seed(2)
    a1, a2 = torch.randn(5, 30, generator=gen), torch.randn(9, 30, generator=gen)
    phi = subspace_similarity(a1, a2, 3, 7)
    assert subspace_similarity(1e-3 * a1, 50 * a2, 3, 7) == pytest.approx(phi, abs=1e-6)
    assert subspace_similarity(a1.double(), a2.bfloat16(), 3, 7) == pytest.approx(phi, abs=0.05)


def test_errors_name_the_argument() -> None:
    a1, a2 = torch.randn(4, 16), torch.randn(8, 16)
    with pytest.raises(ValueError, match="but a2 has 12"):
        subspace_similarity(a1, torch.randn(8, 12), 1, 1)
    with pytest.raises(ValueError, match="a1 must be a 2-D"):
        subspace_similarity(torch.randn(16), a2, 1, 1)
    with pytest.raises(TypeError, match="a2 must have a floating dtype"):
        subspace_similarity(a1, torch.ones(8, 16, dtype=torch.long), 1, 1)
    with pytest.raises(ValueError, match="i must be <= min"):
        subspace_similarity(a1, a2, 5, 1)
    with pytest.raises(ValueError, match="j must be positive"):
        subspace_similarity(a1, a2, 1, 0)
    with pytest.raises(TypeError, match="i must be an int"):
        subspace_similarity(a1, a2, 1.0, 1)
    rank_two = torch.randn(4, 2) @ torch.randn(2, 16)
    with pytest.raises(ValueError, match="a1 has numerical rank 2"):
        subspace_similarity(rank_two, a2, 3, 1)
    assert 0 <= subspace_similarity(rank_two, a2, 2, 1) <= 1
    with pytest.raises(ValueError, match="a2 has numerical rank 0"):
        subspace_similarity_grid(a1, torch.zeros(8, 16))
