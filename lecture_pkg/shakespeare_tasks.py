"""The tasks of chapter 10, built offline from the Shakespeare corpus
(:func:`lecture_pkg.data.shakespeare`), with their data and their scores.

* **Which spelling** (10.1, in-context learning): a prompt of ``word: answer`` lines whose
  answers are the words lower-cased, upper-cased or title-cased (:data:`SPELLINGS`), then a
  query word; only the demonstrations say which spelling is wanted. :func:`spelling_words` gives
  the words (held-out ones never occur in the training works), :func:`demonstration_text` the
  lines, :func:`demonstration_windows` such lists as pretraining text (the few-shot GPTs of
  :mod:`lecture_pkg.shakespeare_gpt`), and :func:`spelling_accuracy` scores a model, the way
  GPT-3 (Brown et al. 2020) scored multiple-choice tasks in the zero-, one- and few-shot
  settings (:func:`lecture_pkg.lm_eval.answer_logprob`).
* **A small instruction set with checkable answers** (10.2, instruction tuning):
  :func:`make_instructions` over any text, :func:`shakespeare_instructions` over one split of
  the corpus (upper-case a word, reverse it, count the words of a line), so held-out
  instructions come from held-out plays; :func:`exact_match` scores answers.
  The preference pairs of 10.2 and 10.3 are the SFT model's own samples ranked by
  :func:`exact_match` (:func:`lecture_pkg.rlhf.preference_set`).
"""

from __future__ import annotations

import functools
import random
import re
from collections import defaultdict
from collections.abc import Callable, Collection, Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from lecture_pkg.char_tokenizers import CharTokenizer
from lecture_pkg.checks import check_int
from lecture_pkg.data import shakespeare
from lecture_pkg.lm_eval import answer_logprob

__all__ = ["INSTRUCTION_TASKS", "SPELLINGS", "Instruction", "demonstration_text",
           "demonstration_windows", "eight_letter_upper", "exact_match", "make_instructions",
           "shakespeare_instructions", "spelling_accuracy",
           "spelling_generation_accuracy", "spelling_words"]

# --- which spelling: few-shot prompts (10.1) -------------------------------------------------

SPELLINGS: dict[str, Callable[[str], str]] = {"lower": str.lower, "upper": str.upper,
                                              "title": str.title}


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


def _spelling_prompts(tokenizer: CharTokenizer, words: Sequence[str], spelling: str,
                      shots: int, seed: int, n: int,
                      separator: str) -> list[tuple[str, list[int]]]:
    """(query, prompt ids) for ``n`` query words drawn from ``words`` with
    ``random.Random(seed)``: ``shots`` demonstration lines of other words in ``spelling``,
    then the query and ``separator``."""
    _check_spelling(spelling)
    check_int("shots", shots)
    check_int("n", n, minimum=1)
    if len(words) < n + shots:
        raise ValueError(f"words must hold at least n + shots = {n + shots} words, got "
                         f"{len(words)}")
    rng = random.Random(seed)
    out = []
    for query in rng.sample(list(words), n):
        demos = rng.sample([w for w in words if w != query], shots)
        out.append((query, tokenizer.encode(demonstration_text(demos, spelling, separator)
                                            + query + separator)))
    return out


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
    prompts, answers = [], []
    for query, prompt in _spelling_prompts(tokenizer, words, spelling, shots, seed, n,
                                           separator):
        for spell in SPELLINGS.values():
            prompts.append(prompt)
            answers.append(tokenizer.encode(spell(query) + "\n"))
    scores = answer_logprob(model, prompts, answers, tokenizer.pad_id).view(n, len(SPELLINGS))
    return (scores.argmax(-1) == list(SPELLINGS).index(spelling)).float().mean().item()



@torch.no_grad()
def spelling_generation_accuracy(model: nn.Module, tokenizer: CharTokenizer,
                                 words: Sequence[str], spelling: str, shots: int, seed: int,
                                 n: int, separator: str = ": ",
                                 max_new_tokens: int = 10) -> float:
    """Few-shot *which spelling* by free generation: the prompts of :func:`spelling_accuracy`
    (the same queries and demonstrations for the same ``seed``), each continued greedily in
    one left-padded batch until a newline or ``max_new_tokens`` characters; a query counts
    as right when the line it writes is exactly the query in ``spelling``. A harsher test
    than scoring three candidates: the model must produce every character itself."""
    check_int("max_new_tokens", max_new_tokens, minimum=1)
    queries, prompts = zip(*_spelling_prompts(tokenizer, words, spelling, shots, seed, n,
                                              separator))
    spell = SPELLINGS[spelling]
    device = next(model.parameters()).device
    width = max(map(len, prompts))
    pad, newline = tokenizer.pad_id, tokenizer.encode("\n")[0]
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    keep = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts],
                        device=device)
    out = model.eval().generate(ids, keep, max_new_tokens=max_new_tokens,
                                eos_token_id=newline, pad_token_id=pad)[:, width:]
    right = 0
    for query, row in zip(queries, out.tolist()):
        line = row[:row.index(newline)] if newline in row else None
        right += line is not None and tokenizer.decode(line) == spell(query)
    return right / n


