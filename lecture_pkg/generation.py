"""Decoding: turn a model's next-token logits into output sequences.

Every function here is model-agnostic. A model is seen only through a ``step`` callable

    step(input_ids, cache) -> logits
        input_ids: (rows, t_new) LongTensor, the tokens the model has not seen yet;
        cache: whatever ``new_cache()`` returned (e.g. a list of :class:`KVCache`), or None;
        logits: (rows, t_new, vocab); only the last position's are used.

With ``use_cache=True`` the first call gets the whole prompt and a fresh ``new_cache()``, every
later call only the token chosen at the previous step: the model appends its keys and values to
the cache instead of recomputing the prefix. With ``use_cache=False`` every call gets the whole
sequence so far and ``cache=None``: the slow reference the cached path is tested against.

An encoder-decoder binds its encoder output (and the source padding mask) inside ``step``; a
decoder-only model binds nothing. Beam search runs ``batch * num_beams`` rows (row
``b * num_beams + j`` is beam j of example b), so a bound encoder output must be repeated with
``repeat_interleave(num_beams, dim=0)``; it reorders the cache with :func:`reorder_cache`.
A prompt with padding is the model's business too: ``step`` holds the prompt's padding mask.

The module, top to bottom:

1. logits processors: :func:`apply_temperature`, :func:`top_k_filter`, :func:`top_p_filter`;
2. :func:`greedy_search` and :func:`sample` (one loop, two ways of choosing the next token);
3. :func:`beam_search` with the GNMT length penalty (Wu et al. 2016).

All return (batch, t_prompt + t_out) LongTensors: the prompt followed by the generated tokens;
a sequence that stopped early (it produced an ``eos_token_id``, which is kept) is padded with
``pad_token_id`` to the length of the longest one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from lecture_pkg.checks import check_float_tensor, check_int

__all__ = [
    "apply_temperature",
    "beam_search",
    "gnmt_length_penalty",
    "greedy_search",
    "reorder_cache",
    "sample",
    "top_k_filter",
    "top_p_filter",
]

Step = Callable[[Tensor, Any], Tensor]
"""step(input_ids: (rows, t_new) long, cache) -> logits: (rows, t_new, vocab)."""

# --------------------------------------------------------------------------------------------
# 1. Logits processors: (batch, vocab) -> (batch, vocab), removed tokens set to -inf
# --------------------------------------------------------------------------------------------


def apply_temperature(logits: Tensor, temperature: float) -> Tensor:
    """logits / temperature: below 1 sharpens the distribution, above 1 flattens it."""
    check_float_tensor("logits", logits)
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) \
            or not math.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    return logits / temperature


def top_k_filter(logits: Tensor, top_k: int) -> Tensor:
    """Keep the ``top_k`` largest logits of each row (ties with the k-th are kept), set the
    others to -inf. ``top_k`` larger than the vocabulary keeps everything."""
    check_float_tensor("logits", logits)
    check_int("top_k", top_k, minimum=1)
    k = min(top_k, logits.shape[-1])
    kth = logits.topk(k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, -math.inf)


def top_p_filter(logits: Tensor, top_p: float) -> Tensor:
    """Nucleus filtering (Holtzman et al. 2020): keep the smallest set of most probable tokens
    whose probabilities sum to at least ``top_p``, set the others to -inf. The most probable
    token is always kept; ``top_p = 1`` keeps everything."""
    check_float_tensor("logits", logits)
    if not isinstance(top_p, (int, float)) or isinstance(top_p, bool) or not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    if top_p == 1:  # keep everything (a float cumsum can reach 1 before the last token)
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.float().softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # probability of the tokens ranked above
    remove_sorted = mass_before >= top_p  # the set already reached top_p without this token
    remove = remove_sorted.scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, -math.inf)


# --------------------------------------------------------------------------------------------
# 2. Greedy decoding and sampling
# --------------------------------------------------------------------------------------------


def reorder_cache(cache: Any, index: Tensor) -> None:
    """Keep rows ``index`` of every tensor in ``cache``, in place: objects with a
    ``reorder(index)`` method (:class:`lecture_pkg.attention.KVCache`), and lists or tuples of
    them, nested (the encoder-decoder's ``[(self_cache, cross_cache), ...]``)."""
    if hasattr(cache, "reorder"):
        cache.reorder(index)
    elif isinstance(cache, (list, tuple)):
        for item in cache:
            reorder_cache(item, index)
    elif cache is not None:
        raise TypeError(f"cannot reorder a cache of type {type(cache).__name__}: give it a "
                        "reorder(index) method or use lists/tuples of such objects")


def _stop_ids(eos_token_id: int | Sequence[int] | None, device: torch.device) -> Tensor:
    ids = [] if eos_token_id is None else (
        [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id))
    for i in ids:
        check_int("eos_token_id", i)
    return torch.tensor(ids, dtype=torch.long, device=device)


def _check_common(step: object, input_ids: object, max_new_tokens: object, pad_token_id: object,
                  use_cache: bool, new_cache: object) -> None:
    if not callable(step):
        raise TypeError(f"step must be callable as step(input_ids, cache), "
                        f"got {type(step).__name__}")
    if not isinstance(input_ids, Tensor) or input_ids.dtype != torch.long or input_ids.dim() != 2:
        got = (f"{input_ids.dtype} of shape {tuple(input_ids.shape)}"
               if isinstance(input_ids, Tensor) else type(input_ids).__name__)
        raise TypeError(f"input_ids must be a LongTensor of shape (batch, t), got {got}")
    if input_ids.shape[1] == 0:
        raise ValueError("input_ids must hold at least one token per row (e.g. a BOS token)")
    check_int("max_new_tokens", max_new_tokens, minimum=1)
    check_int("pad_token_id", pad_token_id)
    if use_cache and not callable(new_cache):
        raise ValueError("use_cache=True needs new_cache, a callable returning an empty cache")


def _next_logits(step: Step, ids: Tensor, new: Tensor, cache: Any) -> Tensor:
    """The last position's logits (rows, vocab): ``new`` tokens through the cache, or all."""
    logits = step(new, cache) if cache is not None else step(ids, None)
    if not isinstance(logits, Tensor) or logits.dim() != 3 or logits.shape[0] != ids.shape[0]:
        got = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
        raise ValueError(f"step must return logits of shape (rows={ids.shape[0]}, t_new, vocab), "
                         f"got {got}")
    return logits[:, -1]


def _decode(step: Step, input_ids: Tensor, choose: Callable[[Tensor], Tensor], max_new_tokens: int,
            eos_token_id: int | Sequence[int] | None, pad_token_id: int,
            new_cache: Callable[[], Any] | None, use_cache: bool) -> Tensor:
    """One token per step for every row, chosen by ``choose(logits) -> (rows,)``, until every row
    has produced a stop token or ``max_new_tokens`` are out."""
    _check_common(step, input_ids, max_new_tokens, pad_token_id, use_cache, new_cache)
    stop = _stop_ids(eos_token_id, input_ids.device)
    cache = new_cache() if use_cache else None  # type: ignore[misc]
    ids, new = input_ids, input_ids
    finished = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    for _ in range(max_new_tokens):
        token = choose(_next_logits(step, ids, new, cache))
        token = token.masked_fill(finished, pad_token_id)  # a finished row only pads
        finished |= torch.isin(token, stop)
        new = token[:, None]
        ids = torch.cat([ids, new], dim=1)
        if finished.all():
            break
    return ids


def greedy_search(step: Step, input_ids: Tensor, *, max_new_tokens: int = 50,
                  eos_token_id: int | Sequence[int] | None = None, pad_token_id: int = 0,
                  new_cache: Callable[[], Any] | None = None, use_cache: bool = True) -> Tensor:
    """The most probable next token at every step (argmax of the logits).

    input_ids: (batch, t) prompt, e.g. (batch, 1) of BOS for a decoder. Returns
    (batch, t + t_out), t_out <= max_new_tokens; see the module docstring for step/new_cache.
    """
    return _decode(step, input_ids, lambda logits: logits.argmax(dim=-1), max_new_tokens,
                   eos_token_id, pad_token_id, new_cache, use_cache)


def sample(step: Step, input_ids: Tensor, *, max_new_tokens: int = 50, temperature: float = 1.0,
           top_k: int | None = None, top_p: float | None = None,
           generator: torch.Generator | None = None,
           eos_token_id: int | Sequence[int] | None = None, pad_token_id: int = 0,
           new_cache: Callable[[], Any] | None = None, use_cache: bool = True) -> Tensor:
    """Draw each next token from softmax(logits / temperature), restricted to the ``top_k`` most
    probable tokens and then to the nucleus of mass ``top_p`` (HF's order of processors).
    ``generator`` makes the draw reproducible. Shapes as :func:`greedy_search`."""
    apply_temperature(torch.zeros(1), temperature)  # check the arguments before the first step
    if top_k is not None:
        check_int("top_k", top_k, minimum=1)
    if top_p is not None:
        top_p_filter(torch.zeros(1), top_p)

    def choose(logits: Tensor) -> Tensor:
        logits = apply_temperature(logits.float(), temperature)
        if top_k is not None:
            logits = top_k_filter(logits, top_k)
        if top_p is not None:
            logits = top_p_filter(logits, top_p)
        return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)[:, 0]

    return _decode(step, input_ids, choose, max_new_tokens, eos_token_id, pad_token_id, new_cache,
                   use_cache)


