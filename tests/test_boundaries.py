"""Boundary values and paths the module tests do not reach: a padding mask in the language-model
loss, parameter counts of 4-bit layers, LLM.int8's threshold at exactly 6.0, the zero-point
range that keeps 0 exact, BERT's LayerNorm eps where it matters, the gradient-clipping norm and
the loss logged under several processes.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lecture_pkg import quant, training
from lecture_pkg.lora import LoRALinear, count_parameters, inject_lora, mark_only_trainable
from lecture_pkg.models.gpt import next_token_loss

# --------------------------------------------------------------------------------------------
# The language-model loss with padding
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("side", ["right", "left"])
def test_next_token_loss_leaves_out_padded_targets(side: str) -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 6, 11, generator=g)
    ids = torch.randint(0, 11, (3, 6), generator=g)
    lengths = [6, 4, 2]
    mask = torch.zeros(3, 6, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
    if side == "left":
        mask = mask.flip(1)
    total, count = 0.0, 0
    for b in range(3):  # predict token i + 1 from position i, for real targets only
        for i in range(5):
            if mask[b, i + 1]:
                total += F.cross_entropy(logits[b, i], ids[b, i + 1]).item()
                count += 1
    assert count == sum(n - 1 for n in lengths) + (2 if side == "left" else 0)
    assert next_token_loss(logits, ids, mask).item() == pytest.approx(total / count, rel=1e-6)
    assert next_token_loss(logits, ids, mask.bool()).item() == pytest.approx(total / count,
                                                                             rel=1e-6)
    unmasked = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    assert next_token_loss(logits, ids).item() == pytest.approx(unmasked.item(), rel=1e-6)


# --------------------------------------------------------------------------------------------
# Parameter counts with 4-bit layers
# --------------------------------------------------------------------------------------------

def test_count_parameters_with_4bit_layers_and_lora() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 8, bias=False))
    full = sum(p.numel() for p in model.parameters())
    assert count_parameters(model) == (full, full)
    quant.quantize_linears(model)  # the codes are buffers, counted as the weights they encode
    trainable, total = count_parameters(model)
    assert total == full and trainable == 0  # the bias is frozen
    inject_lora(model, ("0",), r=4, alpha=8)
    mark_only_trainable(model)
    lora = 4 * 64 + 32 * 4
    assert count_parameters(model) == (lora, full + lora)
    assert isinstance(model[0], LoRALinear)


# --------------------------------------------------------------------------------------------
# LLM.int8 and zero-point quantisation at their boundaries
# --------------------------------------------------------------------------------------------

def test_int8_threshold_includes_exactly_six() -> None:
    """|x| >= 6 is an outlier (the paper's rule): a feature holding exactly 6.0 is multiplied in
    float32, so a matrix whose every feature holds a 6.0 gives the exact product."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(4, 8, generator=g) * 0.9
    x[0] = 6.0
    w = torch.randn(5, 8, generator=g)
    torch.testing.assert_close(quant.int8_matmul(x, w, threshold=6.0), x @ w.T, rtol=0,
                               atol=1e-5)
    x[0] = torch.nextafter(torch.tensor(6.0), torch.tensor(0.0))  # just below: all int8
    assert not torch.allclose(quant.int8_matmul(x, w, threshold=6.0), x @ w.T, rtol=0,
                              atol=1e-5)
    assert torch.equal(quant.int8_matmul(x, w, threshold=6.0),
                       quant.int8_matmul(x, w, threshold=None))


@pytest.mark.parametrize("low, high", [(1.0, 3.0), (-5.0, -2.0), (-1.0, 4.0), (0.0, 2.0)])
def test_zeropoint_range_keeps_zero_exact(low: float, high: float) -> None:
    g = torch.Generator().manual_seed(0)
    x = low + (high - low) * torch.rand(200, generator=g)
    x[:3] = torch.tensor([low, high, 0.0]) if low <= 0 <= high else torch.tensor([low, high, low])
    q, scale, zero_point = quant.zeropoint_quantize(x)
    assert zero_point == torch.round(zero_point) and -128 <= zero_point.item() <= 127
    zero_code = zero_point.to(torch.int8).reshape(1)
    assert quant.zeropoint_dequantize(zero_code, scale, zero_point).item() == 0.0
    restored = quant.zeropoint_dequantize(q, scale, zero_point)
    if low <= 0 <= high:
        assert restored[2].item() == 0.0
    assert (restored - x).abs().max() <= 0.5 / scale + 1e-6  # half a step
    assert q.min().item() >= -128 and q.max().item() <= 127


def test_zeropoint_uses_the_whole_range_on_two_sided_data() -> None:
    x = torch.tensor([-1.0, 0.0, 3.0])
    q, scale, zero_point = quant.zeropoint_quantize(x)
    assert q.tolist() == [-128, -64, 127]
    assert scale.item() == pytest.approx(255 / 4)


# --------------------------------------------------------------------------------------------
# BERT's LayerNorm eps (1e-12) where it changes the output
# --------------------------------------------------------------------------------------------

def test_bert_eps_matters_on_small_activations() -> None:
    """Embeddings scaled to ~1e-5: their variance (~1e-10) is far below 1e-5 but far above
    1e-12, so only the right eps gives HF's output."""
    transformers = pytest.importorskip("transformers")
    from lecture_pkg.models.bert import BertModel

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=32,
                                     max_position_embeddings=16, attn_implementation="eager")
    hf = transformers.BertModel(config).eval()
    with torch.no_grad():
        for emb in (hf.embeddings.word_embeddings, hf.embeddings.position_embeddings,
                    hf.embeddings.token_type_embeddings):
            emb.weight.mul_(5e-4)
    ours = BertModel.from_hf(hf).eval()
    assert ours.config.eps == 1e-12
    assert {m.eps for m in ours.modules() if isinstance(m, nn.LayerNorm)} == {1e-12}
    ids = torch.randint(0, 50, (2, 7))
    with torch.no_grad():
        ref = hf(input_ids=ids, output_hidden_states=True).hidden_states[0]
        out = ours.embed(ids)
    assert ref.std().item() > 0.5  # normalised to unit scale
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


