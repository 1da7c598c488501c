"""Nadaraya-Watson against an explicit-loop float64 reference, plus its invariants and errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from lecture_pkg.kernel_regression import KERNELS, NadarayaWatson, kernel_profile, nadaraya_watson

PROFILES = {
    "gaussian": lambda u: math.exp(-u * u / 2),
    "laplace": lambda u: math.exp(-u),
    "boxcar": lambda u: 1.0 if u <= 1 else 0.0,
    "epanechnikov": lambda u: max(0.0, 1 - u * u),
}


def reference(xq: np.ndarray, xk: np.ndarray, yv: np.ndarray, kernel: str, h: float) -> tuple[np.ndarray, np.ndarray]:
    """Textbook formula, one query and one key at a time, in float64 (no softmax, no vectors)."""
    weights = np.zeros((len(xq), len(xk)))
    for i, x in enumerate(xq):
        k = [PROFILES[kernel](math.sqrt(sum((a - b) ** 2 for a, b in zip(x, key))) / h) for key in xk]
        weights[i] = np.array(k) / sum(k)
    return weights @ yv, weights


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("d", [1, 3])
def test_matches_float64_reference(kernel: str, d: int) -> None:
    rng = np.random.default_rng(d)
    xq, xk, yv = rng.normal(size=(15, d)), rng.normal(size=(25, d)), rng.normal(size=(25, 2))
    h = 3.0  # wide enough that every query has points inside the compact supports
    pred, w = nadaraya_watson(torch.from_numpy(xq), torch.from_numpy(xk), torch.from_numpy(yv), kernel, h)
    ref_pred, ref_w = reference(xq, xk, yv, kernel, h)
    np.testing.assert_allclose(w.numpy(), ref_w, atol=1e-12)
    np.testing.assert_allclose(pred.numpy(), ref_pred, atol=1e-12)


def test_slides_example() -> None:
    """Laplace kernel = softmax of the negative distance; the lecture's three visible points."""
    pred, w = nadaraya_watson(torch.tensor([4.25], dtype=torch.float64),
                              torch.tensor([1.36, 3.40, 6.05], dtype=torch.float64),
                              torch.tensor([1.79, -1.77, -2.17], dtype=torch.float64), "laplace", 1.0)
    scores = torch.tensor([-2.89, -0.85, -1.80], dtype=torch.float64)
    assert torch.allclose(w[0], torch.softmax(scores, 0))
    assert round(pred.item(), 4) == -1.5668


def test_vector_shapes() -> None:
    pred, w = nadaraya_watson(torch.randn(4), torch.randn(6), torch.randn(6))
    assert pred.shape == (4,) and w.shape == (4, 6)
    pred, w = nadaraya_watson(torch.randn(4, 2), torch.randn(6, 2), torch.randn(6, 5))
    assert pred.shape == (4, 5) and w.shape == (4, 6)