# --------------------------------------------------------------------------------------------
# 3. Beam search
# --------------------------------------------------------------------------------------------


def gnmt_length_penalty(length: int, alpha: float = 0.6) -> float:
    """lp(Y) = ((5 + |Y|) / 6)^alpha (Wu et al. 2016, eq. 14). Beam search ranks finished
    hypotheses by log P(Y) / lp(Y): without it (alpha = 0) short outputs win, because every
    token multiplies in a probability below one."""
    return ((5 + length) / 6) ** alpha


def beam_search(step: Step, input_ids: Tensor, *, num_beams: int = 4, max_new_tokens: int = 50,
                eos_token_id: int | Sequence[int] | None = None, pad_token_id: int = 0,
                length_penalty: float = 0.6, new_cache: Callable[[], Any] | None = None,
                use_cache: bool = True,
                return_scores: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Keep the ``num_beams`` most probable prefixes of every example; return the best finished
    hypothesis by log P(Y) / lp(Y) (:func:`gnmt_length_penalty`, alpha = ``length_penalty``,
    |Y| = generated tokens including the stop token).

    At each step the 2 * num_beams best continuations of all beams are ranked by log P; a
    continuation with a stop token becomes a finished hypothesis when it ranks among the first
    num_beams (as in fairseq and HF), the others fill the next beams. An example is done when
    it has num_beams finished hypotheses and its best open beam, scored at its current
    length, ranks below all of them (HF's rule; stopping at num_beams finished hypotheses
    alone would return improbable short outputs that finished early while the most probable
    one was still open). With alpha > 0 the rule is a heuristic: lp grows with length, so an
    open beam's normalised score can still rise after the example is declared done (HF's
    ``early_stopping="never"`` keeps searching in that case). After ``max_new_tokens`` the open
    beams count as finished too. With num_beams = 1 this is exactly :func:`greedy_search`. The paper
    (Vaswani et al. 2017) uses 4 beams, alpha = 0.6 and max_new_tokens = source length + 50.

    input_ids: (batch, t); ``step`` sees batch * num_beams rows. Returns (batch, t + t_out), and
    with return_scores also the best hypotheses' scores (batch,).
    """
    check_int("num_beams", num_beams, minimum=1)
    _check_common(step, input_ids, max_new_tokens, pad_token_id, use_cache, new_cache)
    if not isinstance(length_penalty, (int, float)) or not math.isfinite(length_penalty):
        raise ValueError(f"length_penalty must be a finite number, got {length_penalty!r}")
    stop = set(_stop_ids(eos_token_id, input_ids.device).tolist())
    batch, t_prompt = input_ids.shape
    beams, device = num_beams, input_ids.device
    ids = input_ids.repeat_interleave(beams, dim=0)  # (batch * beams, t)
    # all beams start as the same prompt: only beam 0 may expand, or we would get duplicates
    # float64 sums: hypotheses of different lengths are compared after many small additions
    scores = torch.full((batch, beams), -math.inf, dtype=torch.float64, device=device)
    scores[:, 0] = 0.0
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(batch)]
    done = [False] * batch
    cache = new_cache() if use_cache else None  # type: ignore[misc]
    new = ids
    for length in range(1, max_new_tokens + 1):
        log_probs = _next_logits(step, ids, new, cache).double().log_softmax(dim=-1)
        vocab = log_probs.shape[-1]
        penalty = gnmt_length_penalty(length, length_penalty)
        candidates = (scores.reshape(-1, 1) + log_probs).reshape(batch, beams * vocab)
        top_scores, top_index = candidates.topk(min(2 * beams, beams * vocab), dim=1)
        next_scores = torch.full_like(scores, -math.inf)
        next_parent = torch.zeros((batch, beams), dtype=torch.long, device=device)
        next_token = torch.full((batch, beams), pad_token_id, dtype=torch.long, device=device)
        rows_scores, rows_index = top_scores.tolist(), top_index.tolist()
        for b in range(batch):
            if done[b]:
                continue
            slot = 0
            for rank, (score, index) in enumerate(zip(rows_scores[b], rows_index[b])):
                if score == -math.inf or slot == beams:
                    break
                parent, token = divmod(index, vocab)
                if token in stop:
                    if rank < beams:
                        prefix = ids[b * beams + parent, t_prompt:].tolist()
                        finished[b].append((score / penalty, prefix + [token]))
                else:
                    next_scores[b, slot], next_parent[b, slot] = score, parent
                    next_token[b, slot] = token
                    slot += 1
            if len(finished[b]) >= beams:  # done unless an open beam could still rank higher
                kth_best = sorted(score for score, _ in finished[b])[-beams]
                best_open = next_scores[b, 0].item() / penalty
                done[b] = best_open <= kth_best
        if all(done):
            break
        rows = (torch.arange(batch, device=device)[:, None] * beams + next_parent).reshape(-1)
        new = next_token.reshape(-1, 1)
        ids = torch.cat([ids.index_select(0, rows), new], dim=1)
        scores = next_scores
        if cache is not None:
            reorder_cache(cache, rows)
    else:  # out of length: the open beams are hypotheses too
        penalty = gnmt_length_penalty(max_new_tokens, length_penalty)
        for b in range(batch):
            for j, score in enumerate(scores[b].tolist()):
                if not done[b] and score > -math.inf:
                    finished[b].append((score / penalty, ids[b * beams + j, t_prompt:].tolist()))

    best = [max(hypotheses, key=lambda h: h[0]) for hypotheses in finished]
    t_out = max(len(tokens) for _, tokens in best)
    out = torch.full((batch, t_prompt + t_out), pad_token_id, dtype=torch.long, device=device)
    out[:, :t_prompt] = input_ids
    for b, (_, tokens) in enumerate(best):
        out[b, t_prompt:t_prompt + len(tokens)] = torch.tensor(tokens, device=device)
    if return_scores:
        return out, torch.tensor([score for score, _ in best], dtype=torch.float64, device=device)
    return out
