"""lecture_pkg.lora: LoRA against peft (outputs, gradients, merged weights), QLoRA on Linear4bit,
adapters, soft prompts, injection helpers and their errors."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from lecture_pkg.lora import (
    Adapter,
    LoRALinear,
    SoftPrompt,
    add_adapters,
    count_parameters,
    inject_lora,
    mark_only_trainable,
    merge_lora,
)
from lecture_pkg.quant import Linear4bit


class TinyAttention(nn.Module):
    """Stand-in with BERT's projection names."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.query, self.key, self.value = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.out = nn.Linear(d, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.query(x) @ self.key(x).transpose(-1, -2) / math.sqrt(x.shape[-1])
        return self.out(scores.softmax(-1) @ self.value(x)).mean(dim=1)


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def with_random_b(model: nn.Module, seed: int = 1) -> None:
    """B is zero at initialisation, which would hide a wrong B; give it random values."""
    gen = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, LoRALinear):
            with torch.no_grad():
                module.lora_B.copy_(torch.randn(module.lora_B.shape, generator=gen))


def peft_twin(ours: nn.Module, base: nn.Module, r: int, alpha: float, rslora: bool):
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=["query", "value"],
                             use_rslora=rslora)
    twin = peft.get_peft_model(copy.deepcopy(base), config)
    for name in ("query", "value"):
        layer = twin.base_model.model.get_submodule(name)
        with torch.no_grad():
            layer.lora_A["default"].weight.copy_(ours.get_submodule(name).lora_A)
            layer.lora_B["default"].weight.copy_(ours.get_submodule(name).lora_B)
    return twin


@pytest.mark.parametrize("r, alpha, rslora", [(1, 1.0, False), (4, 8.0, False), (8, 16.0, True)])
def test_lora_equals_peft(r: int, alpha: float, rslora: bool) -> None:
    torch.manual_seed(0)
    base = TinyAttention()
    ours = copy.deepcopy(base)
    inject_lora(ours, ("query", "value"), r=r, alpha=alpha, rslora=rslora)
    with_random_b(ours)
    twin = peft_twin(ours, base, r, alpha, rslora)
    assert ours.query.scaling == twin.base_model.model.query.scaling["default"]
    x = randn(2, 5, 16, seed=3)
    y_ours, y_peft = ours(x), twin(x)
    assert torch.allclose(y_ours, y_peft, atol=1e-6)
    assert not torch.allclose(y_ours, base(x), atol=1e-3)  # the update is not a no-op
    y_ours.square().sum().backward()
    y_peft.square().sum().backward()
    for name in ("query", "value"):
        peft_layer = twin.base_model.model.get_submodule(name)
        ours_layer = ours.get_submodule(name)
        assert torch.allclose(ours_layer.lora_A.grad, peft_layer.lora_A["default"].weight.grad,
                              atol=1e-6)
        assert torch.allclose(ours_layer.lora_B.grad, peft_layer.lora_B["default"].weight.grad,
                              atol=1e-6)
        assert ours_layer.base.weight.grad is None
    assert count_parameters(ours)[1] - count_parameters(base)[1] == 2 * r * (16 + 16)
    merged_peft = twin.merge_and_unload()
    merge_lora(ours)
    for name in ("query", "value"):
        assert torch.allclose(ours.get_submodule(name).weight, merged_peft.get_submodule(name).weight,
                              atol=1e-6)
    assert torch.allclose(ours(x), y_peft, atol=1e-5)