finite = st.floats(-50, 50, allow_nan=False, width=64)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), kernel=st.sampled_from(KERNELS), h=st.floats(0.05, 20))
def test_properties(data: st.DataObject, kernel: str, h: float) -> None:
    n = data.draw(st.integers(1, 12))
    m = data.draw(st.integers(1, 6))
    xk = torch.from_numpy(data.draw(arrays(np.float64, (n,), elements=finite)))
    yv = torch.from_numpy(data.draw(arrays(np.float64, (n,), elements=finite)))
    xq = torch.from_numpy(data.draw(arrays(np.float64, (m,), elements=finite)))
    pred, w = nadaraya_watson(xq, xk, yv, kernel, h)
    assert torch.isfinite(pred).all() and (w >= 0).all()
    assert torch.allclose(w.sum(-1), torch.ones(m, dtype=torch.float64))
    # a convex combination stays inside the values' hull
    assert (pred >= yv.min() - 1e-9).all() and (pred <= yv.max() + 1e-9).all()
    perm = torch.from_numpy(np.random.default_rng(n).permutation(n))
    pred_p, w_p = nadaraya_watson(xq, xk[perm], yv[perm], kernel, h)
    assert torch.allclose(pred, pred_p, atol=1e-9) and torch.allclose(w[:, perm], w_p, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_dtype_and_device_follow_inputs(dtype: torch.dtype) -> None:
    x = torch.linspace(0, 1, 8, dtype=dtype)
    pred, w = nadaraya_watson(x, x, x, "gaussian", 0.3)
    assert pred.dtype == dtype and w.dtype == dtype and pred.device == x.device
    assert torch.isfinite(pred).all()


@pytest.mark.gpu
def test_runs_on_cuda() -> None:
    x = torch.rand(64, 3, device="cuda")
    pred, w = nadaraya_watson(x, x, x[:, 0])
    ref = nadaraya_watson(x.cpu().double(), x.cpu().double(), x[:, 0].cpu().double())[0]
    assert pred.device.type == "cuda" and torch.allclose(pred.cpu().double(), ref, atol=1e-5)


@pytest.mark.parametrize("kernel", ["boxcar", "epanechnikov"])
def test_empty_support_falls_back_to_nearest_or_raises(kernel: str) -> None:
    xk = torch.tensor([0.0, 1.0, 5.0])
    yv = torch.tensor([1.0, 2.0, 3.0])
    pred, w = nadaraya_watson(torch.tensor([3.2, 0.5]), xk, yv, kernel, bandwidth=1.0)
    assert torch.isfinite(pred).all()
    assert w[0].tolist() == [0.0, 0.0, 1.0]  # 3.2 is nearest to 5.0 (1.8 < 2.2) and sees nothing within 1
    _, w = nadaraya_watson(torch.tensor([3.0]), torch.tensor([1.0, 5.0]), yv[:2], kernel, bandwidth=1.0)
    assert w[0].tolist() == [0.5, 0.5]  # equidistant nearest points share the weight
    with pytest.raises(ValueError, match=r"queries \[0\]"):
        nadaraya_watson(torch.tensor([3.2, 0.5]), xk, yv, kernel, bandwidth=1.0, on_empty="raise")


def test_mask_restricts_and_fully_masked_rows_are_zero() -> None:
    x = torch.tensor([0.0, 1.0, 2.0])
    mask = torch.tensor([[False, True, True], [False, False, False], [True, True, True]])
    pred, w = nadaraya_watson(x, x, torch.tensor([1.0, 2.0, 3.0]), mask=mask)
    assert w[0, 0] == 0 and torch.isclose(w[0].sum(), torch.tensor(1.0))
    assert w[1].tolist() == [0.0, 0.0, 0.0] and pred[1] == 0
    # nearest fallback respects the mask: query 0 may not use itself
    _, w = nadaraya_watson(x, x, x, "boxcar", 0.1, mask=~torch.eye(3, dtype=torch.bool))
    assert w[0].tolist() == [0.0, 1.0, 0.0]


def test_gaussian_on_unit_vectors_is_scaled_dot_product_attention() -> None:
    d = 8
    q = torch.nn.functional.normalize(torch.randn(5, d, dtype=torch.float64), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(7, d, dtype=torch.float64), dim=-1)
    v = torch.randn(7, 3, dtype=torch.float64)
    out, _ = nadaraya_watson(q, k, v, bandwidth=d ** 0.25)
    expected = torch.nn.functional.scaled_dot_product_attention(q[None], k[None], v[None])[0]
    assert torch.allclose(out, expected, atol=1e-12)


def test_kernel_profile() -> None:
    u = torch.tensor([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0])
    assert torch.allclose(kernel_profile("gaussian", u), torch.exp(-u**2 / 2))
    assert torch.allclose(kernel_profile("laplace", u), torch.exp(-u.abs()))
    assert kernel_profile("boxcar", u).tolist() == [0, 1, 1, 1, 1, 1, 0]
    assert torch.allclose(kernel_profile("epanechnikov", u), (1 - u**2).clamp(min=0))


def test_learnable_bandwidth_trains_with_sgd() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(80, generator=gen) * 5
    y = torch.sin(x) + 0.1 * torch.randn(80, generator=gen)
    model = NadarayaWatson(bandwidth=3.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    mask = ~torch.eye(80, dtype=torch.bool)
    losses = []
    for _ in range(60):
        loss = torch.nn.functional.mse_loss(model(x, x, y, mask=mask)[0], y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    assert model.bandwidth.item() < 3.0 and model.attention_weights.shape == (80, 80)
    assert "bandwidth=" in repr(model)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"x_query": torch.randn(3, 2), "x_train": torch.randn(4, 3), "y_train": torch.randn(4)},
         "2 features but x_train has 3"),
        ({"x_query": torch.randn(3), "x_train": torch.randn(4), "y_train": torch.randn(5)},
         "y_train has 5 rows but x_train has 4"),
        ({"x_query": torch.randn(3), "x_train": torch.randn(4), "y_train": torch.randn(4), "bandwidth": 0.0},
         "bandwidth must be positive"),
        ({"x_query": torch.randn(3), "x_train": torch.randn(4), "y_train": torch.randn(4), "bandwidth": -1.0},
         "bandwidth must be positive"),
        ({"x_query": torch.randn(3), "x_train": torch.randn(4), "y_train": torch.randn(4), "kernel": "cosine"},
         "kernel must be one of"),
        ({"x_query": torch.randn(3, 1, 1), "x_train": torch.randn(4), "y_train": torch.randn(4)},
         r"x_query must have shape \(n,\) or \(n, d\)"),
        ({"x_query": torch.randn(3), "x_train": torch.randn(0), "y_train": torch.randn(0)}, "x_train is empty"),
        ({"x_query": torch.randn(3), "x_train": torch.randn(4, dtype=torch.float64), "y_train": torch.randn(4)},
         "share dtype"),
        ({"x_query": torch.randn(3), "x_train": torch.randn(4), "y_train": torch.randn(4),
          "mask": torch.ones(4, 3, dtype=torch.bool)},
         r"shape \(3, 4\)"),
    ],
)
def test_errors_name_the_problem(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        nadaraya_watson(**kwargs)


def test_type_errors() -> None:
    with pytest.raises(TypeError, match="x_query must be a torch.Tensor"):
        nadaraya_watson([1.0], torch.randn(2), torch.randn(2))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="floating dtype"):
        nadaraya_watson(torch.arange(3), torch.arange(3), torch.arange(3))
    with pytest.raises(ValueError, match="bandwidth must be positive"):
        NadarayaWatson(bandwidth=0.0)


