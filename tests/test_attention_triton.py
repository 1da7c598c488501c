"""The Triton FlashAttention kernel (lecture_pkg/kernels) against torch's SDPA.

Two lanes:
* CPU, Triton's interpreter: ``make triton-check`` (TRITON_INTERPRET=1, triton installed) runs
  the kernel's exact code on NumPy at small sizes. float16 only: the interpreter multiplies the
  raw bits of bfloat16 operands in ``tl.dot`` (triton-lang/triton#11584, unsupported upstream).
* GPU (``@pytest.mark.gpu``): float16 and bfloat16 at realistic sizes, on a CUDA device, with the
  autotuned tiles; the backward pass against float64 gradients.
* CPU, no Triton needed: which implementation ``backend="auto"`` dispatches to, with the
  kernel's entry points replaced by recorders (so a dispatch bug cannot hide behind a missing GPU).
Without Triton the kernel tests are skipped; a CPU install never needs it.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F

from lecture_pkg import kernels
from lecture_pkg.attention import flash_attention

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="Triton is not installed")
interpreter = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1" or torch.cuda.is_available()
    or importlib.util.find_spec("triton") is None,
    reason="Triton interpreter lane: run `make triton-check` (TRITON_INTERPRET=1, no GPU)")

SHAPES = [(200, 200), (70, 150), (150, 70), (1, 5)]  # (t_q, t_k): several blocks, ragged ends


def inputs(batch_heads: tuple[int, ...], t_q: int, t_k: int, head_dim: int, dtype: torch.dtype,
           device: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*batch_heads, t, head_dim, generator=gen).to(device=device, dtype=dtype)
               for t in (t_q, t_k, t_k))
    return q, k, v


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool) -> torch.Tensor:
    """torch SDPA in float32 on the same (rounded) inputs."""
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=is_causal)


def gradients(attend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor,
              dtype: torch.dtype | None = None) -> list[torch.Tensor]:
    """(dq, dk, dv) of ``attend(q, k, v)`` for the output gradient grad_out, on leaf copies of
    q, k, v (converted to ``dtype`` when given)."""
    leaves = [x.detach().to(dtype or x.dtype).requires_grad_() for x in (q, k, v)]
    attend(*leaves).backward(grad_out.to(leaves[0].dtype))
    return [x.grad for x in leaves]



class KernelCalls:
    """Stands in for ``kernels.triton_flash_attention``: records its arguments and returns a
    tensor no other implementation would return, so the caller's result shows who computed it."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                 scale: float) -> torch.Tensor:
        self.calls.append({"q": q, "k": k, "v": v, "is_causal": is_causal, "scale": scale})
        return torch.full((*q.shape[:-1], v.shape[-1]), 7.0, dtype=q.dtype)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_auto_dispatches_to_the_triton_kernel_when_it_applies(
        monkeypatch: pytest.MonkeyPatch, is_causal: bool) -> None:
    kernel = KernelCalls()
    monkeypatch.setattr(kernels, "flash_attention_applies", lambda q, k, v: True)
    monkeypatch.setattr(kernels, "triton_flash_attention", kernel)
    q, k, v = inputs((1, 2), 5, 7, 64, torch.float16, "cpu")
    out = flash_attention(q, k, v, is_causal=is_causal, scale=0.3)  # backend="auto"
    assert len(kernel.calls) == 1, "auto did not call the Triton entry point"
    call = kernel.calls[0]
    assert call["q"] is q and call["k"] is k and call["v"] is v
    assert call["is_causal"] is is_causal and call["scale"] == 0.3
    assert torch.equal(out, torch.full((1, 2, 5, 64), 7.0, dtype=torch.float16))
    flash_attention(q, k, v)  # the default scale reaches the kernel as 1/sqrt(d_k)
    assert kernel.calls[1]["scale"] == pytest.approx(1 / 8)


