"""lecture_pkg.in_context_regression: the baselines against NumPy/float64 loops, the model's causality."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lecture_pkg.char_tokenizers import CharTokenizer
from lecture_pkg.in_context_regression import (
    ICLTransformer,
    linear_tasks,
    lipschitz_tasks,
    prefix_least_squares,
    prefix_nadaraya_watson,
)
from lecture_pkg.shakespeare_tasks import (
    SPELLINGS,
    spelling_accuracy,
    spelling_words,
)


def test_prefix_least_squares_equals_numpy_lstsq():
    g = torch.Generator().manual_seed(0)
    xs, ys = linear_tasks(3, 8, 3, generator=g, noise=0.1)
    got = prefix_least_squares(xs.double(), ys.double())
    for b in range(3):
        assert got[b, 0] == 0
        for i in range(1, 8):
            w = np.linalg.lstsq(xs[b, :i].double().numpy(), ys[b, :i].double().numpy(), rcond=None)[0]
            assert got[b, i].item() == pytest.approx(float(xs[b, i].double().numpy() @ w), abs=1e-8)
    # noiseless linear tasks: exact once there are dim points
    xs, ys = linear_tasks(4, 6, 3, generator=g)
    torch.testing.assert_close(prefix_least_squares(xs, ys)[:, 3:], ys[:, 3:], rtol=1e-4, atol=1e-4)


def test_prefix_nadaraya_watson_by_hand():
    g = torch.Generator().manual_seed(1)
    xs, ys = lipschitz_tasks(2, 5, 2.0, generator=g)
    got = prefix_nadaraya_watson(xs.double(), ys.double(), bandwidth=0.3)
    for b in range(2):
        assert got[b, 0] == 0
        for i in range(1, 5):
            w = [math.exp(-(xs[b, i, 0].item() - xs[b, j, 0].item()) ** 2 / (2 * 0.09)) for j in range(i)]
            expected = sum(wj * ys[b, j].item() for j, wj in enumerate(w)) / sum(w)
            assert got[b, i].item() == pytest.approx(expected, abs=1e-6)


def test_lipschitz_tasks_respect_their_constant():
    xs, ys = lipschitz_tasks(16, 3, 5.0, generator=torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(3)  # the same draws: xs, then frequencies, then phases
    torch.rand(16, 3, 1, generator=g)
    k = torch.rand(16, 1, 3, generator=g) * 3 + 1
    phase = torch.rand(16, 1, 3, generator=g) * 2 * torch.pi
    torch.testing.assert_close(ys, (5.0 / (3 * k) * torch.sin(k * xs + phase)).sum(-1))
    assert xs.abs().max() <= 1
    grid = torch.linspace(-1, 1, 2001)[None, :, None]
    dense = (5.0 / (3 * k) * torch.sin(k * grid + phase)).sum(-1)
    slopes = dense.diff(dim=1).abs() / (2 / 2000)
    assert slopes.max() <= 5.0 + 1e-3
    with pytest.raises(ValueError, match="lipschitz must be positive"):
        lipschitz_tasks(2, 3, 0.0)


def test_icl_transformer_is_causal_over_pairs():
    torch.manual_seed(0)
    model = ICLTransformer(dim=2, max_points=6, d_model=16, n_layer=2, n_head=2).eval()
    xs, ys = linear_tasks(2, 6, 2, generator=torch.Generator().manual_seed(0))
    base = model(xs, ys)
    assert base.shape == (2, 6)
    changed_y = ys.clone()
    changed_y[:, 3] += 5.0  # y_3 may only reach predictions 4 and 5
    out = model(xs, changed_y)
    torch.testing.assert_close(out[:, :4], base[:, :4])
    assert (out[:, 4:] - base[:, 4:]).abs().min() > 0
    changed_x = xs.clone()
    changed_x[:, 3] += 1.0  # x_3 reaches predictions 3, 4, 5
    out = model(changed_x, ys)
    torch.testing.assert_close(out[:, :3], base[:, :3])
    assert (out[:, 3] - base[:, 3]).abs().min() > 0


def test_icl_rejects_bad_input():
    model = ICLTransformer(dim=2, max_points=4)
    with pytest.raises(ValueError, match="xs must be"):
        model(torch.zeros(1, 5, 2), torch.zeros(1, 5))
    with pytest.raises(ValueError, match=r"ys \(batch, n\)"):
        prefix_least_squares(torch.zeros(1, 3, 2), torch.zeros(1, 4))
    with pytest.raises(TypeError, match="xs must have a floating dtype"):
        prefix_nadaraya_watson(torch.zeros(1, 3, 2, dtype=torch.long), torch.zeros(1, 3), 1.0)
    with pytest.raises(ValueError, match="dim must be positive"):
        linear_tasks(2, 3, 0)


def test_answer_logprob_equals_one_pair_at_a_time():
    from lecture_pkg.lm_eval import answer_logprob
    from lecture_pkg.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, n_positions=16, n_embd=16, n_layer=2, n_head=2)).eval()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 10, (n,), generator=g).tolist() for n in (1, 5, 3, 7)]
    answers = [torch.randint(0, 10, (n,), generator=g).tolist() for n in (4, 1, 6, 2)]
    got = answer_logprob(model, prompts, answers, pad_id=10)
    for i, (p, a) in enumerate(zip(prompts, answers)):  # unpadded, float64, token by token
        expected = 0.0
        for j in range(len(a)):
            context = torch.tensor([p + a[:j]])
            with torch.no_grad():
                logits = model(context).logits[0, -1].double()
            expected += torch.log_softmax(logits, -1)[a[j]].item()
        assert got[i].item() == pytest.approx(expected, abs=1e-4)
    with pytest.raises(ValueError, match="equal length"):
        answer_logprob(model, prompts, answers[:2], pad_id=10)
    with pytest.raises(ValueError, match="at least one token"):
        answer_logprob(model, [[]], [[1]], pad_id=10)


def test_task_noise_is_added_after_the_clean_draws():
    clean = lipschitz_tasks(4, 6, 2.0, generator=torch.Generator().manual_seed(5))
    noisy = lipschitz_tasks(4, 6, 2.0, generator=torch.Generator().manual_seed(5), noise=0.3)
    torch.testing.assert_close(noisy[0], clean[0])
    g = torch.Generator().manual_seed(5)
    lipschitz_tasks(4, 6, 2.0, generator=g)  # the same clean draws, then the noise
    torch.testing.assert_close(noisy[1], clean[1] + 0.3 * torch.randn(4, 6, generator=g))


class _CaseModel(torch.nn.Module):
    """A stand-in language model whose next-token logits favour upper-case letters."""

    def __init__(self, tokenizer: CharTokenizer) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.tensor(
            [3.0 if c.isupper() else 0.0 for c in tokenizer.itos]))

    def forward(self, ids):
        return type("Out", (), {"logits": self.bias.expand(*ids.shape, -1)})()


def test_spelling_accuracy_scores_the_three_spellings():
    words = spelling_words("test")
    tokenizer = CharTokenizer.from_text("".join(words) + "".join(words).upper() + ": -\n")
    model = _CaseModel(tokenizer)
    # every query's upper-case spelling has the highest score, whatever the prompt says
    assert spelling_accuracy(model, tokenizer, words, "upper", 2, 0, 20) == 1.0
    assert spelling_accuracy(model, tokenizer, words, "lower", 2, 0, 20) == 0.0
    assert spelling_accuracy(model, tokenizer, words, "title", 0, 0, 20) == 0.0
    seen = []
    model.register_forward_pre_hook(lambda _, args: seen.append(args[0]))
    assert spelling_accuracy(model, tokenizer, words, "upper", 2, 0, 4, separator=" - ") == 1.0
    # rows 0, 1, 2: the first query's prompt with its lower, upper and title answer
    texts = [tokenizer.decode(row.tolist()).split("<|pad|>")[0] for row in seen[-1][:3]]
    query = texts[0].split("\n")[2].split(" - ")[0]  # two demonstrations, then the query
    assert all(t.count(" - ") == 3 and ":" not in t for t in texts)
    assert [t.split("\n")[2] for t in texts] == [
        f"{query} - {spell(query)}" for spell in SPELLINGS.values()]
    with pytest.raises(ValueError, match="spelling must be one of"):
        spelling_accuracy(model, tokenizer, words, "UPPER", 1, 0, 4)
    with pytest.raises(ValueError, match="at least n \\+ shots"):
        spelling_accuracy(model, tokenizer, words[:5], "upper", 2, 0, 4)