def test_vit_and_t5_norm_eps() -> None:
    from lecture_pkg.models.t5 import T5, T5Config
    from lecture_pkg.models.vit import ViT, ViTConfig

    vit = ViT(ViTConfig(image_size=8, patch_size=4, hidden_size=8, num_layers=1, num_heads=2,
                        intermediate_size=16))
    assert {m.eps for m in vit.modules() if isinstance(m, nn.LayerNorm)} == {1e-12}
    t5 = T5(T5Config(vocab_size=20, d_model=8, d_ff=16, num_layers=1, num_decoder_layers=1,
                     num_heads=2))
    assert {m.eps for m in t5.modules() if type(m).__name__ == "RMSNorm"} == {1e-6}


# --------------------------------------------------------------------------------------------
# Training: the clipping norm and the loss logged over several ranks
# --------------------------------------------------------------------------------------------

def test_clipping_uses_the_global_l2_norm() -> None:
    """SGD with lr 1 moves the weights by the clipped gradient: g / ||g||_2 over all
    parameters together (the max-norm or per-parameter clipping would move them differently)."""
    model = nn.Linear(3, 2)
    with torch.no_grad():
        model.weight.zero_()
        model.bias.zero_()
    x = torch.tensor([[1.0, 2.0, -3.0]])
    target = torch.tensor([[4.0, -8.0]])

    def loss_fn(m: nn.Module, batch: object) -> torch.Tensor:
        return ((m(x) - target) ** 2).sum()

    loss_fn(model, None).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    norm = torch.cat([g.flatten() for g in grads]).norm()
    assert norm > 1
    model.zero_grad()
    before = [p.detach().clone() for p in model.parameters()]
    training.train(model, lambda step: None, loss_fn, steps=1,
                   optimizer=torch.optim.SGD(model.parameters(), lr=1.0), clip_grad_norm=1.0,
                   progress=False)
    for p, p0, g in zip(model.parameters(), before, grads):
        torch.testing.assert_close(p0 - p.detach(), g / norm)


def test_logged_loss_is_the_mean_over_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ranks, simulated: all_reduce adds the other rank's loss (10.0). The history holds
    the mean (loss + 10) / 2, not the sum."""
    dist = training.dist
    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda *a: 2)
    monkeypatch.setattr(dist, "get_rank", lambda *a: 0)
    monkeypatch.setattr(dist, "all_reduce", lambda tensor, *a, **k: tensor.add_(10.0))
    model = nn.Linear(2, 1)
    x, y = torch.ones(4, 2), torch.zeros(4, 1)
    with torch.no_grad():
        expected = F.mse_loss(model(x), y).item()
    history = training.train(model, lambda step: (x, y), lambda m, b: F.mse_loss(m(b[0]), b[1]),
                             steps=1, optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
                             log_every=1, progress=False)
    assert history.losses == [pytest.approx((expected + 10.0) / 2)]