def test_initialisation_like_peft() -> None:
    torch.manual_seed(0)
    layer = LoRALinear(nn.Linear(64, 32), r=8, alpha=16)
    assert torch.all(layer.lora_B == 0) and layer.lora_A.shape == (8, 64)
    bound = 1 / math.sqrt(64)  # kaiming_uniform(a=sqrt(5)) on fan_in 64
    assert layer.lora_A.abs().max() <= bound and layer.lora_A.abs().max() > 0.9 * bound
    gaussian = LoRALinear(nn.Linear(512, 512), r=4, alpha=4, init="gaussian")
    assert abs(gaussian.lora_A.std().item() - 1 / 4) < 0.01
    x = randn(3, 64)
    assert torch.equal(layer(x), layer.base(x))  # B = 0: starts at the pretrained model


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 12), n=st.integers(1, 12), seed=st.integers(0, 999), data=st.data())
def test_merge_unmerge_round_trip(m: int, n: int, seed: int, data) -> None:
    torch.manual_seed(seed)
    r = data.draw(st.integers(1, min(m, n)))
    layer = LoRALinear(nn.Linear(n, m), r=r, alpha=data.draw(st.floats(0.1, 32)))
    with_random_b(layer, seed)
    w0 = layer.base.weight.detach().clone()
    x = randn(4, n, seed=seed)
    y = layer(x)
    layer.merge()
    assert torch.allclose(layer(x), y, atol=1e-5)
    assert torch.linalg.matrix_rank(layer.base.weight.detach().double() - w0.double(),
                                    tol=1e-4) <= r
    layer.unmerge()
    assert torch.allclose(layer.base.weight, w0, atol=1e-5)
    assert torch.allclose(layer(x), y, atol=1e-5)


def test_only_lora_and_head_train() -> None:
    model = TinyAttention()
    inject_lora(model, ("query", "value"), r=2, alpha=4)
    mark_only_trainable(model, also=("out",))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"query.lora_A", "query.lora_B", "value.lora_A", "value.lora_B",
                         "out.weight", "out.bias"}
    assert count_parameters(model) == (2 * 2 * 32 + 16 * 3 + 3,
                                       3 * (16 * 16 + 16) + 16 * 3 + 3 + 2 * 2 * 32)


def test_qlora_trains_and_merges_into_dequantised_weights() -> None:
    torch.manual_seed(0)
    base = Linear4bit.from_linear(nn.Linear(128, 64))
    layer = LoRALinear(base, r=4, alpha=8)
    x, target = randn(32, 128, seed=1), randn(32, 64, seed=2)
    optimizer = torch.optim.AdamW([layer.lora_A, layer.lora_B], lr=1e-2)
    losses = []
    for _ in range(30):
        loss = (layer(x) - target).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0]
    assert [n for n, p in layer.named_parameters() if p.requires_grad] == ["lora_A", "lora_B"]
    merged = layer.merged_linear()
    assert torch.allclose(merged(x), layer(x), atol=1e-5)
    assert torch.allclose(merged.weight, base.dequantized_weight() + layer.delta_weight(),
                          atol=1e-7)
    with pytest.raises(TypeError, match="use merged_linear"):
        layer.merge()
    holder = nn.Sequential()
    holder.add_module("proj", layer)
    requantized = copy.deepcopy(holder)
    assert merge_lora(holder) == ["proj"] and type(holder.proj) is nn.Linear
    merge_lora(requantized, requantize=True)
    again = Linear4bit.from_linear(merged)
    assert isinstance(requantized.proj, Linear4bit)
    assert torch.equal(requantized.proj.packed, again.packed)  # NF4 of dequant(W) + s B A
    assert torch.equal(requantized.proj.dequantized_weight(), again.dequantized_weight())


def test_qlora_matches_peft_on_bitsandbytes_linear4bit() -> None:
    bnb = pytest.importorskip("bitsandbytes")
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    linear = nn.Linear(128, 64)
    ref_base = bnb.nn.Linear4bit(128, 64, compute_dtype=torch.float32, compress_statistics=True,
                                 quant_type="nf4")
    ref_base.load_state_dict(linear.state_dict())
    ref_model = nn.Sequential()
    ref_model.add_module("query", ref_base.to("cpu"))
    twin = peft.get_peft_model(ref_model, peft.LoraConfig(r=4, lora_alpha=8,
                                                          target_modules=["query"]))
    ours = LoRALinear(Linear4bit.from_linear(linear), r=4, alpha=8)
    with_random_b(ours)
    peft_layer = twin.base_model.model.query
    with torch.no_grad():
        peft_layer.lora_A["default"].weight.copy_(ours.lora_A)
        peft_layer.lora_B["default"].weight.copy_(ours.lora_B)
    x = randn(5, 128, seed=4)
    assert torch.allclose(ours(x), twin(x), atol=1e-4)


