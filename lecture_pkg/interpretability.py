"""Looking inside the book's GPT: hooks, induction-head scores, the logit lens, direct logit
attribution, head ablation and activation patching (Elhage et al. 2021; Olsson et al. 2022;
nostalgebraist 2020; Meng et al. 2022), on :class:`lecture_pkg.models.gpt.GPT` as it is.

Every tool reads or rewrites the model's activations through PyTorch hooks on the modules the
GPT already has, and names them the way TransformerLens does:

- ``resid_pre{l}``: the residual stream entering block ``l`` (``l = n_layer`` is the stream
  entering the final norm ``ln_f``); ``resid_pre0`` is token plus position embedding;
- ``z{l}``: the heads' outputs before the output projection, (batch, t, heads, head_dim);
- ``attn_out{l}``, ``mlp_out{l}``: what block ``l``'s attention and FFN add to the stream;
- ``pattern{l}``: the attention weights, (batch, heads, t_q, t_k).

The GPT is pre-LN, so the stream is a sum: ``resid_pre{n} = resid_pre0 + sum_l (attn_out{l} +
mlp_out{l})``, and ``attn_out{l}`` is the sum over heads of ``z{l}[..., h, :] @ W_O[h]^T`` plus
the output projection's bias. Direct logit attribution splits a logit along that sum; the one
thing that does not split is the final norm's division by the stream's standard deviation,
which :func:`direct_logit_attribution` freezes at its value in the run (stated, and exact: the
parts then add up to the logit).

Shapes: ids (batch, t) integer token ids; a (layer, head) pair names one head.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

import torch
from torch import Tensor, nn

from lecture_pkg.checks import check_int
from lecture_pkg.models.gpt import GPT, GPTConfig, lm_batches

__all__ = [
    "NoFeedForward", "ablate_heads", "activation_patching", "attention_only_gpt",
    "composition_scores", "direct_logit_attribution", "head_means", "head_weights",
    "induction_scores", "logit_difference", "logit_lens", "nats_lost", "ov_copying_scores",
    "prefix_matches", "previous_token_scores", "repeat_losses", "repeated_tokens",
    "repeat_span_batches", "row_losses", "run_with_cache", "token_losses",
]

Head = tuple[int, int]


def _check_gpt(model: object) -> GPT:
    if not isinstance(model, GPT):
        raise TypeError(f"model must be a lecture_pkg GPT, got {type(model).__name__}")
    return model


def _check_ids(name: str, ids: object, model: GPT) -> Tensor:
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.dtype not in (torch.long, torch.int):
        raise ValueError(f"{name} must be an integer tensor of shape (batch, t), got "
                         f"{getattr(ids, 'shape', type(ids).__name__)}")
    if ids.shape[1] > model.config.n_positions:
        raise ValueError(f"{name} has {ids.shape[1]} positions but the model's context is "
                         f"{model.config.n_positions}")
    return ids


# --------------------------------------------------------------------------------------------
# 1. An attention-only GPT and the repeated-tokens task
# --------------------------------------------------------------------------------------------

class NoFeedForward(nn.Module):
    """An FFN that adds nothing to the stream: forward(x) -> zeros like x."""

    def forward(self, x: Tensor) -> Tensor:
        return torch.zeros_like(x)


def attention_only_gpt(config: GPTConfig, device: torch.device | str | None = None) -> GPT:
    """The package's GPT with every block's FFN replaced by :class:`NoFeedForward`: attention
    layers only, the model Elhage et al. read circuits from. Dropout is switched off."""
    if not isinstance(config, GPTConfig):
        raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
    model = GPT(replace(config, dropout=0.0, embd_dropout=0.0), device=device)
    for block in model.blocks:
        block.ffn = NoFeedForward()
        block.ffn_block.norm.requires_grad_(False)  # its output is multiplied by nothing
    return model


def repeated_tokens(batch: int, t: int, vocab_size: int, min_length: int | None = None,
                    generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """Rows of t tokens made of a segment of L uniform random tokens repeated (the last
    repeat cut at t): ``[segment | segment | segment ...]``. Returns (ids (batch, t),
    lengths (batch,)).

    Each row draws its L uniformly from [min_length, t // 2] (default: L = t // 2 for every
    row, the segment shown exactly twice). Varying L forces a model to find the earlier
    occurrence of a token by its content: with one fixed L it could attend a fixed distance
    back instead. The first copy is unpredictable (ln vocab_size nats per token at best), the
    repeats can be copied.
    """
    check_int("batch", batch, minimum=1)
    check_int("t", t, minimum=4)
    check_int("vocab_size", vocab_size, minimum=2)
    longest = t // 2
    min_length = longest if min_length is None else check_int("min_length", min_length, 2)
    if min_length > longest:
        raise ValueError(f"min_length {min_length} exceeds t // 2 = {longest}")
    segment = torch.randint(vocab_size, (batch, longest), generator=generator)
    lengths = torch.randint(min_length, longest + 1, (batch,), generator=generator)
    source = torch.arange(t)[None] % lengths[:, None]  # (batch, t): position modulo L
    return segment.gather(1, source), lengths


def repeat_span_batches(tokens: Tensor, alphabet: Tensor, batch_size: int, window: int,
                        seed: int, repeat: bool = True, min_length: int = 6,
                        max_length: int = 24) -> Callable[[int], Tensor]:
    """step -> (batch_size, window) training windows of ``tokens`` (as
    :func:`lecture_pkg.models.gpt.lm_batches` draws them) in which every row carries a random
    string of L tokens from ``alphabet`` (L uniform in [min_length, max_length]) at a random
    offset a, and a second string of L at a random offset c >= a + L.

    ``repeat=True``: the second string is the first one again, so the row rewards copying
    from context at a distance that varies from row to row. ``repeat=False`` is the control:
    the second string is drawn independently, and everything else (windows, offsets, lengths,
    the first string) is the same for the same seed and step.

    tokens: (n,) ids; alphabet: (k,) ids the strings are drawn from.
    """
    check_int("min_length", min_length, minimum=1)
    check_int("max_length", max_length, minimum=min_length)
    if 2 * max_length > window:
        raise ValueError(f"window {window} must hold two strings of max_length {max_length}")
    if not isinstance(alphabet, Tensor) or alphabet.dim() != 1 or len(alphabet) < 2:
        raise ValueError("alphabet must be a 1-D tensor of at least 2 token ids")
    text = lm_batches(tokens, batch_size, window, seed)

    def batch(step: int) -> Tensor:
        rows = text(step).clone()
        draw = torch.Generator().manual_seed(seed * 1_000_003 + step + 7)
        for row in rows:
            length = int(torch.randint(min_length, max_length + 1, (1,), generator=draw))
            a = int(torch.randint(0, window - 2 * length + 1, (1,), generator=draw))
            c = int(torch.randint(a + length, window - length + 1, (1,), generator=draw))
            first, second = alphabet[torch.randint(len(alphabet), (2, length),
                                                    generator=draw)]
            row[a:a + length] = first
            row[c:c + length] = first if repeat else second
        return rows

    return batch


def _copy_positions(lengths: Tensor, t: int) -> tuple[Tensor, Tensor]:
    """Masks over the t - 1 next-token predictions (prediction i is of token i + 1): tokens
    1..L-1 of the first copy, and tokens L+1.. of the repeats (token L, the first of the
    second copy, is left out: nothing announces that the copying begins)."""
    if not isinstance(lengths, Tensor) or lengths.dim() != 1:
        raise ValueError("lengths must be a (batch,) tensor of repeat lengths")
    if bool((lengths < 2).any()) or bool((2 * lengths > t).any()):
        raise ValueError(f"lengths must lie in [2, t // 2 = {t // 2}], got {lengths.tolist()}")
    token = torch.arange(1, t, device=lengths.device)[None]
    return token < lengths[:, None], token > lengths[:, None]


@torch.no_grad()
def token_losses(model: nn.Module, ids: Tensor) -> Tensor:
    """-log p(ids[:, i + 1] | ids[:, :i + 1]) for every position: (batch, t - 1)."""
    logits = model(ids).logits[:, :-1]
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    return -torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)


@torch.no_grad()
def repeat_losses(model: nn.Module, ids: Tensor, lengths: Tensor) -> tuple[float, float]:
    """Mean next-token loss (nats) over the first copy and over the repeats of
    :func:`repeated_tokens` rows (see :func:`_copy_positions` for which tokens count)."""
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.shape[0] != len(lengths):
        raise ValueError(f"ids must have shape (batch, t) with batch = len(lengths) = "
                         f"{len(lengths)}, got {getattr(ids, 'shape', type(ids).__name__)}")
    first, second = _copy_positions(lengths, ids.shape[1])
    loss = token_losses(model, ids)
    first, second = first.to(loss.device), second.to(loss.device)
    return loss[first].mean().item(), loss[second].mean().item()


# --------------------------------------------------------------------------------------------
# 2. Hooks: read every activation, or overwrite some
# --------------------------------------------------------------------------------------------

@contextmanager
def _hooked(model: GPT, cache: dict[str, Tensor] | None = None,
            edit: dict[str, Callable[[Tensor], Tensor]] | None = None) -> Iterator[None]:
    """Register hooks that record activations into ``cache`` and replace the named ones by
    ``edit[name](activation)``; removed on exit, even after an error."""
    edit = edit or {}
    handles = []

    def pre_hook(name: str) -> Callable:
        def hook(module: nn.Module, args: tuple) -> tuple | None:
            x = args[0]
            if name in edit:
                x = edit[name](x)
            if cache is not None:
                cache[name] = x.detach()
            return (x, *args[1:]) if name in edit else None
        return hook

    def z_hook(name: str, heads: int) -> Callable:
        def hook(module: nn.Module, args: tuple) -> tuple | None:
            flat = args[0]
            z = flat.unflatten(-1, (heads, -1))  # (batch, t, heads, head_dim)
            if name in edit:
                z = edit[name](z)
            if cache is not None:
                cache[name] = z.detach()
            return (z.flatten(-2), *args[1:]) if name in edit else None
        return hook

    def out_hook(name: str) -> Callable:
        def hook(module: nn.Module, args: tuple, out: Tensor) -> Tensor | None:
            if name in edit:
                out = edit[name](out)
            if cache is not None:
                cache[name] = out.detach()
            return out if name in edit else None
        return hook

    try:
        for i, block in enumerate(model.blocks):
            attn = block.self_attn
            handles.append(block.register_forward_pre_hook(pre_hook(f"resid_pre{i}")))
            handles.append(attn.out_proj.register_forward_pre_hook(z_hook(f"z{i}",
                                                                          attn.num_heads)))
            handles.append(attn.out_proj.register_forward_hook(out_hook(f"attn_out{i}")))
            handles.append(block.ffn.register_forward_hook(out_hook(f"mlp_out{i}")))
        handles.append(model.ln_f.register_forward_pre_hook(
            pre_hook(f"resid_pre{len(model.blocks)}")))
        yield
    finally:
        for handle in handles:
            handle.remove()


@torch.no_grad()
def run_with_cache(model: GPT, ids: Tensor,
                   edit: dict[str, Callable[[Tensor], Tensor]] | None = None
                   ) -> tuple[Tensor, dict[str, Tensor]]:
    """Run ``model`` on ids (batch, t) and return (logits, cache): every activation named in the
    module docstring, ``pattern{l}`` included. ``edit`` maps names to functions that replace
    that activation on the way (see :func:`ablate_heads`, :func:`activation_patching`)."""
    model = _check_gpt(model)
    ids = _check_ids("ids", ids, model)
    unknown = set(edit or {}) - _names(model)
    if unknown:
        raise KeyError(f"edit names {sorted(unknown)} are not activations of this model "
                       f"(known: resid_pre0..{len(model.blocks)}, z/attn_out/mlp_out 0.."
                       f"{len(model.blocks) - 1})")
    cache: dict[str, Tensor] = {}
    with _hooked(model, cache, edit):
        out = model(ids, output_attentions=True)
    for i, weights in enumerate(out.attentions):
        cache[f"pattern{i}"] = weights
    return out.logits, cache


def _names(model: GPT) -> set[str]:
    n = len(model.blocks)
    return ({f"resid_pre{i}" for i in range(n + 1)}
            | {f"{kind}{i}" for kind in ("z", "attn_out", "mlp_out") for i in range(n)})


# --------------------------------------------------------------------------------------------
# 3. Attention-pattern scores: previous-token and induction heads
# --------------------------------------------------------------------------------------------

def _stack_patterns(patterns: Sequence[Tensor]) -> Tensor:
    if not patterns or any(not isinstance(p, Tensor) or p.dim() != 4 for p in patterns):
        raise ValueError("patterns must be a sequence of (batch, heads, t, t) attention weights, "
                         "one per layer")
    return torch.stack(list(patterns))  # (layers, batch, heads, t, t)


def previous_token_scores(patterns: Sequence[Tensor]) -> Tensor:
    """(layers, heads): each head's mean attention from position i to i - 1 (i >= 1). A
    previous-token head scores near 1; a uniform causal head about H(t)/t."""
    p = _stack_patterns(patterns)
    return p.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(1, 3))


def prefix_matches(ids: Tensor) -> Tensor:
    """(batch, t, t) bool: [b, i, j] is True when key j follows an earlier occurrence of the
    token at query i (1 <= j <= i and ids[b, j - 1] == ids[b, i]): where an induction head
    looks."""
    if not isinstance(ids, Tensor) or ids.dim() != 2:
        raise ValueError(f"ids must have shape (batch, t), got "
                         f"{getattr(ids, 'shape', type(ids).__name__)}")
    t = ids.shape[1]
    previous = torch.cat([ids.new_full((ids.shape[0], 1), -1), ids[:, :-1]], dim=1)
    same = ids[:, :, None] == previous[:, None, :]  # [b, i, j]: ids[i] == ids[j - 1]
    return same & torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()


def induction_scores(patterns: Sequence[Tensor], ids: Tensor) -> Tensor:
    """(layers, heads): Olsson et al.'s prefix-matching score, each head's mean attention on
    the keys that follow an earlier occurrence of the query's token (:func:`prefix_matches`),
    over the queries that have one. An induction head scores near 1; on
    :func:`repeated_tokens` rows a head attending a fixed distance back scores near 0 except
    at the one distance L - 1."""
    p = _stack_patterns(patterns)
    matches = prefix_matches(ids)
    if tuple(matches.shape) != tuple(p.shape[1:2]) + tuple(p.shape[-2:]):
        raise ValueError(f"ids {tuple(ids.shape)} do not match patterns over "
                         f"{p.shape[-1]} positions for batch {p.shape[1]}")
    has_match = matches.any(-1)  # (batch, t): queries whose token occurred before
    if not bool(has_match.any()):
        raise ValueError("no query in ids has an earlier occurrence of its token")
    on_matches = (p * matches[None, :, None].to(p.dtype)).sum(-1)  # (layers, batch, heads, t)
    return (on_matches * has_match[None, :, None]).sum(dim=(1, 3)) / has_match.sum()


# --------------------------------------------------------------------------------------------
# 4. Circuits read from the weights
# --------------------------------------------------------------------------------------------

def head_weights(model: GPT, layer: int, head: int) -> dict[str, Tensor]:
    """One head's matrices in the row-vector convention of the stream (x @ W):
    W_Q, W_K, W_V (d_model, head_dim) with the block's LayerNorm gain folded in, W_O
    (head_dim, d_model); W_QK = W_Q W_K^T and W_OV = W_V W_O (d_model, d_model). The norm's
    centring and its division by the standard deviation are left out (they scale, per token,
    what the matrices read)."""
    model = _check_gpt(model)
    check_int("layer", layer)
    check_int("head", head)
    if layer >= len(model.blocks) or head >= model.config.n_head:
        raise ValueError(f"(layer, head) = ({layer}, {head}) is outside the model's "
                         f"{len(model.blocks)} layers x {model.config.n_head} heads")
    block = model.blocks[layer]
    attn, gain = block.self_attn, block.attn_block.norm.weight
    rows = slice(head * attn.embed_dim // attn.num_heads,
                 (head + 1) * attn.embed_dim // attn.num_heads)
    w = {name: gain[:, None] * proj.weight[rows].T
         for name, proj in (("W_Q", attn.q_proj), ("W_K", attn.k_proj), ("W_V", attn.v_proj))}
    w["W_O"] = attn.out_proj.weight[:, rows].T
    w["W_QK"] = w["W_Q"] @ w["W_K"].T
    w["W_OV"] = w["W_V"] @ w["W_O"]
    return {name: value.detach() for name, value in w.items()}


def composition_scores(model: GPT, kind: str) -> Tensor:
    """Elhage et al.'s composition scores between every earlier head (writer) and every later
    head (reader): (layers, heads, layers, heads), entry [l2, h2, l1, h1] for l1 < l2, else 0.

    - ``"K"``: ||W_QK^{h2} (W_OV^{h1})^T||_F / (||W_QK^{h2}||_F ||W_OV^{h1}||_F): how much
      h2's keys read what h1 wrote (an induction head K-composes with a previous-token head);
    - ``"Q"``: ||W_OV^{h1} W_QK^{h2}||_F / (...), the queries' side;
    - ``"V"``: ||W_OV^{h1} W_OV^{h2}||_F / (...), the values' side.

    A score is at most 1 (Frobenius norms are submultiplicative) and 0 when the writer's output
    space is orthogonal to what the reader reads.
    """
    if kind not in ("K", "Q", "V"):
        raise ValueError(f"kind must be 'K', 'Q' or 'V', got {kind!r}")
    model = _check_gpt(model)
    n, heads = len(model.blocks), model.config.n_head
    w = [[head_weights(model, layer, h) for h in range(heads)] for layer in range(n)]
    out = torch.zeros(n, heads, n, heads)
    for l2 in range(n):
        for h2 in range(heads):
            reader = w[l2][h2]["W_OV" if kind == "V" else "W_QK"]
            for l1 in range(l2):
                for h1 in range(heads):
                    ov = w[l1][h1]["W_OV"]
                    both = reader @ ov.T if kind == "K" else ov @ reader
                    out[l2, h2, l1, h1] = both.norm() / (reader.norm() * ov.norm())
    return out


def ov_copying_scores(model: GPT) -> Tensor:
    """(layers, heads): for each head, the share of tokens t whose own logit is the largest when
    the head attends fully to t, read from the weights: the full OV circuit
    W_E W_OV W_U (vocab, vocab) (the norms' scales left out, the final norm's gain folded into
    W_U). A copying head scores near 1, a random one about 1 / vocab."""
    model = _check_gpt(model)
    embed = model.wte.weight.detach()
    unembed = (model.ln_f.weight[:, None] * model.lm_head.weight.T).detach()  # (d, vocab)
    heads = model.config.n_head
    scores = torch.zeros(len(model.blocks), heads)
    for layer in range(len(model.blocks)):
        for h in range(heads):
            circuit = embed @ head_weights(model, layer, h)["W_OV"] @ unembed
            own = circuit.argmax(dim=-1) == torch.arange(circuit.shape[0],
                                                         device=circuit.device)
            scores[layer, h] = own.float().mean()
    return scores


# --------------------------------------------------------------------------------------------
# 5. Ablation: a head's output zeroed or replaced by its mean
# --------------------------------------------------------------------------------------------

def _check_heads(model: GPT, heads: Iterable[Head]) -> list[Head]:
    heads = [tuple(h) for h in heads]
    for layer, head in heads:
        if not (0 <= layer < len(model.blocks) and 0 <= head < model.config.n_head):
            raise ValueError(f"head ({layer}, {head}) is outside the model's "
                             f"{len(model.blocks)} layers x {model.config.n_head} heads")
    return heads  # type: ignore[return-value]


@torch.no_grad()
def head_means(model: GPT, ids: Tensor) -> Tensor:
    """(layers, heads, head_dim): every head's output z averaged over ids' rows and positions,
    the value mean-ablation puts in its place."""
    _, cache = run_with_cache(model, ids)
    return torch.stack([cache[f"z{i}"].mean(dim=(0, 1)) for i in range(len(model.blocks))])


def ablate_heads(model: GPT, heads: Iterable[Head],
                 means: Tensor | None = None) -> dict[str, Callable[[Tensor], Tensor]]:
    """The ``edit`` for :func:`run_with_cache` that ablates ``heads``: their outputs z are set
    to zero (``means=None``) or to ``means[layer, head]`` from :func:`head_means`. What the head
    would have written is then W_O's image of that constant (zero ablation leaves only the
    output projection's bias, which belongs to no head)."""
    model = _check_gpt(model)
    heads = _check_heads(model, heads)
    n, h, dh = len(model.blocks), model.config.n_head, model.config.n_embd // model.config.n_head
    if means is not None and tuple(means.shape) != (n, h, dh):
        raise ValueError(f"means must have shape (layers, heads, head_dim) = {(n, h, dh)}, "
                         f"got {tuple(means.shape)}")
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        by_layer.setdefault(layer, []).append(head)

    def editor(layer: int, chosen: list[int]) -> Callable[[Tensor], Tensor]:
        def edit(z: Tensor) -> Tensor:
            z = z.clone()
            for head in chosen:
                z[:, :, head] = 0.0 if means is None else means[layer, head].to(z)
            return z
        return edit

    return {f"z{layer}": editor(layer, chosen) for layer, chosen in by_layer.items()}


