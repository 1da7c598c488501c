"""Attention masks and the corruptions that pretraining objectives apply to their inputs.

Boolean masks use True = "may attend", as torch's SDPA does. A mask is 2-D (t_q, t_k), 3-D
(batch, t_q, t_k) or 4-D (batch, heads, t_q, t_k); :func:`broadcast_mask` and
:func:`combine_masks` bring them to the (batch, heads, t_q, t_k) shape of attention scores.

* who may attend to whom: :func:`causal_mask`, :func:`padding_mask`, :func:`sliding_window_mask`,
  :func:`sliding_window_causal_mask` (a decoder's window, optionally with attention sinks),
  :func:`longformer_mask` (window + global tokens), :func:`bigbird_mask` (+ random keys),
  :func:`prefix_lm_mask`, and :func:`to_additive_mask` to add a mask to scores in any float dtype;
* several documents packed into one row: :func:`packed_document_ids`, :func:`document_mask`
  (block-diagonal) and :func:`position_ids` (restarting per document, or after left padding);
* what the model must reconstruct: :func:`mlm_mask` (BERT's 80/10/10 corruption) and
  :func:`span_corruption` (T5's sentinel spans, built on :func:`apply_span_corruption`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal, TypeVar

import torch
from torch import Tensor

from lecture_pkg.checks import check_bool_mask, check_int

__all__ = [
    "IGNORE_INDEX", "T5_SENTINELS", "apply_span_corruption", "bigbird_mask", "broadcast_mask",
    "causal_mask", "combine_masks", "document_mask", "longformer_mask", "mlm_mask",
    "packed_document_ids", "padding_mask", "position_ids", "prefix_lm_mask", "random_spans",
    "sliding_window_causal_mask", "sliding_window_mask", "span_corruption", "to_additive_mask",
]

Device = torch.device | str | None
Token = TypeVar("Token")

IGNORE_INDEX = -100
"""Label of positions that carry no loss (``torch.nn.functional.cross_entropy``'s default)."""

T5_SENTINELS = tuple(f"<extra_id_{i}>" for i in range(100))
"""T5's sentinel tokens, in the order spans use them (the slides write <X>, <Y>, <Z>)."""


def _positions(t: int, device: Device) -> tuple[Tensor, Tensor]:
    """Query indices as a column (t, 1) and key indices as a row (1, t)."""
    idx = torch.arange(t, device=device)
    return idx[:, None], idx[None, :]


# ---------------------------------------------------------------------------------------------
# Who may attend to whom
# ---------------------------------------------------------------------------------------------

def causal_mask(t_q: int, t_k: int | None = None, device: Device = None, *,
                align: Literal["top-left", "bottom-right"] = "top-left") -> Tensor:
    """(t_q, t_k) bool mask letting query i attend to keys j <= i (the lower triangle).

    For t_q != t_k, ``align`` says where the triangle sits:

    - ``"top-left"`` (default): query i sees keys 0..i, exactly as
      ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)`` aligns it;
    - ``"bottom-right"``: the t_q queries are the *last* t_q positions of a length-t_k sequence,
      so query i sees keys 0..(t_k - t_q + i). This is the mask for decoding with a key-value
      cache or for chunked prefill, where the new queries follow t_k - t_q cached positions.
    """
    check_int("t_q", t_q)
    t_k = t_q if t_k is None else check_int("t_k", t_k)
    if align not in ("top-left", "bottom-right"):
        raise ValueError(f"align must be 'top-left' or 'bottom-right', got {align!r}")
    offset = 0 if align == "top-left" else t_k - t_q
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril(diagonal=offset)


def _check_lengths(lengths: Tensor | Sequence[int], max_len: int | None) -> tuple[Tensor, int]:
    lengths = torch.as_tensor(lengths)
    if lengths.dim() != 1 or lengths.is_floating_point() or lengths.dtype == torch.bool:
        raise ValueError(f"lengths must be a 1-D integer tensor (batch,), got {lengths.dtype} "
                         f"of shape {tuple(lengths.shape)}")
    if max_len is None:
        max_len = int(lengths.max()) if len(lengths) else 0
    check_int("max_len", max_len)
    if len(lengths) and (int(lengths.min()) < 0 or int(lengths.max()) > max_len):
        raise ValueError(f"lengths must lie in [0, max_len={max_len}], got {lengths.tolist()}")
    return lengths, max_len


def padding_mask(lengths: Tensor | Sequence[int], max_len: int | None = None,
                 side: Literal["right", "left"] = "right") -> Tensor:
    """(batch, max_len) bool mask, True at the real tokens of padded sequences.

    lengths: (batch,) integer lengths; ``max_len`` defaults to the longest. ``side`` says where
    the padding goes: "right" (after the tokens, for training) or "left" (before them, so that
    prompts of a generation batch all end at the last position). The mask follows the device of
    ``lengths``. To mask padded *keys* in attention, index it as ``mask[:, None, None, :]``
    (batch, 1, 1, t_k); rows of padded queries are computed but a loss must ignore them.
    """
    lengths, max_len = _check_lengths(lengths, max_len)
    if side not in ("right", "left"):
        raise ValueError(f"side must be 'right' or 'left', got {side!r}")
    positions = torch.arange(max_len, device=lengths.device)[None, :]
    if side == "left":
        return positions >= max_len - lengths[:, None]
    return positions < lengths[:, None]


def sliding_window_mask(t: int, window: int, causal: bool = False, device: Device = None) -> Tensor:
    """(t, t) bool mask of local attention: query i sees key j when |i - j| <= window
    (and j <= i when ``causal``). Each row allows at most 2 * window + 1 keys, so the number of
    attended pairs grows linearly in t."""
    check_int("t", t)
    check_int("window", window)
    i, j = _positions(t, device)
    mask = (i - j).abs() <= window
    return mask & (j <= i) if causal else mask


def sliding_window_causal_mask(t: int, window: int, num_sinks: int = 0,
                               device: Device = None) -> Tensor:
    """(t, t) bool mask of a decoder's sliding window: query i sees the ``window`` keys
    i - window < j <= i (itself included), as Mistral and Gemma 2/3's local layers count it
    (HF's ``sliding_window_causal_mask_function``), so a rolling cache of ``window`` slots holds
    everything a query needs. With ``num_sinks > 0`` every query also sees the first
    ``num_sinks`` positions (j < num_sinks, j <= i): StreamingLLM's attention sinks (Xiao et al.,
    2023). ``window >= t`` gives :func:`causal_mask`.

    Note the count differs from :func:`sliding_window_mask` (``|i - j| <= window``, an encoder's
    radius): there ``causal=True`` lets each query see window + 1 keys.
    """
    check_int("t", t)
    check_int("window", window, 1)
    check_int("num_sinks", num_sinks)
    i, j = _positions(t, device)
    return (j <= i) & ((i - j < window) | (j < num_sinks))


def _global_indicator(t: int, global_tokens: Iterable[int], device: Device) -> Tensor:
    indices = list(global_tokens)
    bad = [g for g in indices if not isinstance(g, int) or isinstance(g, bool) or not 0 <= g < t]
    if bad:
        raise ValueError(f"global_tokens must be positions in [0, {t}), got {bad}")
    indicator = torch.zeros(t, dtype=torch.bool, device=device)
    indicator[indices] = True
    return indicator


def longformer_mask(t: int, window: int, global_tokens: Iterable[int] = (),
                    device: Device = None) -> Tensor:
    """(t, t) bool mask of Longformer's pattern: a sliding window (|i - j| <= window) plus global
    tokens (e.g. [CLS]) that attend to every position and that every position attends to."""
    mask = sliding_window_mask(t, window, device=device)
    is_global = _global_indicator(t, global_tokens, device)
    return mask | is_global[:, None] | is_global[None, :]


def bigbird_mask(t: int, window: int, global_tokens: Iterable[int] = (), num_random: int = 0,
                 generator: torch.Generator | None = None, device: Device = None) -> Tensor:
    """(t, t) bool mask of BigBird's pattern: :func:`longformer_mask` plus, in every row,
    ``num_random`` keys drawn uniformly among those the row does not see yet (fewer if fewer are
    left). Token-level for clarity; BigBird itself works on blocks of tokens.

    The random keys come from ``generator`` (drawn on its device), so a seeded generator gives the
    same mask on every machine.
    """
    mask = longformer_mask(t, window, global_tokens, device=device)
    check_int("num_random", num_random)
    if num_random > t:
        raise ValueError(f"num_random must be at most t={t}, got {num_random}")
    if num_random == 0 or t == 0:
        return mask
    draw_device = generator.device if generator is not None else mask.device
    noise = torch.rand(t, t, generator=generator, device=draw_device).to(mask.device)
    noise = noise.masked_fill(mask, 2.0)  # keys already seen rank after every unseen one (< 1)
    lowest = noise.topk(num_random, dim=-1, largest=False)
    random_keys = torch.zeros_like(mask).scatter_(-1, lowest.indices, lowest.values < 2.0)
    return mask | random_keys


def prefix_lm_mask(t: int, prefix_len: int, device: Device = None) -> Tensor:
    """(t, t) bool mask of a prefix LM: every query sees the whole prefix (positions
    < ``prefix_len``, attended bidirectionally, as an encoder would) and the rest causally.
    ``prefix_len = 0`` gives :func:`causal_mask`, ``prefix_len = t`` full attention."""
    check_int("t", t)
    check_int("prefix_len", prefix_len)
    if prefix_len > t:
        raise ValueError(f"prefix_len must be at most t={t}, got {prefix_len}")
    _, j = _positions(t, device)
    return causal_mask(t, device=device) | (j < prefix_len)


# ---------------------------------------------------------------------------------------------
# Several documents in one row: sequence packing
# ---------------------------------------------------------------------------------------------

def packed_document_ids(lengths: Sequence[int] | Tensor, max_len: int | None = None) -> Tensor:
    """(max_len,) document index of every position when documents of the given lengths are
    packed one after the other into one row, -1 at the padding that fills the row up.

    E.g. lengths (3, 2) and max_len 6 give [0, 0, 0, 1, 1, -1]. ``max_len`` defaults to the sum.
    """
    lengths, _ = _check_lengths(lengths, None)
    total = int(lengths.sum())
    max_len = total if max_len is None else check_int("max_len", max_len)
    if total > max_len:
        raise ValueError(f"documents of {total} tokens in all do not fit in max_len={max_len}")
    ids = torch.repeat_interleave(torch.arange(len(lengths), device=lengths.device), lengths)
    return torch.cat([ids, ids.new_full((max_len - total,), -1)])


def _check_document_ids(document_ids: Tensor) -> Tensor:
    if not isinstance(document_ids, Tensor) or document_ids.is_floating_point() \
            or document_ids.is_complex() or document_ids.dtype == torch.bool:
        got = document_ids.dtype if isinstance(document_ids, Tensor) else type(document_ids)
        raise TypeError(f"document_ids must be an integer tensor (t,) or (batch, t), got {got}")
    if document_ids.dim() not in (1, 2):
        raise ValueError(f"document_ids must be (t,) or (batch, t), got shape "
                         f"{tuple(document_ids.shape)}")
    for row in document_ids.reshape(-1, document_ids.shape[-1]) if document_ids.numel() else ():
        real = row[row >= 0]
        runs = int((real[1:] != real[:-1]).sum()) + 1 if len(real) else 0
        if runs != len(real.unique()):
            raise ValueError(f"each document must occupy one contiguous run of positions, got "
                             f"document_ids {row.tolist()}")
    return document_ids


def document_mask(document_ids: Tensor, causal: bool = True) -> Tensor:
    """Block-diagonal mask of packed documents: query i may attend to key j only when both belong
    to the same document (and j <= i if ``causal``), so packed documents never see each other.

    document_ids: (t,) or (batch, t) integers, each document one contiguous run, negative at
    padding (never attended; a padding query attends to nothing). Returns (t, t) or
    (batch, t, t) bool, True = may attend.
    """
    ids = _check_document_ids(document_ids)
    same = (ids[..., :, None] == ids[..., None, :]) & (ids[..., None, :] >= 0)
    return same & causal_mask(ids.shape[-1], device=ids.device) if causal else same


def position_ids(document_ids: Tensor) -> Tensor:
    """Position of every token inside its own document: 0, 1, 2, ... restarting where a new
    document starts, 0 at padding (negative ids). Same shape as ``document_ids``, (t,) or
    (batch, t).

    With packing, each document then gets the positions it would have alone; with left padding
    (ids -1 for the padding, then 0 for the prompt) the first real token gets position 0 instead
    of its column index.
    """
    ids = _check_document_ids(document_ids)
    index = torch.arange(ids.shape[-1], device=ids.device).expand_as(ids)
    starts = torch.ones_like(ids, dtype=torch.bool)
    starts[..., 1:] = ids[..., 1:] != ids[..., :-1]
    run_start = torch.where(starts, index, 0).cummax(dim=-1).values
    return (index - run_start).masked_fill(ids < 0, 0)


def _as_4d(mask: Tensor, name: str) -> Tensor:
    check_bool_mask(name, mask)
    if mask.dim() == 2:  # (t_q, t_k)
        return mask[None, None]
    if mask.dim() == 3:  # (batch, t_q, t_k)
        return mask[:, None]
    if mask.dim() == 4:
        return mask
    raise ValueError(f"{name} must be (t_q, t_k), (batch, t_q, t_k) or (batch, heads, t_q, t_k), "
                     f"got shape {tuple(mask.shape)}")


def broadcast_mask(mask: Tensor, shape: Sequence[int]) -> Tensor:
    """Expand a bool mask to ``shape`` = (batch, heads, t_q, t_k) without copying.

    mask: (t_q, t_k), (batch, t_q, t_k) or (batch, heads, t_q, t_k), each dim either 1 or equal
    to the target; anything else raises instead of broadcasting silently.
    """
    if len(shape) != 4:
        raise ValueError(f"shape must be (batch, heads, t_q, t_k), got {tuple(shape)}")
    mask4 = _as_4d(mask, "mask")
    for axis, (have, want) in enumerate(zip(mask4.shape, shape)):
        if have not in (1, want):
            dim = ("batch", "heads", "t_q", "t_k")[axis]
            raise ValueError(f"mask of shape {tuple(mask.shape)} has {dim} = {have} but the scores "
                             f"have {dim} = {want} (must be 1 or {want})")
    return mask4.expand(*shape)


def combine_masks(*masks: Tensor) -> Tensor:
    """Logical AND of bool masks: a key may be attended only if every mask allows it.

    Each mask is (t_q, t_k), (batch, t_q, t_k) or (batch, heads, t_q, t_k) (see
    :func:`broadcast_mask`); the result is 4-D with the broadcast shape, e.g. a causal (t, t) mask
    and a key padding mask (batch, 1, 1, t) give (batch, 1, t, t).
    """
    if not masks:
        raise ValueError("combine_masks needs at least one mask")
    lifted = [_as_4d(m, f"masks[{i}]") for i, m in enumerate(masks)]
    try:
        shape = torch.broadcast_shapes(*(m.shape for m in lifted))
    except RuntimeError:
        shapes = ", ".join(str(tuple(m.shape)) for m in masks)
        raise ValueError(f"masks of shapes {shapes} do not broadcast to one "
                         f"(batch, heads, t_q, t_k)") from None
    combined = broadcast_mask(lifted[0], shape).clone()
    for m in lifted[1:]:
        combined &= m
    return combined


def to_additive_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """Bool mask (True = may attend) -> float mask M to add to scores: 0 where allowed and
    ``torch.finfo(dtype).min`` where blocked (a constant such as -10^9 would not even fit in
    fp16, whose most negative value is -65504).

    Adding is not as safe as ``masked_fill``: s + finfo.min rounds to -inf once s is a little
    below 0 (in fp16 for s < -16), and a row whose every score does that gives NaN. Add the mask
    in float32, or fill the blocked scores with ``masked_fill`` instead.
    """
    check_bool_mask("mask", mask)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating dtype, got {dtype}")
    zeros = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(mask, zeros, torch.finfo(dtype).min)


# ---------------------------------------------------------------------------------------------
# What the model must reconstruct: BERT's and T5's corruptions
# ---------------------------------------------------------------------------------------------

def _check_mlm_arguments(input_ids: Tensor, vocab_size: int, mask_token_id: int,
                         mlm_probability: float) -> None:
    if not isinstance(input_ids, Tensor) or input_ids.is_floating_point() \
            or input_ids.is_complex() or input_ids.dtype == torch.bool:
        got = input_ids.dtype if isinstance(input_ids, Tensor) else type(input_ids).__name__
        raise TypeError(f"input_ids must be an integer tensor, got {got}")
    check_int("vocab_size", vocab_size, minimum=1)
    if not isinstance(mask_token_id, int) or not 0 <= mask_token_id < vocab_size:
        raise ValueError(f"mask_token_id must be an id in [0, {vocab_size}), got {mask_token_id!r}")
    if not 0.0 <= mlm_probability <= 1.0:
        raise ValueError(f"mlm_probability must lie in [0, 1], got {mlm_probability}")
    if input_ids.numel() and not (0 <= int(input_ids.min()) and int(input_ids.max()) < vocab_size):
        raise ValueError(f"input_ids must lie in [0, vocab_size={vocab_size}), found ids in "
                         f"[{int(input_ids.min())}, {int(input_ids.max())}]")


def mlm_mask(input_ids: Tensor, vocab_size: int, mask_token_id: int,
             special_token_ids: Iterable[int] = (), mlm_probability: float = 0.15,
             generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """BERT's masked-LM corruption. Returns ``(inputs, labels)``, both shaped like ``input_ids``.

    input_ids: (batch, t) or any shape of integer ids; the tensor is not modified. Each token whose
    id is not in ``special_token_ids`` is selected with probability ``mlm_probability``; a selected
    token becomes ``mask_token_id`` with probability 0.8, a uniformly random id in
    [0, vocab_size) with probability 0.1, and stays as it is otherwise. ``labels`` holds the
    original id at selected positions and :data:`IGNORE_INDEX` (-100) elsewhere, so that the loss
    only counts the selected tokens.

    Random numbers come from ``generator`` (drawn on its device, the global generator if None) in
    the order HF transformers' ``DataCollatorForLanguageModeling`` draws them, so both give the
    same corruption from the same generator state.
    """
    _check_mlm_arguments(input_ids, vocab_size, mask_token_id, mlm_probability)
    draw_device = generator.device if generator is not None else input_ids.device
    ids = input_ids.to(draw_device)
    special = torch.isin(ids, torch.tensor(list(special_token_ids), dtype=ids.dtype,
                                           device=draw_device))

    def full(p: float) -> Tensor:
        return torch.full(ids.shape, p, device=draw_device)

    def bernoulli(probs: Tensor) -> Tensor:  # one coin per position
        return torch.bernoulli(probs, generator=generator).bool()

    selected = bernoulli(full(float(mlm_probability)).masked_fill_(special, 0.0))
    to_mask = bernoulli(full(0.8)) & selected
    to_random = bernoulli(full(0.5)) & selected & ~to_mask  # half of the other 20%: 10% overall
    random_ids = torch.randint(vocab_size, ids.shape, generator=generator, device=draw_device,
                               dtype=ids.dtype)

    inputs = ids.masked_fill(to_mask, mask_token_id)
    inputs = torch.where(to_random, random_ids, inputs)
    labels = ids.masked_fill(~selected, IGNORE_INDEX)
    return inputs.to(input_ids.device), labels.to(input_ids.device)


def _check_spans(spans: Sequence[tuple[int, int]], n: int) -> list[tuple[int, int]]:
    checked, previous_end = [], 0
    for span in spans:
        if len(span) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in span):
            raise ValueError(f"spans must be (start, end) pairs of ints, got {span!r}")
        start, end = span
        if not previous_end <= start < end <= n:
            raise ValueError(f"spans must be non-empty, sorted, non-overlapping half-open ranges "
                             f"within [0, {n}]; got {span} after a span ending at {previous_end}")
        checked.append((start, end))
        previous_end = end
    return checked


def apply_span_corruption(tokens: Sequence[Token] | Tensor, spans: Sequence[tuple[int, int]],
                          sentinels: Sequence[Token] = T5_SENTINELS) -> tuple[list[Token], list[Token]]:
    """T5's span corruption for given spans. Returns ``(inputs, targets)`` as lists.

    tokens: a sequence of n tokens (strings or ids; a 1-D tensor is read as its list of ids).
    spans: sorted, non-overlapping half-open ranges (start, end) of tokens to drop.
    In ``inputs`` each span is replaced by the next sentinel; ``targets`` lists each sentinel
    followed by the tokens it replaced, and closes with one more sentinel only when the text ends
    on kept tokens (so it needs len(spans) + 1 sentinels then, len(spans) otherwise). For a text
    that starts with kept tokens, as every draw of :func:`random_spans` does, this is T5's rule
    (``nonnoise_span_to_unique_sentinel``: one sentinel per run of kept tokens): T5's sampled
    texts end on a span, so their targets end with that span, and ``</s>`` follows.
    """
    if isinstance(tokens, Tensor):
        if tokens.dim() != 1:
            raise ValueError(f"tokens must be a 1-D tensor (n,), got shape {tuple(tokens.shape)}")
        tokens = tokens.tolist()
    tokens = list(tokens)
    spans = _check_spans(spans, len(tokens))
    ends_kept = (spans[-1][1] if spans else 0) < len(tokens)  # kept tokens after the last span
    if len(sentinels) < len(spans) + ends_kept:
        raise ValueError(f"{len(spans)} spans need {len(spans) + ends_kept} sentinels, "
                         f"got {len(sentinels)}")
    inputs: list[Token] = []
    targets: list[Token] = []
    kept_from = 0
    for (start, end), sentinel in zip(spans, sentinels):
        inputs += tokens[kept_from:start] + [sentinel]
        targets += [sentinel] + tokens[start:end]
        kept_from = end
    inputs += tokens[kept_from:]
    if ends_kept:
        targets.append(sentinels[len(spans)])
    return inputs, targets


def _random_partition(total: int, parts: int, generator: torch.Generator | None) -> list[int]:
    """``total`` items cut into ``parts`` non-empty runs, uniformly over all such cuttings."""
    device = generator.device if generator is not None else "cpu"
    order = torch.randperm(total - 1, generator=generator, device=device)
    cuts = (order[:parts - 1] + 1).sort().values.tolist()
    bounds = [0, *cuts, total]
    return [b - a for a, b in zip(bounds, bounds[1:])]


def random_spans(length: int, noise_density: float = 0.15, mean_span_length: float = 3.0,
                 generator: torch.Generator | None = None) -> list[tuple[int, int]]:
    """T5's random noise spans over ``length`` tokens, as sorted half-open (start, end) ranges.

    As in T5: noise tokens = round(length * density) (at least 1, at most length - 1), spans =
    round(noise / mean_span_length) (at least 1), the noise and the kept tokens are each cut into
    that many non-empty runs at random, and the runs alternate kept, noise, kept, noise, ... so the
    sequence starts with kept tokens and ends with a span. Draws from ``generator``.
    """
    check_int("length", length, minimum=2)
    if not 0.0 < noise_density < 1.0:
        raise ValueError(f"noise_density must lie in (0, 1), got {noise_density}")
    if not mean_span_length >= 1.0:
        raise ValueError(f"mean_span_length must be >= 1, got {mean_span_length}")
    num_noise = min(max(round(length * noise_density), 1), length - 1)
    num_spans = max(round(num_noise / mean_span_length), 1)
    num_spans = min(num_spans, length - num_noise)  # every span needs a kept run before it
    noise_lengths = _random_partition(num_noise, num_spans, generator)
    kept_lengths = _random_partition(length - num_noise, num_spans, generator)
    spans, start = [], 0
    for kept, noise in zip(kept_lengths, noise_lengths):
        start += kept
        spans.append((start, start + noise))
        start += noise
    return spans


def span_corruption(tokens: Sequence[Token] | Tensor, noise_density: float = 0.15,
                    mean_span_length: float = 3.0, sentinels: Sequence[Token] = T5_SENTINELS,
                    generator: torch.Generator | None = None) -> tuple[list[Token], list[Token]]:
    """T5's span-corruption objective: :func:`random_spans` then :func:`apply_span_corruption`.

    tokens: a sequence of at least 2 tokens (or a 1-D tensor of ids). Returns ``(inputs, targets)``.
    """
    n = len(tokens)
    spans = random_spans(n, noise_density, mean_span_length, generator=generator)
    return apply_span_corruption(tokens, spans, sentinels)