def test_adapter_starts_near_identity_and_counts() -> None:
    adapter = Adapter(d_model=32, bottleneck=4)
    x = randn(2, 7, 32)
    assert torch.allclose(adapter(x), x, atol=1e-4) and not torch.equal(adapter(x), x)
    assert sum(p.numel() for p in adapter.parameters()) == 2 * 32 * 4 + 32 + 4
    model = TinyAttention()
    names = add_adapters(model, ("value", "out"), bottleneck=4)
    assert names == ["value", "out"]
    mark_only_trainable(model)
    assert count_parameters(model)[0] == (2 * 16 * 4 + 16 + 4) + (2 * 3 * 4 + 3 + 4)


def test_soft_prompt_prepends() -> None:
    prompt = SoftPrompt(n_tokens=5, dim=8)
    embeddings, mask = randn(2, 3, 8), torch.tensor([[True, True, False], [True, True, True]])
    out, out_mask = prompt(embeddings, mask)
    assert out.shape == (2, 8, 8) and out_mask.shape == (2, 8)
    assert torch.equal(out[:, :5], prompt.prompt.detach().expand(2, -1, -1))
    assert torch.equal(out[:, 5:], embeddings) and out_mask[:, :5].all()
    assert torch.equal(out_mask[:, 5:], mask)
    assert sum(p.numel() for p in prompt.parameters()) == 40


# --- bad input ------------------------------------------------------------------------------

def test_rank_and_alpha_errors() -> None:
    linear = nn.Linear(8, 4)
    with pytest.raises(ValueError, match="r must be positive"):
        LoRALinear(linear, r=0, alpha=1)
    with pytest.raises(ValueError, match=r"r must be <= min\(in_features, out_features\) = 4"):
        LoRALinear(linear, r=5, alpha=1)
    with pytest.raises(TypeError, match="r must be an int"):
        LoRALinear(linear, r=2.0, alpha=1)
    for alpha in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="alpha must be a positive number"):
            LoRALinear(linear, r=2, alpha=alpha)
    with pytest.raises(TypeError, match="base must be an nn.Linear"):
        LoRALinear(nn.Conv1d(2, 2, 1), r=1, alpha=1)
    with pytest.raises(TypeError, match="x must have a floating dtype"):
        LoRALinear(linear, r=1, alpha=1)(torch.ones(2, 8, dtype=torch.long))


def test_merge_state_errors() -> None:
    layer = LoRALinear(nn.Linear(8, 4), r=2, alpha=1)
    with pytest.raises(RuntimeError, match="nothing to unmerge"):
        layer.unmerge()
    layer.merge()
    with pytest.raises(RuntimeError, match="already merged"):
        layer.merge()


def test_injecting_nothing_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"target_modules=\('q_proj',\) matches no linear module"
                                         r".*'query'"):
        inject_lora(TinyAttention(), ("q_proj",), r=1, alpha=1)
    with pytest.raises(ValueError, match="matches no linear module"):
        add_adapters(TinyAttention(), ("ery",), bottleneck=2)  # suffixes match whole name parts


def test_soft_prompt_errors() -> None:
    with pytest.raises(ValueError, match=r"init must have shape \(2, 4\)"):
        SoftPrompt(2, 4, init=torch.zeros(4, 2))
    with pytest.raises(ValueError, match="mask must be a bool"):
        SoftPrompt(2, 4)(randn(1, 3, 4), torch.ones(1, 3))