# --- instructions and preferences (10.2, 10.3) -----------------------------------------------

INSTRUCTION_TASKS = ("upper", "reverse", "count")


class Instruction(NamedTuple):
    """One instruction: its task, the prompt the user writes and the one correct answer."""

    task: str
    prompt: str
    answer: str


def make_instructions(text: str, n: int, seed: int = 0,
                      tasks: Sequence[str] = INSTRUCTION_TASKS,
                      exclude_words: Collection[str] = ()) -> list[Instruction]:
    """``n`` instructions drawn from ``text``, the tasks in turn:

    - ``"upper: night"`` -> ``"NIGHT"`` and ``"reverse: night"`` -> ``"thgin"``, on lower-case
      words of 3 to 7 letters (``exclude_words`` left out, e.g. the training words);
    - ``"count: Which is a wonder"`` -> ``"4"``, on lines of 1 to 9 words and at most 40
      characters.

    Deterministic given ``seed``.
    """
    check_int("n", n, minimum=1)
    unknown = [t for t in tasks if t not in INSTRUCTION_TASKS]
    if unknown or not tasks:
        raise ValueError(f"tasks must be a non-empty subset of {INSTRUCTION_TASKS}, got {tasks}")
    excluded = set(exclude_words)
    words = sorted({w for w in re.findall(r"\b[a-z]+\b", text)
                    if 3 <= len(w) <= 7 and w not in excluded})
    lines = sorted({line.strip() for line in text.split("\n")
                    if 0 < len(line.strip()) <= 40 and len(line.split()) <= 9})
    if not words or not lines:
        raise ValueError("text must hold lower-case words of 3 to 7 letters and short lines")
    rng = random.Random(seed)
    examples = []
    for i in range(n):
        task = tasks[i % len(tasks)]
        if task == "count":
            line = rng.choice(lines)
            examples.append(Instruction(task, f"count: {line}", str(len(line.split()))))
        else:
            word = rng.choice(words)
            answer = word.upper() if task == "upper" else word[::-1]
            examples.append(Instruction(task, f"{task}: {word}", answer))
    return examples


@functools.cache
def _training_words() -> frozenset[str]:
    return frozenset(re.findall(r"\b[a-z]+\b", shakespeare("train")))


def shakespeare_instructions(split: str, n: int, seed: int = 0,
                             tasks: Sequence[str] = INSTRUCTION_TASKS) -> list[Instruction]:
    """:func:`make_instructions` over the works of one split of
    :func:`lecture_pkg.data.shakespeare`. Outside ``"train"`` the words of the training works
    are left out, so a held-out instruction's word was never seen in training."""
    exclude = _training_words() if split != "train" else frozenset()
    return make_instructions(shakespeare(split), n, seed, tasks, exclude_words=exclude)


def eight_letter_upper(split: str) -> list[Instruction]:
    """One ``upper`` instruction for every distinct eight-letter lower-case word of a split,
    in sorted order: the reinforcement-learning task of 10.2 and 10.3, longer words than the
    instruction data's. Outside ``"train"`` the words of the training works are left out."""
    exclude = _training_words() if split != "train" else frozenset()
    found = set(re.findall(r"\b[a-z]+\b", shakespeare(split))) - exclude
    return [Instruction("upper", f"upper: {w}", w.upper()) for w in sorted(found) if len(w) == 8]


def exact_match(predictions: Sequence[str], items: Sequence[Instruction]) -> dict[str, float]:
    """Exact-match accuracy per task, {task: share of items whose prediction is the answer}."""
    if len(predictions) != len(items):
        raise ValueError(f"predictions has {len(predictions)} entries but items {len(items)}")
    by_task: dict[str, list[bool]] = defaultdict(list)
    for prediction, item in zip(predictions, items):
        by_task[item.task].append(prediction == item.answer)
    return {task: sum(hits) / len(hits) for task, hits in by_task.items()}