def test_auto_runs_the_loop_when_the_kernel_does_not_apply(
        monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = KernelCalls()
    asked = []
    monkeypatch.setattr(kernels, "flash_attention_applies",
                        lambda q, k, v: asked.append(q.shape) or False)
    monkeypatch.setattr(kernels, "triton_flash_attention", kernel)
    q, k, v = inputs((1, 2), 5, 7, 64, torch.float32, "cpu")
    out = flash_attention(q, k, v)
    assert asked == [q.shape], "auto must ask whether the kernel applies"
    assert not kernel.calls
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))


def test_torch_backend_never_calls_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = KernelCalls()
    monkeypatch.setattr(kernels, "flash_attention_applies", lambda q, k, v: True)
    monkeypatch.setattr(kernels, "triton_flash_attention", kernel)
    q, k, v = inputs((1, 2), 5, 7, 64, torch.float32, "cpu")
    out = flash_attention(q, k, v, backend="torch")
    assert not kernel.calls
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))
    flash_attention(q, k, v, backend="triton")  # an explicit request goes to the kernel
    assert len(kernel.calls) == 1


def test_applies_only_on_cuda() -> None:
    """On a CPU ``auto`` must not pick the kernel, even under the interpreter."""
    q, k, v = inputs((1, 2), 5, 7, 64, torch.float16, "cpu")
    assert not kernels.flash_attention_applies(q, k, v)


@interpreter
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("t_q,t_k", SHAPES)
def test_interpreted_kernel_matches_sdpa(head_dim: int, is_causal: bool, t_q: int, t_k: int) -> None:
    q, k, v = inputs((1, 2), t_q, t_k, head_dim, torch.float16, "cpu")
    out = flash_attention(q, k, v, is_causal=is_causal, backend="triton")
    assert out.dtype == torch.float16 and out.shape == (1, 2, t_q, head_dim)
    # fp16 output rounding (2^-11 relative) plus fp16 probabilities in the second matmul.
    torch.testing.assert_close(out.float(), reference(q, k, v, is_causal), rtol=4e-3, atol=2e-3)


@interpreter
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("t_q,t_k", SHAPES)
def test_interpreted_backward_matches_sdpa_gradients(is_causal: bool, t_q: int, t_k: int) -> None:
    q, k, v = inputs((1, 2), t_q, t_k, 64, torch.float16, "cpu")
    grad_out = inputs((1, 2), t_q, t_q, 64, torch.float16, "cpu", seed=1)[0]
    ours = gradients(lambda *x: flash_attention(*x, is_causal=is_causal, backend="triton"),
                     q, k, v, grad_out)
    exact = gradients(lambda *x: F.scaled_dot_product_attention(*x, is_causal=is_causal),
                      q, k, v, grad_out, dtype=torch.float32)
    for name, mine, expected in zip(("dq", "dk", "dv"), ours, exact):
        assert mine.dtype == torch.float16, name
        # fp16 rounding of P and dS before the tile products, as in the forward's second matmul.
        torch.testing.assert_close(mine.float(), expected, rtol=5e-3, atol=5e-3, msg=name)


@interpreter
def test_interpreted_backward_strided_inputs_and_scale() -> None:
    """(batch, t, heads, d) viewed as (batch, heads, t, d), and a gradient that is not
    contiguous either: the kernels read every tensor through its strides."""
    q, k, v = (x.transpose(1, 2) for x in inputs((2, 96), 3, 3, 64, torch.float16, "cpu"))
    grad_out = inputs((2, 64), 96, 96, 3, torch.float16, "cpu", seed=1)[0].permute(0, 3, 2, 1)
    assert not grad_out.is_contiguous() and grad_out.shape == (2, 3, 96, 64)
    ours = gradients(lambda *x: flash_attention(*x, is_causal=True, scale=0.05, backend="triton"),
                     q, k, v, grad_out)
    exact = gradients(lambda *x: F.scaled_dot_product_attention(*x, is_causal=True, scale=0.05),
                      q, k, v, grad_out, dtype=torch.float32)
    for mine, expected in zip(ours, exact):
        torch.testing.assert_close(mine.float(), expected, rtol=5e-3, atol=5e-3)