LEARNABLE = [k for k in KERNELS if k != "boxcar"]


@pytest.mark.parametrize("kernel", LEARNABLE)
@pytest.mark.parametrize("d", [1, 3])
def test_bandwidth_gradient_is_finite_where_queries_coincide_with_keys(kernel: str, d: int) -> None:
    """sqrt has an infinite derivative at 0: a query equal to a key must not give a NaN gradient,
    with or without a mask over the coinciding pairs, and the gradient must be the true one."""
    gen = torch.Generator().manual_seed(d)
    x = torch.randn(12, d, generator=gen, dtype=torch.float64)
    y = torch.randn(12, generator=gen, dtype=torch.float64)
    queries = torch.cat([x[:5], torch.randn(3, d, generator=gen, dtype=torch.float64)])
    for mask in (None, ~torch.eye(8, 12, dtype=torch.bool)):  # 5 queries sit on keys
        h = torch.tensor(1.3, dtype=torch.float64, requires_grad=True)
        pred, _ = nadaraya_watson(queries, x, y, kernel, h, mask=mask)
        (grad,) = torch.autograd.grad(pred.sum(), h)
        assert torch.isfinite(grad), (kernel, mask is None, grad)
        assert torch.autograd.gradcheck(
            lambda bw: nadaraya_watson(queries, x, y, kernel, bw, mask=mask)[0], (h,))


@pytest.mark.parametrize("kernel", LEARNABLE)
def test_leave_one_out_training_has_finite_gradients(kernel: str) -> None:
    """The chapter's recipe: every point is a query and a key, the diagonal masked out."""
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(40, generator=gen) * 5
    y = torch.sin(x) + 0.1 * torch.randn(40, generator=gen)
    model = NadarayaWatson(kernel, bandwidth=2.0)
    loss = torch.nn.functional.mse_loss(model(x, x, y, mask=~torch.eye(40, dtype=torch.bool))[0], y)
    loss.backward()
    assert torch.isfinite(model.log_bandwidth.grad) and model.log_bandwidth.grad != 0


def test_boxcar_refuses_to_train_but_evaluates() -> None:
    x = torch.rand(10)
    model = NadarayaWatson("boxcar", bandwidth=0.5)
    with pytest.raises(RuntimeError, match="boxcar kernel cannot learn its bandwidth"):
        model(x, x, x)
    with torch.no_grad():
        pred, _ = model(x, x, x)
    model.log_bandwidth.requires_grad_(False)
    assert torch.equal(model(x, x, x)[0], pred)
