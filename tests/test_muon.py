"""lecture_pkg.muon against torch.optim.Muon and an SVD in float64."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lecture_pkg.models.llama import Llama, LlamaConfig
from lecture_pkg.muon import COEFFICIENTS, Muon, muon_and_adamw, newton_schulz


@pytest.mark.parametrize("shape", [(6, 10), (10, 6), (8, 8)])
def test_newton_schulz_keeps_singular_vectors_and_maps_each_singular_value(shape: tuple[int, int]) -> None:
    """In float64 the iteration is U f(S / |M|_F) V^T with f the quintic applied five times."""
    m = torch.randn(*shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    u, s, vh = torch.linalg.svd(m, full_matrices=False)
    x = newton_schulz(m, dtype=torch.float64)
    a, b, c = COEFFICIENTS
    f = s / m.norm()
    for _ in range(5):
        f = a * f + b * f**3 + c * f**5
    torch.testing.assert_close(x, u @ torch.diag(f) @ vh, rtol=0, atol=1e-10)
    assert (f > 0.6).all() and (f < 1.25).all()  # roughly orthogonal, as the docstring says


@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("shape", [(12, 20), (20, 12)])
def test_muon_equals_torch_optim_muon(nesterov: bool, shape: tuple[int, int]) -> None:
    g = torch.Generator().manual_seed(1)
    start = torch.randn(*shape, generator=g)
    grads = [torch.randn(*shape, generator=g) for _ in range(4)]
    ours, theirs = nn.Parameter(start.clone()), nn.Parameter(start.clone())
    opt_ours = Muon([ours], lr=0.1, weight_decay=0.1, nesterov=nesterov)
    opt_theirs = torch.optim.Muon([theirs], lr=0.1, weight_decay=0.1, nesterov=nesterov)
    for grad in grads:
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        opt_ours.step()
        opt_theirs.step()
    torch.testing.assert_close(ours.detach(), theirs.detach(), rtol=0, atol=1e-6)
    assert (ours.detach() - start).abs().max() > 0.1  # the steps moved it


def test_muon_and_adamw_split_the_model() -> None:
    model = Llama(LlamaConfig(vocab_size=30, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                              num_attention_heads=2, max_position_embeddings=16))
    muon, adamw = muon_and_adamw(model, muon_lr=0.02, adamw_lr=3e-3)
    in_muon = {id(p) for group in muon.param_groups for p in group["params"]}
    names = {n for n, p in model.named_parameters() if id(p) in in_muon}
    assert names == {n for n, p in model.named_parameters()
                     if p.dim() == 2 and not n.startswith(("embed_tokens", "lm_head"))}
    in_adamw = [p for group in adamw.param_groups for p in group["params"]]
    assert len(in_muon) + len(in_adamw) == len(list(model.parameters()))


def test_bad_input_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="params"):
        Muon([nn.Parameter(torch.zeros(3))])
    with pytest.raises(ValueError, match="momentum"):
        Muon([nn.Parameter(torch.zeros(3, 3))], momentum=1.0)
    with pytest.raises(ValueError, match="lr"):
        Muon([nn.Parameter(torch.zeros(3, 3))], lr=-1.0)
    with pytest.raises(ValueError, match="matrix must be 2-D"):
        newton_schulz(torch.zeros(2, 3, 4))