# --------------------------------------------------------------------------------------------
# 6. The logit lens and direct logit attribution
# --------------------------------------------------------------------------------------------

@torch.no_grad()
def logit_lens(model: GPT, ids: Tensor) -> Tensor:
    """(layers + 1, batch, t, vocab): the stream entering each block (and, last, entering
    ``ln_f``) read as if it were the last one, through ``ln_f`` and the unembedding
    (nostalgebraist 2020). The last entry is the model's logits."""
    _, cache = run_with_cache(model, ids)
    return torch.stack([model.lm_head(model.ln_f(cache[f"resid_pre{i}"]))
                        for i in range(len(model.blocks) + 1)])


@torch.no_grad()
def direct_logit_attribution(model: GPT, ids: Tensor,
                             targets: Tensor) -> tuple[list[str], Tensor]:
    """Split the logit of ``targets`` (batch, t) at every position into what each part of the
    stream adds to it: (names, contributions (parts, batch, t)).

    Parts: ``embed`` (token + position), ``L{l}H{h}`` for each head, ``L{l} attn bias`` (the
    output projection's bias), ``L{l} mlp``, and ``ln_f bias``. The final norm is
    ``(x - mean(x)) / sigma * g + b``: it is linear in x once sigma, the stream's standard
    deviation at that position, is frozen at its value in this run, and with sigma frozen the
    parts add up to the logit exactly.
    """
    model = _check_gpt(model)
    if not isinstance(targets, Tensor) or targets.shape != ids.shape:
        raise ValueError(f"targets must have the shape of ids {tuple(ids.shape)}, got "
                         f"{getattr(targets, 'shape', type(targets).__name__)}")
    logits, cache = run_with_cache(model, ids)
    n, ln = len(model.blocks), model.ln_f
    final = cache[f"resid_pre{n}"]
    sigma = (final.var(-1, unbiased=False, keepdim=True) + ln.eps).sqrt()
    direction = model.lm_head.weight[targets] * ln.weight  # (batch, t, d): W_U[target] * g

    def through_norm(part: Tensor) -> Tensor:
        return ((part - part.mean(-1, keepdim=True)) / sigma * direction).sum(-1)

    names, parts = ["embed"], [through_norm(cache["resid_pre0"])]
    for layer, block in enumerate(model.blocks):
        attn = block.self_attn
        w_o = attn.out_proj.weight.unflatten(1, (attn.num_heads, -1))  # (d, heads, head_dim)
        per_head = torch.einsum("bthe,dhe->hbtd", cache[f"z{layer}"], w_o)
        for h in range(attn.num_heads):
            names.append(f"L{layer}H{h}")
            parts.append(through_norm(per_head[h]))
        names.append(f"L{layer} attn bias")
        bias = attn.out_proj.bias if attn.out_proj.bias is not None else final.new_zeros(1)
        parts.append(through_norm(bias.expand_as(final)))
        names.append(f"L{layer} mlp")
        parts.append(through_norm(cache[f"mlp_out{layer}"]))
    names.append("ln_f bias")
    bias = ln.bias if ln.bias is not None else final.new_zeros(final.shape[-1])
    parts.append((bias * model.lm_head.weight[targets]).sum(-1))
    return names, torch.stack(parts)