@interpreter
def test_length_classes_round_up_to_a_power_of_two_and_stop_at_16k() -> None:
    from lecture_pkg.kernels.flash_attention_triton import length_class

    got = [length_class(t) for t in (1, 2, 3, 1000, 1024, 1025, 16384, 16385, 10**6)]
    assert got == [1, 2, 4, 1024, 1024, 2048, 16384, 16384, 16384]


@interpreter
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_interpreted_kernel_small_tiles_for_older_gpus(monkeypatch: pytest.MonkeyPatch,
                                                      is_causal: bool) -> None:
    from lecture_pkg.kernels import flash_attention_triton

    small = {"BLOCK_Q": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 1}
    assert flash_attention_triton.launch_config(64, torch.device("cpu")) != small
    monkeypatch.setattr(flash_attention_triton, "launch_config", lambda head_dim, device: small)
    q, k, v = inputs((1, 2), 150, 100, 64, torch.float16, "cpu")
    out = flash_attention(q, k, v, is_causal=is_causal, backend="triton")
    torch.testing.assert_close(out.float(), reference(q, k, v, is_causal), rtol=4e-3, atol=2e-3)
    grad_out = inputs((1, 2), 150, 150, 64, torch.float16, "cpu", seed=1)[0]
    ours = gradients(lambda *x: flash_attention(*x, is_causal=is_causal, backend="triton"),
                     q, k, v, grad_out)
    exact = gradients(lambda *x: F.scaled_dot_product_attention(*x, is_causal=is_causal),
                      q, k, v, grad_out, dtype=torch.float32)
    for mine, expected in zip(ours, exact):
        torch.testing.assert_close(mine.float(), expected, rtol=5e-3, atol=5e-3)


@interpreter
def test_interpreted_kernel_strided_inputs_and_scale() -> None:
    # (batch, t, heads, d) transposed to (batch, heads, t, d): non-contiguous, as after a projection.
    q, k, v = (x.transpose(1, 2) for x in inputs((2, 96), 3, 3, 64, torch.float16, "cpu"))
    assert not q.is_contiguous() and q.shape == (2, 3, 96, 64)
    out = flash_attention(q, k, v, is_causal=True, scale=0.05, backend="triton")
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True,
                                              scale=0.05)
    torch.testing.assert_close(out.float(), expected, rtol=4e-3, atol=2e-3)


@interpreter
@pytest.mark.xfail(reason="the interpreter's tl.dot multiplies bfloat16 bit patterns "
                          "(triton-lang/triton#11584); bfloat16 is checked on the GPU")
def test_interpreted_kernel_bfloat16() -> None:
    q, k, v = inputs((1, 2), 70, 150, 64, torch.bfloat16, "cpu")
    out = flash_attention(q, k, v, backend="triton")
    torch.testing.assert_close(out.float(), reference(q, k, v, False), rtol=1.6e-2, atol=1.6e-2)


@interpreter
def test_interpreted_kernel_refuses_what_it_does_not_support() -> None:
    q, k, v = inputs((1,), 16, 16, 32, torch.float16, "cpu")
    with pytest.raises(ValueError, match="d_k = d_v in"):
        flash_attention(q, k, v, backend="triton")
    q, k, v = inputs((1,), 16, 16, 64, torch.float32, "cpu")
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        flash_attention(q, k, v, backend="triton")
    assert not kernels.flash_attention_applies(q.half(), k.half(), v.half())  # auto: CUDA only


