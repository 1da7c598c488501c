"""Beam search's rules on hand-built models where beam search and greedy decoding disagree, and
padded prompts spread over beam rows.

The models are tables of next-token probabilities, so every expected output can be worked out
by hand (the comments do it), and a plain per-example reference implementation of the rules
(the beam_search docstring's) is compared with the batched one on random tables.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from lecture_pkg.generation import beam_search, gnmt_length_penalty, greedy_search

EOS, PAD = 1, 0


class History:
    """A cache that holds the tokens seen so far, reordered like a key-value cache."""

    def __init__(self) -> None:
        self.ids: Tensor | None = None

    def reorder(self, index: Tensor) -> None:
        self.ids = self.ids.index_select(0, index)


class TableModel:
    """Next-token probabilities looked up by the generated prefix (a tuple of tokens after the
    prompt); prefixes not in the table get ``default``. vocab: 0 = pad, 1 = EOS, 2.. words."""

    def __init__(self, table: dict[tuple[int, ...], dict[int, float]], vocab: int,
                 t_prompt: int = 1, default: dict[int, float] | None = None) -> None:
        self.table, self.vocab, self.t_prompt = table, vocab, t_prompt
        self.default = default or {EOS: 1.0}

    def logits(self, ids: Tensor) -> Tensor:
        rows = []
        for row in ids.tolist():
            probs = torch.full((self.vocab,), 1e-12, dtype=torch.float64)
            for token, p in self.table.get(tuple(row[self.t_prompt:]), self.default).items():
                probs[token] = p
            rows.append(probs.log())
        return torch.stack(rows)[:, None, :]

    def step(self, new: Tensor, cache: History | None) -> Tensor:
        if cache is None:
            return self.logits(new)
        cache.ids = new if cache.ids is None else torch.cat([cache.ids, new], dim=1)
        return self.logits(cache.ids)


def generated(out: Tensor, t_prompt: int = 1) -> list[list[int]]:
    return [[t for t in row[t_prompt:] if t != PAD] for row in out.tolist()]


def run_beam(model: TableModel, use_cache: bool, **kwargs: object) -> Tensor:
    start = torch.full((1, 1), 5, dtype=torch.long)
    return beam_search(model.step, start, eos_token_id=EOS, pad_token_id=PAD,
                       new_cache=History, use_cache=use_cache, **kwargs)


# --------------------------------------------------------------------------------------------
# Hand-built cases
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("use_cache", [False, True])
def test_beam_finds_the_sequence_greedy_misses(use_cache: bool) -> None:
    """Greedy takes a (0.6) and then its best is 0.6 * 0.35 = 0.21; b EOS has 0.4 * 0.9 = 0.36."""
    a, b, c = 2, 3, 4
    model = TableModel({(): {a: 0.6, b: 0.4}, (a,): {EOS: 0.3, b: 0.35, c: 0.35},
                        (b,): {EOS: 0.9, c: 0.1}}, vocab=5)
    start = torch.full((1, 1), 5, dtype=torch.long)
    greedy = greedy_search(model.step, start, eos_token_id=EOS, max_new_tokens=2,
                           new_cache=History, use_cache=use_cache)
    assert generated(greedy) == [[a, b]]
    out, score = run_beam(model, use_cache, num_beams=2, max_new_tokens=2, length_penalty=0.0,
                          return_scores=True)
    assert generated(out) == [[b, EOS]]
    assert score.item() == pytest.approx(math.log(0.36))


@pytest.mark.parametrize("use_cache", [False, True])
def test_a_stop_token_ranked_below_num_beams_is_not_a_hypothesis(use_cache: bool) -> None:
    """Step 2 ranks a EOS (0.275), a x (0.225), b EOS (0.208), b y (0.192). Only the first 2
    ranks may finish, so b EOS is dropped and one finished hypothesis is not enough to stop
    after step 3; a fourth step finishes a x z and b y w. (Keeping b EOS would have made two
    finished hypotheses, both above the best open beam after step 3, and stopped a step early.)
    The answer is a EOS either way: the rule decides how long the search runs."""
    a, b, c, x, y, z, w = 2, 3, 4, 5, 6, 7, 8
    model = TableModel({(): {a: 0.5, b: 0.4, c: 0.1}, (a,): {EOS: 0.55, x: 0.45},
                        (b,): {EOS: 0.52, y: 0.48}, (a, x): {EOS: 0.1, z: 0.9},
                        (b, y): {EOS: 0.1, w: 0.9}}, vocab=9)
    calls = []

    def step(new: Tensor, cache: History | None) -> Tensor:
        calls.append(new.shape)
        return model.step(new, cache)

    start = torch.full((1, 1), 5, dtype=torch.long)
    out, score = beam_search(step, start, num_beams=2, max_new_tokens=8, eos_token_id=EOS,
                             length_penalty=0.0, new_cache=History, use_cache=use_cache,
                             return_scores=True)
    assert generated(out) == [[a, EOS]]
    assert score.item() == pytest.approx(math.log(0.275))
    assert len(calls) == 4


@pytest.mark.parametrize("use_cache", [False, True])
def test_search_goes_on_while_an_open_beam_can_still_win(use_cache: bool) -> None:
    """After step 2 there are 2 finished hypotheses (EOS: 0.3 and a EOS: 0.18), as many as
    beams, but the open beam a c (0.42) ranks above the second of them: the search continues
    and finds a c EOS (0.42), better than everything finished so far."""
    a, b, c, x = 2, 3, 4, 5
    model = TableModel({(): {a: 0.6, EOS: 0.3, b: 0.1}, (a,): {c: 0.7, EOS: 0.3},
                        (b,): {EOS: 0.9, x: 0.1}, (a, c): {EOS: 1.0}}, vocab=6)
    out, score = run_beam(model, use_cache, num_beams=2, max_new_tokens=5, length_penalty=0.0,
                          return_scores=True)
    assert generated(out) == [[a, c, EOS]]
    assert score.item() == pytest.approx(math.log(0.42))


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_search_goes_on_while_an_open_beam_beats_the_kth_finished(alpha: float) -> None:
    """After step 2 the finished hypotheses are EOS (0.5) and a EOS (0.18); the open beam b y
    (0.19) is below the best of them but above the second (the k-th for 2 beams), so the search
    takes a third step (comparing with the best finished one would stop after two). With
    alpha = 1 both are scored at length 2: log 0.19 / (7/6) = -1.42 against log 0.18 / (7/6) =
    -1.47 (the open beam's raw log 0.19 = -1.66 would rank below and stop the search)."""
    a, b, x, y = 2, 3, 4, 5
    calls = []
    model = TableModel({(): {EOS: 0.5, a: 0.3, b: 0.2}, (a,): {EOS: 0.6, x: 0.4},
                        (b,): {y: 0.95, EOS: 0.05}}, vocab=6)

    def step(new: Tensor, cache: History | None) -> Tensor:
        calls.append(new.shape)
        return model.step(new, cache)

    start = torch.full((1, 1), 5, dtype=torch.long)
    out = beam_search(step, start, num_beams=2, max_new_tokens=6, eos_token_id=EOS,
                      length_penalty=alpha, new_cache=History)
    assert generated(out) == [[EOS]]
    assert len(calls) == 3


def test_search_stops_when_no_open_beam_can_win() -> None:
    """Both finished hypotheses beat every open beam after step 2: the search stops there,
    so the model is never asked for a third step."""
    a, b = 2, 3
    calls = []
    model = TableModel({(): {EOS: 0.5, a: 0.3, b: 0.2}, (a,): {EOS: 0.9, b: 0.1},
                        (b,): {EOS: 0.1, a: 0.9}}, vocab=4)

    def step(new: Tensor, cache: History | None) -> Tensor:
        calls.append(new.shape)
        return model.step(new, cache)

    start = torch.full((1, 1), 5, dtype=torch.long)
    out = beam_search(step, start, num_beams=2, max_new_tokens=6, eos_token_id=EOS,
                      length_penalty=0.0, new_cache=History)
    assert generated(out) == [[EOS]]
    assert len(calls) == 2


def test_out_of_length_open_beams_compete_with_their_length_penalty() -> None:
    """No EOS is ever probable: the best open beam after max_new_tokens is returned, scored
    with lp(max_new_tokens)."""
    a, b = 2, 3
    model = TableModel({}, vocab=4, default={a: 0.7, b: 0.3 - 1e-9, EOS: 1e-9})
    out, score = run_beam(model, False, num_beams=3, max_new_tokens=3, length_penalty=1.0,
                          return_scores=True)
    assert generated(out) == [[a, a, a]]
    assert score.item() == pytest.approx(3 * math.log(0.7) / gnmt_length_penalty(3, 1.0))


def test_length_penalty_counts_the_stop_token() -> None:
    """a EOS (2 tokens, 0.4 * 0.9 = 0.36) against EOS (1 token, 0.5): log 0.36 / lp(2) beats
    log 0.5 / lp(1) only when alpha > 2.52 ((7/6)^alpha > log 0.36 / log 0.5 = 1.47)."""
    a = 2
    model = TableModel({(): {EOS: 0.5, a: 0.4, 3: 0.1}, (a,): {EOS: 0.9, 3: 0.1}}, vocab=4)
    for alpha, expected in ((0.0, [EOS]), (2.0, [EOS]), (4.0, [a, EOS])):
        out, score = run_beam(model, False, num_beams=2, max_new_tokens=4,
                              length_penalty=alpha, return_scores=True)
        assert generated(out) == [expected], alpha
        n = len(expected)
        p = 0.5 if n == 1 else 0.36
        assert score.item() == pytest.approx(math.log(p) / gnmt_length_penalty(n, alpha))


# --------------------------------------------------------------------------------------------
# Random tables against a per-example reference of the same rules
# --------------------------------------------------------------------------------------------

def reference_beam(log_probs, beams: int, max_new: int, alpha: float
                   ) -> tuple[float, list[int]]:
    """One example, plain lists: log_probs(prefix) -> list over the vocabulary."""
    open_beams: list[tuple[float, list[int]]] = [(0.0, [])]
    finished: list[tuple[float, list[int]]] = []
    for length in range(1, max_new + 1):
        lp = gnmt_length_penalty(length, alpha)
        candidates = sorted(((s + lp_v, toks + [v]) for s, toks in open_beams
                             for v, lp_v in enumerate(log_probs(toks))),
                            key=lambda c: -c[0])[:2 * beams]
        kept: list[tuple[float, list[int]]] = []
        for rank, (s, toks) in enumerate(candidates):
            if len(kept) == beams:
                break
            if toks[-1] == EOS:
                if rank < beams:
                    finished.append((s / lp, toks))
            else:
                kept.append((s, toks))
        if len(finished) >= beams and \
                kept[0][0] / lp <= sorted(f for f, _ in finished)[-beams]:
            break
        open_beams = kept
    else:
        lp = gnmt_length_penalty(max_new, alpha)
        finished += [(s / lp, toks) for s, toks in open_beams]
    return max(finished, key=lambda f: f[0])


def random_markov(seed: int, vocab: int = 6) -> Tensor:
    """(3 prefix classes, vocab) x vocab next-token log-probs; EOS fairly likely."""
    g = torch.Generator().manual_seed(seed)
    logits = 2.0 * torch.randn(3, vocab, vocab, generator=g, dtype=torch.float64)
    logits[..., PAD] = -30.0
    logits[..., EOS] += 0.5
    return logits.log_softmax(-1)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("use_cache", [False, True])
def test_batched_beam_search_equals_the_reference(seed: int, use_cache: bool) -> None:
    vocab = 6
    table = random_markov(seed, vocab)
    prompts = torch.tensor([[2, 3], [4, 2], [5, 5]])

    def lookup(full: list[int]) -> list[float]:  # depends on the whole prefix
        return table[sum(full) % 3, full[-1]].tolist()

    def step(new: Tensor, cache: History | None) -> Tensor:
        if cache is not None:
            cache.ids = new if cache.ids is None else torch.cat([cache.ids, new], dim=1)
            new = cache.ids
        return torch.stack([torch.tensor(lookup(row), dtype=torch.float64)
                            for row in new.tolist()])[:, None]

    beams, alpha, max_new = (2 + seed % 2), (0.0, 0.6, 1.5)[seed % 3], 5
    out, scores = beam_search(step, prompts, num_beams=beams, max_new_tokens=max_new,
                              eos_token_id=EOS, pad_token_id=PAD, length_penalty=alpha,
                              new_cache=History, use_cache=use_cache, return_scores=True)
    for b, prompt in enumerate(prompts.tolist()):
        score, tokens = reference_beam(lambda toks: lookup(prompt + toks), beams, max_new, alpha)
        assert out[b, 2:2 + len(tokens)].tolist() == tokens
        assert (out[b, 2 + len(tokens):] == PAD).all()
        assert scores[b].item() == pytest.approx(score, abs=1e-9)


def test_random_tables_exercise_the_rules() -> None:
    """The random tables above do reach the cases the rules are about: beam differs from
    greedy, and hypotheses finish at different lengths."""
    differs = 0
    for seed in range(6):
        table = random_markov(seed)
        for prompt in ([2, 3], [4, 2], [5, 5]):
            def lookup(toks: list[int]) -> list[float]:
                full = prompt + toks
                return table[sum(full) % 3, full[-1]].tolist()

            greedy: list[int] = []
            while len(greedy) < 5 and (not greedy or greedy[-1] != EOS):
                greedy.append(max(range(6), key=lookup(greedy).__getitem__))
            _, tokens = reference_beam(lookup, 2 + seed % 2, 5, (0.0, 0.6, 1.5)[seed % 3])
            differs += tokens != greedy
    assert differs >= 3


# --------------------------------------------------------------------------------------------
# Padded prompts over beam rows: row b * num_beams + j is beam j of example b
# --------------------------------------------------------------------------------------------

def test_gpt_beam_search_on_a_padded_batch_equals_one_prompt_at_a_time() -> None:
    """3 prompts, 2 beams: a mask tiled (m0 m1 m2 m0 m1 m2) instead of interleaved (m0 m0 m1 m1
    m2 m2) would give even the best beam of the second prompt the third prompt's padding."""
    from lecture_pkg.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=40, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                          dropout=0.0, embd_dropout=0.0), dtype=torch.float64).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(5)  # sharp, prompt-dependent distributions
    prompts = [[5, 9, 3, 7], [11, 4], [8, 30, 8]]
    t = max(map(len, prompts))
    ids = torch.tensor([[PAD] * (t - len(p)) + p for p in prompts])  # left padding
    mask = torch.tensor([[0] * (t - len(p)) + [1] * len(p) for p in prompts])
    batch = model.generate(ids, mask, num_beams=2, max_new_tokens=4)
    for b, prompt in enumerate(prompts):
        alone = model.generate(torch.tensor([prompt]), num_beams=2, max_new_tokens=4)
        assert batch[b, t:].tolist() == alone[0, len(prompt):].tolist(), b


def test_transformer_beam_search_on_a_padded_batch_equals_one_source_at_a_time() -> None:
    """As above for the encoder output and the source mask repeated over beam rows."""
    from lecture_pkg.transformer import Transformer

    torch.manual_seed(0)
    model = Transformer(30, 30, d_model=16, num_heads=2, num_encoder_layers=1,
                        num_decoder_layers=1, d_ff=32, dropout=0.0, pad_token_id=PAD,
                        dtype=torch.float64).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4)
    sources = [[5, 9, 3, 7], [11, 4], [8, 29, 8]]
    t = max(map(len, sources))
    src = torch.tensor([s + [PAD] * (t - len(s)) for s in sources])
    options = {"bos_token_id": 2, "eos_token_id": EOS, "num_beams": 2, "max_new_tokens": 4}
    with torch.no_grad():
        batch = model.generate(src, **options)
        for b, source in enumerate(sources):
            alone = model.generate(torch.tensor([source]), **options)
            n = alone.shape[1]
            assert batch[b, :n].tolist() == alone[0].tolist(), b
            assert (batch[b, n:] == PAD).all()