# --------------------------------------------------------------------------------------------
# 7. Activation patching
# --------------------------------------------------------------------------------------------

@torch.no_grad()
def activation_patching(model: GPT, clean: Tensor, corrupt: Tensor,
                        metric: Callable[[Tensor], Tensor]) -> Tensor:
    """Patch the residual stream from the clean run into the corrupted one, one (layer,
    position) at a time (Meng et al. 2022): (layers + 1, t), the ``metric`` of each patched
    run's logits. Row l patches ``resid_pre{l}`` (row ``n_layer``: the stream entering ln_f).

    clean, corrupt: (batch, t) prompts of the same length; metric: logits (batch, t, vocab) ->
    a scalar tensor (e.g. a logit difference at the last position)."""
    model = _check_gpt(model)
    clean, corrupt = _check_ids("clean", clean, model), _check_ids("corrupt", corrupt, model)
    if clean.shape != corrupt.shape:
        raise ValueError(f"clean {tuple(clean.shape)} and corrupt {tuple(corrupt.shape)} must "
                         f"have the same shape")
    _, cache = run_with_cache(model, clean)
    n, t = len(model.blocks), clean.shape[1]
    out = torch.zeros(n + 1, t)
    for layer in range(n + 1):
        name = f"resid_pre{layer}"
        for position in range(t):
            def patch(x: Tensor, name: str = name, position: int = position) -> Tensor:
                x = x.clone()
                x[:, position] = cache[name][:, position]
                return x
            logits, _ = run_with_cache(model, corrupt, {name: patch})
            out[layer, position] = float(metric(logits))
    return out


