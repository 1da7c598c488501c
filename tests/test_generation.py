"""lecture_pkg.generation: greedy, sampling and beam search against recomputation, brute force
and Hugging Face's logits warpers, on a tiny causal language model with a KV cache."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import Tensor, nn

from lecture_pkg.attention import KVCache
from lecture_pkg.generation import (
    apply_temperature,
    beam_search,
    gnmt_length_penalty,
    greedy_search,
    reorder_cache,
    sample,
    top_k_filter,
    top_p_filter,
)
from lecture_pkg.layers import EncoderLayer
from lecture_pkg.positional import sinusoidal_encoding

EOS, PAD = 1, 0


class TinyLM(nn.Module):
    """A two-layer causal LM whose logits depend on the whole prefix, with a KV cache."""

    def __init__(self, vocab: int = 6, d: int = 16, seed: int = 0, sharpness: float = 3.0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.d, self.sharpness = d, sharpness
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(EncoderLayer(d, 2, 32, dropout=0.0, wiring="pre")
                                    for _ in range(2))
        self.head = nn.Linear(d, vocab)
        self.double().eval()

    def new_cache(self) -> list[KVCache]:
        return [KVCache() for _ in self.layers]

    def forward(self, ids: Tensor, cache: list[KVCache] | None = None) -> Tensor:
        start = 0 if cache is None else len(cache[0])
        positions = sinusoidal_encoding(start + ids.shape[1], self.d, dtype=torch.float64)
        x = self.embed(ids) + positions[start:]
        for i, layer in enumerate(self.layers):
            x, _ = layer(x, is_causal=True, cache=None if cache is None else cache[i])
        return self.sharpness * self.head(x)


def prompts(batch: int = 3, t: int = 2, vocab: int = 6, seed: int = 1) -> Tensor:
    return torch.randint(2, vocab, (batch, t), generator=torch.Generator().manual_seed(seed))


def run(fn, model: TinyLM, ids: Tensor, use_cache: bool, **kwargs):  # noqa: ANN001, ANN201
    with torch.no_grad():
        return fn(model, ids, new_cache=model.new_cache, use_cache=use_cache, pad_token_id=PAD,
                  **kwargs)


# --------------------------------------------------------------------------------------------
# Greedy
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(4))
def test_greedy_picks_the_argmax_of_the_full_prefix_and_pads_after_eos(seed: int) -> None:
    model, ids = TinyLM(seed=seed, sharpness=1.0), prompts(4, seed=seed)
    out = run(greedy_search, model, ids, use_cache=False, max_new_tokens=12, eos_token_id=EOS)
    assert out.shape[1] <= ids.shape[1] + 12 and torch.equal(out[:, :2], ids)
    for row in out:
        generated = row[2:].tolist()
        stop = generated.index(EOS) + 1 if EOS in generated else len(generated)
        assert all(token == PAD for token in generated[stop:])
        for t in range(2, 2 + stop):
            with torch.no_grad():
                expected = model(row[None, :t])[0, -1].argmax().item()
            assert row[t].item() == expected


@pytest.mark.parametrize("seed", range(4))
def test_cached_greedy_equals_recomputation_token_for_token(seed: int) -> None:
    model, ids = TinyLM(seed=seed, sharpness=1.0), prompts(3, t=3, seed=seed)
    slow = run(greedy_search, model, ids, use_cache=False, max_new_tokens=15, eos_token_id=EOS)
    fast = run(greedy_search, model, ids, use_cache=True, max_new_tokens=15, eos_token_id=EOS)
    assert torch.equal(fast, slow)


def test_generation_stops_when_every_row_has_finished() -> None:
    model = TinyLM()
    with torch.no_grad():
        model.head.bias.fill_(0.0)
        model.head.bias[EOS] = 100.0  # eos at once, for every row
    out = run(greedy_search, model, prompts(), use_cache=True, max_new_tokens=20, eos_token_id=EOS)
    assert out.shape[1] == 3 and (out[:, -1] == EOS).all()


def test_several_stop_tokens() -> None:
    model, ids = TinyLM(seed=2), prompts(5, seed=2)
    plain = run(greedy_search, model, ids, use_cache=True, max_new_tokens=10)
    stops = plain[:, 2].unique().tolist()[:2]  # make the first generated tokens stop tokens
    out = run(greedy_search, model, ids, use_cache=True, max_new_tokens=10, eos_token_id=stops)
    for row, ref in zip(out, plain):
        if ref[2].item() in stops:
            assert (row[3:] == PAD).all()


# --------------------------------------------------------------------------------------------
# Sampling and the logits processors
# --------------------------------------------------------------------------------------------

def test_sampling_is_reproducible_with_a_generator_and_cache_does_not_change_it() -> None:
    model, ids = TinyLM(seed=3, sharpness=0.5), prompts(4, seed=3)
    draws = [run(sample, model, ids, use_cache=use_cache, max_new_tokens=10, eos_token_id=EOS,
                 temperature=1.3, top_k=4, top_p=0.9,
                 generator=torch.Generator().manual_seed(7))
             for use_cache in (True, False, True)]
    assert torch.equal(draws[0], draws[1]) and torch.equal(draws[0], draws[2])
    other = run(sample, model, ids, use_cache=True, max_new_tokens=10, eos_token_id=EOS,
                temperature=1.3, generator=torch.Generator().manual_seed(8))
    assert not torch.equal(other, draws[0])


def test_top_k_one_is_greedy() -> None:
    model, ids = TinyLM(seed=4), prompts(4, seed=4)
    greedy = run(greedy_search, model, ids, use_cache=True, max_new_tokens=8, eos_token_id=EOS)
    sampled = run(sample, model, ids, use_cache=True, max_new_tokens=8, eos_token_id=EOS,
                  top_k=1, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sampled, greedy)


def test_sample_frequencies_follow_the_processed_distribution() -> None:
    logits = torch.tensor([2.0, 1.5, 1.0, 0.0, -1.0, -3.0])
    step = lambda ids, cache: logits.expand(ids.shape[0], ids.shape[1], -1)  # noqa: E731
    n = 40_000
    out = sample(step, torch.zeros(n, 1, dtype=torch.long), max_new_tokens=1, temperature=0.7,
                 top_k=5, top_p=0.8, use_cache=False, generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(out[:, 1], minlength=6).double() / n
    expected = top_p_filter(top_k_filter(logits / 0.7, 5), 0.8).softmax(-1).double()
    assert (expected[3:] == 0).all()  # the nucleus of mass 0.8 holds three tokens here
    torch.testing.assert_close(counts, expected, atol=0.01, rtol=0)


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()
    kept = lambda p: torch.isfinite(top_p_filter(logits, p)).sum().item()  # noqa: E731
    assert [kept(p) for p in (0.1, 0.5, 0.51, 0.8, 0.81, 0.96, 1.0)] == [1, 1, 2, 2, 3, 4, 4]


def test_processors_equal_hugging_face_warpers() -> None:
    hf = pytest.importorskip("transformers")
    logits = torch.randn(8, 50, generator=torch.Generator().manual_seed(0)) * 3
    ids = torch.zeros(8, 1, dtype=torch.long)
    for temperature in (0.3, 1.0, 2.5):
        expected = hf.TemperatureLogitsWarper(temperature)(ids, logits.clone())
        torch.testing.assert_close(apply_temperature(logits, temperature), expected)
    for k in (1, 5, 50, 80):
        expected = hf.TopKLogitsWarper(k)(ids, logits.clone())
        assert torch.equal(top_k_filter(logits, k), expected)
    for p in (0.05, 0.3, 0.9, 0.999, 1.0):
        expected = hf.TopPLogitsWarper(p)(ids, logits.clone())
        assert torch.equal(torch.isfinite(top_p_filter(logits, p)), torch.isfinite(expected))


# --------------------------------------------------------------------------------------------
# Beam search
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("seed", range(3))
def test_beam_of_one_is_greedy(seed: int, use_cache: bool) -> None:
    model, ids = TinyLM(seed=seed, sharpness=1.0), prompts(4, seed=seed)
    greedy = run(greedy_search, model, ids, use_cache=use_cache, max_new_tokens=10,
                 eos_token_id=EOS)
    beam = run(beam_search, model, ids, use_cache=use_cache, max_new_tokens=10,
               eos_token_id=EOS, num_beams=1)
    assert torch.equal(beam, greedy)


def brute_force_best(model: TinyLM, prompt: Tensor, max_new: int, alpha: float,
                     vocab: int) -> tuple[float, list[int]]:
    """Score every output: each sequence ending in EOS within max_new tokens, and every
    sequence of exactly max_new tokens without EOS."""
    best: tuple[float, list[int]] = (-math.inf, [])
    for length in range(1, max_new + 1):
        for tokens in itertools.product(range(vocab), repeat=length):
            if EOS in tokens[:-1] or (length < max_new and tokens[-1] != EOS):
                continue
            seq = torch.cat([prompt, torch.tensor(tokens)])[None]
            with torch.no_grad():
                log_probs = model(seq[:, :-1]).log_softmax(-1)[0, len(prompt) - 1:]
            total = log_probs.gather(-1, torch.tensor(tokens)[:, None]).sum().item()
            score = total / gnmt_length_penalty(length, alpha)
            best = max(best, (score, list(tokens)))
    return best


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
@pytest.mark.parametrize("seed", range(2))
def test_wide_beam_finds_the_true_best_sequence(seed: int, alpha: float) -> None:
    vocab, max_new = 4, 4  # 4 + 16 + 64 + 256 outputs to enumerate
    model, ids = TinyLM(vocab=vocab, seed=seed, sharpness=1.0), prompts(2, vocab=vocab, seed=seed)
    out, scores = run(beam_search, model, ids, use_cache=True, max_new_tokens=max_new,
                      eos_token_id=EOS, num_beams=4**max_new, length_penalty=alpha,
                      return_scores=True)
    for b in range(2):
        score, tokens = brute_force_best(model, ids[b], max_new, alpha, vocab)
        assert out[b, 2:2 + len(tokens)].tolist() == tokens
        assert (out[b, 2 + len(tokens):] == PAD).all()
        assert scores[b].item() == pytest.approx(score, abs=1e-9)


@pytest.mark.parametrize(("sharpness", "alpha"), [(1.0, 0.6), (6.0, 0.0), (6.0, 0.6)])
def test_beam_search_beats_greedy_on_its_own_objective(sharpness: float, alpha: float) -> None:
    # a peaked model (sharpness 6, like a trained one) is where stopping as soon as num_beams
    # unlikely hypotheses have finished would return them instead of the probable open one
    model, ids = TinyLM(vocab=4, seed=5, sharpness=sharpness), prompts(16, vocab=4, seed=5)

    def objective(out: Tensor) -> list[float]:
        result = []
        for row in out:
            gen = row[2:].tolist()
            gen = gen[:gen.index(EOS) + 1] if EOS in gen else gen
            with torch.no_grad():
                lp = model(row[None, :1 + len(gen) + 1][:, :-1]).log_softmax(-1)[0, 1:]
            total = lp.gather(-1, torch.tensor(gen)[:, None]).sum().item()
            result.append(total / gnmt_length_penalty(len(gen), alpha))
        return result

    greedy = run(greedy_search, model, ids, use_cache=True, max_new_tokens=6, eos_token_id=EOS)
    beam = run(beam_search, model, ids, use_cache=True, max_new_tokens=6, eos_token_id=EOS,
               num_beams=3, length_penalty=alpha)
    pairs = list(zip(objective(beam), objective(greedy)))
    assert all(b >= g - 1e-9 for b, g in pairs)


@pytest.mark.parametrize("seed", range(3))
def test_cached_beam_search_equals_recomputation(seed: int) -> None:
    model, ids = TinyLM(seed=seed, sharpness=1.0), prompts(3, seed=seed)
    slow = run(beam_search, model, ids, use_cache=False, max_new_tokens=10, eos_token_id=EOS,
               num_beams=3, return_scores=True)
    fast = run(beam_search, model, ids, use_cache=True, max_new_tokens=10, eos_token_id=EOS,
               num_beams=3, return_scores=True)
    assert torch.equal(fast[0], slow[0])
    torch.testing.assert_close(fast[1], slow[1])


def test_gnmt_length_penalty_values() -> None:
    assert gnmt_length_penalty(1) == 1.0
    assert gnmt_length_penalty(7, 0.6) == pytest.approx(2.0**0.6)
    assert gnmt_length_penalty(30, 0.0) == 1.0


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------

def test_bad_arguments_raise_errors_naming_them() -> None:
    model, ids = TinyLM(), prompts()
    common = {"new_cache": model.new_cache}
    with pytest.raises(ValueError, match="num_beams"):
        beam_search(model, ids, num_beams=0, **common)
    with pytest.raises(ValueError, match="top_p"):
        sample(model, ids, top_p=0.0, **common)
    with pytest.raises(ValueError, match="top_p"):
        sample(model, ids, top_p=1.5, **common)
    with pytest.raises(ValueError, match="temperature"):
        sample(model, ids, temperature=0.0, **common)
    with pytest.raises(ValueError, match="temperature"):
        sample(model, ids, temperature=-1.0, **common)
    with pytest.raises(ValueError, match="top_k"):
        sample(model, ids, top_k=0, **common)
    with pytest.raises(TypeError, match="input_ids"):
        greedy_search(model, ids.float(), **common)
    with pytest.raises(TypeError, match="input_ids"):
        greedy_search(model, ids[0], **common)
    with pytest.raises(ValueError, match="max_new_tokens"):
        greedy_search(model, ids, max_new_tokens=0, **common)
    with pytest.raises(ValueError, match="new_cache"):
        greedy_search(model, ids)
    with pytest.raises(ValueError, match="step must return logits"):
        greedy_search(lambda i, c: torch.zeros(1, 1, 4), ids, use_cache=False)
    with pytest.raises(TypeError, match="reorder"):
        reorder_cache({"k": 1}, torch.tensor([0]))
