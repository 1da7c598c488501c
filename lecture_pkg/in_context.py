"""In-context regression: a Transformer that learns to learn from the examples in its prompt.

Every training sequence is a new task: a random function f, points x_1..x_n and their values
y_i = f(x_i). The model reads ``x_1, y_1, x_2, y_2, ..., x_n, y_n`` (one token per number
vector, as Garg et al. 2022 set it up) and, at each x_i, predicts y_i from the pairs before it.
No weight changes between tasks: whatever fitting happens, happens in the forward pass. The
baselines are the estimators a statistician would use on the same prefix: least squares
(:func:`prefix_least_squares`, optimal for noiseless linear tasks) and Nadaraya-Watson
(:func:`prefix_nadaraya_watson`, :mod:`lecture_pkg.kernel_regression`), which is one softmax
attention head whose query and key are x and whose value is y.

Shapes: xs (batch, n, d), ys (batch, n); predictions (batch, n), entry i made from pairs < i.

Prompting a pretrained model is scored here too: :func:`answer_logprob` gives each candidate
answer its summed log-probability after a prompt, the way GPT-3 (Brown et al. 2020) scored
multiple-choice tasks in the zero-, one- and few-shot settings. The book's task is *which
spelling*: a prompt of ``word: answer`` lines whose answers are the words lower-cased,
upper-cased or title-cased (:data:`SPELLINGS`), then a query word; only the demonstrations say
which spelling is wanted (:func:`spelling_accuracy`). :func:`demonstration_windows` writes such
lists as pretraining text.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from lecture_pkg.alignment import pad_right, sequence_logprobs
from lecture_pkg.checks import check_float_tensor, check_int
from lecture_pkg.data import shakespeare
from lecture_pkg.kernel_regression import nadaraya_watson
from lecture_pkg.layers import EncoderLayer
from lecture_pkg.pretrained import CharTokenizer

__all__ = ["SPELLINGS", "ICLTransformer", "answer_logprob", "demonstration_text",
           "demonstration_windows", "lipschitz_tasks", "linear_tasks", "prefix_least_squares",
           "prefix_nadaraya_watson", "spelling_accuracy", "spelling_words"]

SPELLINGS: dict[str, Callable[[str], str]] = {"lower": str.lower, "upper": str.upper,
                                              "title": str.title}


@torch.no_grad()
def answer_logprob(model: nn.Module, prompts: list[list[int]], answers: list[list[int]],
                   pad_id: int) -> Tensor:
    """log p(answer | prompt) = sum over the answer's tokens of log p(token | everything before
    it), for each (prompt, answer) pair of token ids, in one right-padded batch.

    ``model(ids)`` must return an object with ``.logits`` (batch, t, vocab) from a causal
    language model, so padding after a sequence cannot change its scores. Prompts need at least
    one token, answers too; prompt plus answer must fit the model's context. Returns (n,)
    float32 on the CPU."""
    if len(prompts) != len(answers) or not prompts:
        raise ValueError(f"prompts and answers must be non-empty lists of equal length, got "
                         f"{len(prompts)} and {len(answers)}")
    if any(len(p) == 0 for p in prompts) or any(len(a) == 0 for a in answers):
        raise ValueError("prompts and answers must each hold at least one token")
    # right padding: a causal model's scores of a sequence cannot see the padding after it
    ids, _, scored = pad_right([(list(p) + list(a), [False] * len(p) + [True] * len(a))
                                for p, a in zip(prompts, answers)], pad_id)
    device = next(model.parameters()).device
    logits = model(ids.to(device)).logits
    return sequence_logprobs(logits, ids.to(device), scored.to(device)).float().cpu()


def spelling_words(split: str) -> list[str]:
    """Lower-case words of the Shakespeare corpus, sorted: for ``"train"`` every word of 3 to 9
    letters in the training works (the demonstrations of pretraining); for ``"test"`` the words
    of 4 to 7 letters in the test works that never occur in the training works (the prompts'
    queries and demonstrations, so nothing asked was seen in pretraining)."""
    if split == "train":
        return sorted(set(re.findall(r"\b[a-z]{3,9}\b", shakespeare("train"))))
    if split == "test":
        seen = set(re.findall(r"\b[a-z]+\b", shakespeare("train").lower()))
        return sorted(set(re.findall(r"\b[a-z]{4,7}\b", shakespeare("test"))) - seen)
    raise ValueError(f"split must be 'train' or 'test', got {split!r}")


def _check_spelling(spelling: str) -> Callable[[str], str]:
    if spelling not in SPELLINGS:
        raise ValueError(f"spelling must be one of {list(SPELLINGS)}, got {spelling!r}")
    return SPELLINGS[spelling]


def demonstration_text(words: Sequence[str], spelling: str, separator: str = ": ") -> str:
    """One ``word: answer`` line per word, the answer being the word in ``spelling`` (a key of
    :data:`SPELLINGS`): ``demonstration_text(["king"], "upper") == "king: KING\\n"``.
    ``separator`` replaces the ``": "`` between word and answer."""
    spell = _check_spelling(spelling)
    if not isinstance(separator, str) or not separator or "\n" in separator:
        raise ValueError(f"separator must be a non-empty string without a newline, got "
                         f"{separator!r}")
    return "".join(f"{word}{separator}{spell(word)}\n" for word in words)


def demonstration_windows(words: Sequence[str], encode: Callable[[str], list[int]],
                          count: int, length: int, rng: random.Random,
                          separators: Sequence[str] = (": ",)) -> Tensor:
    """(count, length) token ids of demonstration lists to mix into pretraining batches.
    Each row draws one spelling at random (and one of ``separators``, when there are several)
    and is ``word: answer`` lines of random ``words`` in it, from the row's first character,
    cut at ``length`` characters. The task is never named: a model can only tell it from the
    lines before."""
    check_int("count", count, minimum=1)
    check_int("length", length, minimum=1)
    if not words:
        raise ValueError("words must not be empty")
    if not separators:
        raise ValueError("separators must not be empty")
    rows = []
    for _ in range(count):
        spelling, text = rng.choice(list(SPELLINGS)), ""
        # one separator draws nothing, so such runs replay the single-format recipe exactly
        separator = rng.choice(list(separators)) if len(separators) > 1 else separators[0]
        while len(text) < length:
            text += demonstration_text(rng.choices(words, k=8), spelling, separator)
        rows.append(encode(text[:length]))
    return torch.tensor(rows)


def spelling_accuracy(model: nn.Module, tokenizer: CharTokenizer, words: Sequence[str],
                      spelling: str, shots: int, seed: int, n: int,
                      separator: str = ": ") -> float:
    """Few-shot accuracy on *which spelling*: for each of ``n`` query words (drawn from
    ``words`` with ``random.Random(seed)``), the prompt is ``shots`` demonstration lines of
    other words in ``spelling`` and then ``"query: "``; each spelling of the query in
    :data:`SPELLINGS` (with its newline) is scored by :func:`answer_logprob`, and the query
    counts as right when ``spelling`` scores highest. Chance is 1 / len(SPELLINGS).
    ``separator`` replaces ``": "`` in the demonstrations and after the query.
    """
    _check_spelling(spelling)
    check_int("shots", shots)
    check_int("n", n, minimum=1)
    if len(words) < n + shots:
        raise ValueError(f"words must hold at least n + shots = {n + shots} words, got "
                         f"{len(words)}")
    rng = random.Random(seed)
    prompts, answers = [], []
    for query in rng.sample(list(words), n):
        demos = rng.sample([w for w in words if w != query], shots)
        prompt = tokenizer.encode(demonstration_text(demos, spelling, separator)
                                  + query + separator)
        for spell in SPELLINGS.values():
            prompts.append(prompt)
            answers.append(tokenizer.encode(spell(query) + "\n"))
    scores = answer_logprob(model, prompts, answers, tokenizer.pad_id).view(n, len(SPELLINGS))
    return (scores.argmax(-1) == list(SPELLINGS).index(spelling)).float().mean().item()


def linear_tasks(batch: int, n_points: int, dim: int, generator: torch.Generator | None = None,
                 noise: float = 0.0) -> tuple[Tensor, Tensor]:
    """Random linear tasks y = w . x (+ noise), with w and x standard normal.
    Returns xs (batch, n_points, dim) and ys (batch, n_points)."""
    for name, value in (("batch", batch), ("n_points", n_points), ("dim", dim)):
        check_int(name, value, minimum=1)
    xs = torch.randn(batch, n_points, dim, generator=generator)
    w = torch.randn(batch, dim, 1, generator=generator)
    ys = (xs @ w).squeeze(-1)
    if noise:
        ys = ys + noise * torch.randn(batch, n_points, generator=generator)
    return xs, ys


def lipschitz_tasks(batch: int, n_points: int, lipschitz: float,
                    generator: torch.Generator | None = None,
                    noise: float = 0.0) -> tuple[Tensor, Tensor]:
    """Random 1-D functions with Lipschitz constant at most ``lipschitz`` on [-1, 1]:
    f(x) = (L / k) sin(k x + phi) averaged over three random frequencies k in [1, 4] (each
    term's slope is at most L / 3). xs (batch, n_points, 1) uniform on [-1, 1]; ys (batch,
    n_points) = f(xs) (+ noise times standard normal noise, drawn after the functions)."""
    check_int("batch", batch, minimum=1)
    check_int("n_points", n_points, minimum=1)
    if not lipschitz > 0:
        raise ValueError(f"lipschitz must be positive, got {lipschitz}")
    xs = torch.rand(batch, n_points, 1, generator=generator) * 2 - 1
    k = torch.rand(batch, 1, 3, generator=generator) * 3 + 1
    phase = torch.rand(batch, 1, 3, generator=generator) * 2 * torch.pi
    ys = (lipschitz / (3 * k) * torch.sin(k * xs + phase)).sum(-1)
    if noise:
        ys = ys + noise * torch.randn(batch, n_points, generator=generator)
    return xs, ys


def _check_tasks(xs: Tensor, ys: Tensor) -> None:
    check_float_tensor("xs", xs)
    check_float_tensor("ys", ys)
    if xs.dim() != 3 or ys.shape != xs.shape[:2]:
        raise ValueError(f"xs must be (batch, n, d) and ys (batch, n), got {tuple(xs.shape)} "
                         f"and {tuple(ys.shape)}")


def prefix_least_squares(xs: Tensor, ys: Tensor) -> Tensor:
    """Least squares on each prefix: entry i is x_i . w_i, w_i the minimum-norm solution of the
    pairs before i (0 for i = 0). (batch, n)."""
    _check_tasks(xs, ys)
    predictions = torch.zeros_like(ys)
    for i in range(1, xs.shape[1]):
        w = torch.linalg.pinv(xs[:, :i]) @ ys[:, :i, None]  # (batch, d, 1)
        predictions[:, i] = (xs[:, i:i + 1] @ w).flatten()
    return predictions


def prefix_nadaraya_watson(xs: Tensor, ys: Tensor, bandwidth: float | Tensor) -> Tensor:
    """Gaussian Nadaraya-Watson on each prefix: entry i pools the y_j, j < i, with weights
    softmax(-||x_i - x_j||^2 / (2 h^2)); entry 0 has nothing to pool and is 0. (batch, n)."""
    _check_tasks(xs, ys)
    n = xs.shape[1]
    earlier = torch.ones(n, n, dtype=torch.bool, device=xs.device).tril(-1)
    return torch.stack([nadaraya_watson(x, x, y, "gaussian", bandwidth, mask=earlier)[0]
                        for x, y in zip(xs, ys)])


class ICLTransformer(nn.Module):
    """A small GPT-like model over the interleaved sequence x_1, y_1, ..., x_n, y_n.

    Each token is a (dim + 1)-vector, [x, 0] or [0, y], mapped to d_model by one linear layer,
    plus a learned position embedding; pre-LN causal blocks (:class:`EncoderLayer`); a linear
    read-out of the hidden state at every x token. forward(xs (batch, n, dim), ys (batch, n))
    -> predictions (batch, n): entry i sees x_1, y_1, ..., x_i but not y_i.
    """

    def __init__(self, dim: int, max_points: int, d_model: int = 64, n_layer: int = 2,
                 n_head: int = 4) -> None:
        super().__init__()
        for name, value in (("dim", dim), ("max_points", max_points), ("d_model", d_model),
                            ("n_layer", n_layer), ("n_head", n_head)):
            check_int(name, value, minimum=1)
        self.dim, self.max_points = dim, max_points
        self.read_in = nn.Linear(dim + 1, d_model)
        self.position = nn.Embedding(2 * max_points, d_model)
        self.blocks = nn.ModuleList(
            EncoderLayer(d_model, n_head, 4 * d_model, dropout=0.0, activation="gelu",
                         wiring="pre") for _ in range(n_layer))
        self.norm = nn.LayerNorm(d_model)
        self.read_out = nn.Linear(d_model, 1)

    def forward(self, xs: Tensor, ys: Tensor) -> Tensor:
        _check_tasks(xs, ys)
        batch, n, dim = xs.shape
        if dim != self.dim or n > self.max_points:
            raise ValueError(f"xs must be (batch, n <= {self.max_points}, {self.dim}), "
                             f"got {tuple(xs.shape)}")
        x_tokens = torch.cat([xs, torch.zeros_like(xs[..., :1])], dim=-1)
        y_tokens = torch.cat([torch.zeros_like(xs), ys[..., None]], dim=-1)
        tokens = torch.stack([x_tokens, y_tokens], dim=2).view(batch, 2 * n, dim + 1)
        h = self.read_in(tokens) + self.position.weight[:2 * n]
        for block in self.blocks:
            h, _ = block(h, is_causal=True)
        return self.read_out(self.norm(h[:, ::2])).squeeze(-1)