def logit_difference(right: int, wrong: int) -> Callable[[Tensor], Tensor]:
    """A patching metric: logit[right] - logit[wrong] at the last position, over the batch."""
    check_int("right", right)
    check_int("wrong", wrong)

    def metric(logits: Tensor) -> Tensor:
        last = logits[:, -1].float()
        return (last[:, right] - last[:, wrong]).mean()

    return metric


@torch.no_grad()
def row_losses(model: GPT, ids: Tensor,
               edit: dict[str, Callable[[Tensor], Tensor]] | None = None) -> Tensor:
    """Each row's mean next-token loss (nats), with ``edit`` applied on the way: (batch,). It
    runs the fused attention kernel (no patterns are recorded)."""
    model = _check_gpt(model)
    ids = _check_ids("ids", ids, model)
    unknown = set(edit or {}) - _names(model)
    if unknown:
        raise KeyError(f"edit names {sorted(unknown)} are not activations of this model")
    with _hooked(model, None, edit):
        return token_losses(model, ids).mean(-1)


def nats_lost(model: GPT, ids: Tensor, edit: dict[str, Callable[[Tensor], Tensor]]) -> Tensor:
    """Per-row increase of the mean next-token loss (nats) when ``edit`` is applied: (batch,)."""
    return row_losses(model, ids, edit) - row_losses(model, ids)