@pytest.mark.gpu
@needs_triton
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("t_q,t_k", [(1024, 1024), (1000, 1537), (777, 300), (4096, 4096)])
def test_gpu_kernel_matches_sdpa(dtype: torch.dtype, head_dim: int, is_causal: bool, t_q: int,
                                 t_k: int) -> None:
    q, k, v = inputs((2, 4), t_q, t_k, head_dim, dtype, "cuda")
    assert kernels.flash_attention_applies(q, k, v)
    out = flash_attention(q, k, v, is_causal=is_causal)  # auto picks the kernel on CUDA
    torch.testing.assert_close(out, flash_attention(q, k, v, is_causal=is_causal, backend="triton"),
                               rtol=0, atol=0)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    tolerance = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    torch.testing.assert_close(out, expected, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(out.float(), reference(q, k, v, is_causal), rtol=tolerance,
                               atol=tolerance)


@pytest.mark.gpu
@needs_triton
def test_gpu_torch_loop_matches_sdpa() -> None:
    q, k, v = inputs((2, 4), 700, 900, 96, torch.bfloat16, "cuda")  # d = 96: the loop, not Triton
    assert not kernels.flash_attention_applies(q, k, v)
    out = flash_attention(q, k, v, is_causal=True, block_size=128)
    torch.testing.assert_close(out.float(), reference(q, k, v, True), rtol=1.6e-2, atol=1.6e-2)


@pytest.mark.gpu
@needs_triton
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("t_q,t_k", [(1024, 1024), (1000, 1537), (777, 300)])
def test_gpu_backward_as_accurate_as_sdpa(dtype: torch.dtype, head_dim: int, is_causal: bool,
                                          t_q: int, t_k: int) -> None:
    """Gradients against float64 ones: ours are within 2x the error of torch's own SDPA in the
    same dtype (plus a small floor), so a wrong tile or a missing mask cannot pass."""
    q, k, v = inputs((2, 4), t_q, t_k, head_dim, dtype, "cuda")
    grad_out = inputs((2, 4), t_q, t_q, head_dim, dtype, "cuda", seed=1)[0]
    ours = gradients(lambda *x: flash_attention(*x, is_causal=is_causal), q, k, v, grad_out)
    sdpa = gradients(lambda *x: F.scaled_dot_product_attention(*x, is_causal=is_causal),
                     q, k, v, grad_out)
    exact = gradients(lambda *x: F.scaled_dot_product_attention(*x, is_causal=is_causal),
                      q, k, v, grad_out, dtype=torch.float64)
    for name, mine, theirs, expected in zip(("dq", "dk", "dv"), ours, sdpa, exact):
        assert mine.dtype == dtype, name
        our_error = (mine.double() - expected).abs().max().item()
        sdpa_error = (theirs.double() - expected).abs().max().item()
        floor = {torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
        assert our_error <= 2 * sdpa_error + floor, (name, our_error, sdpa_error)


@pytest.mark.parametrize(("gpu", "dtypes", "head_dims"), [
    ("h200", ("bf16",), (128,)), ("h200-adfdfb1", ("fp16", "bf16"), (64, 128))])
def test_recorded_gpu_benchmark_covers_the_grid_and_every_row_was_accurate(
        gpu: str, dtypes: tuple[str, ...], head_dims: tuple[int, ...]) -> None:
    """Each shipped GPU run (chapter 2's figures) holds its whole measured grid, every row
    passed its float64 check, and the rates are physical (below the H200's 989 TFLOP/s bf16
    peak). "h200", the kernels as they are now, is also the default."""
    run = kernels.recorded_gpu_benchmark(gpu)
    if gpu == "h200":
        assert kernels.recorded_gpu_benchmark() == run
    keys = {(r["dtype"], r["head_dim"], r["n"], r["causal"], r["pass"]) for r in run["rows"]}
    assert keys == {(dtype, d, n, causal, p) for dtype in dtypes for d in head_dims
                    for n in (1024, 2048, 4096, 8192, 16384) for causal in (False, True)
                    for p in ("fwd", "fwd+bwd")}
    for row in run["rows"]:
        assert row["accurate"] and row["batch"] * row["n"] == run["tokens"]
        assert row["heads"] * row["head_dim"] == run["hidden"]
        assert all(0 < rate < 989 for rate in row["tflops"].values())
        for name in ("out", "dq", "dk", "dv"):
            floor = {"fp16": 1e-3, "bf16": 8e-3}[row["dtype"]]
            assert row["errors"]["triton"][name] <= 2 * row["errors"]["sdpa"][name] + floor
    with pytest.raises(ValueError, match="gpu must be one of"):
        kernels.recorded_gpu_benchmark("t4")
