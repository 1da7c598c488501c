"""One training loop for every chapter: progress, AdamW with warmup, clipping, autocast,
safetensors checkpoints that resume exactly, and DistributedDataParallel under torchrun.

The loop is deliberately plain (nanoGPT's, with the bookkeeping a textbook needs)::

    for step in range(start, steps):
        batch = batches(step)                 # the batch is a function of the step, so a
        loss = loss_fn(model, batch)          # resumed run sees the same data in the same order
        loss.backward(); clip; optimizer.step(); scheduler.step(); optimizer.zero_grad()

What it returns is a :class:`History` (losses, learning rates, evaluations) that the chapters
plot. In a notebook the progress bar is an HTML ``<progress>`` element updated in place, so the
stored notebook (and the static book) shows one finished bar instead of hundreds of lines.

Several processes: launch the same script with ``torchrun --nproc_per_node=N script.py``. Call
:func:`distributed_setup` first (gloo on CPUs, nccl on GPUs), wrap the model with
:func:`wrap_ddp`, and give each rank its own share of every global batch; :func:`train` then
averages the logged loss over ranks, and only rank 0 prints and writes checkpoints.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from lecture_pkg.checks import check_int

__all__ = [
    "History",
    "adamw",
    "distributed_setup",
    "load_checkpoint",
    "save_checkpoint",
    "train",
    "warmup_cosine",
    "wrap_ddp",
]

Batch = Any


@dataclass
class History:
    """What a training run measured: one entry per logged step, one per evaluation."""

    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)
    seconds: float = 0.0

    def records(self) -> list[dict[str, float | str]]:
        """Long-form rows (step, series, value) for an altair line chart of every curve."""
        rows: list[dict[str, float | str]] = [
            {"step": s, "series": "train loss", "value": v} for s, v in zip(self.steps, self.losses)]
        for step, metrics in zip(self.eval_steps, self.evals):
            rows += [{"step": step, "series": name, "value": value}
                     for name, value in metrics.items()]
        return rows


# --------------------------------------------------------------------------------------------
# Optimiser and schedule
# --------------------------------------------------------------------------------------------

def adamw(model: nn.Module, lr: float, weight_decay: float = 0.1,
          betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8) -> torch.optim.AdamW:
    """AdamW that decays matrices only: weights of linear layers and embeddings (dim >= 2), not
    biases and norm gains, whose decay would only pull them towards an arbitrary 0."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps)


def warmup_cosine(warmup_steps: int, total_steps: int,
                  min_ratio: float = 0.1) -> Callable[[int], float]:
    """LambdaLR factor: linear warmup from 0 to 1 over ``warmup_steps``, then a cosine decay to
    ``min_ratio`` at ``total_steps`` (and flat after it)."""
    check_int("warmup_steps", warmup_steps)
    check_int("total_steps", total_steps, minimum=1)
    if warmup_steps > total_steps:
        raise ValueError(f"warmup_steps {warmup_steps} exceeds total_steps {total_steps}")
    if not 0.0 <= min_ratio <= 1.0:
        raise ValueError(f"min_ratio must be in [0, 1], got {min_ratio}")

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


# --------------------------------------------------------------------------------------------
# Checkpoints: tensors in safetensors, everything else as JSON in its metadata
# --------------------------------------------------------------------------------------------

def save_checkpoint(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: torch.optim.lr_scheduler.LRScheduler | None, step: int,
                    history: History) -> None:
    """Write model and optimizer tensors, the torch RNG state and the bookkeeping to ``path``."""
    from safetensors.torch import save_file

    tensors, stored = {}, set()
    for k, v in _unwrap(model).state_dict().items():
        tensor = v.detach().cpu().contiguous()
        if tensor.data_ptr() in stored:  # tied weights (GPT's LM head is its embedding):
            tensor = tensor.clone()      # safetensors refuses tensors that share memory
        stored.add(tensor.data_ptr())
        tensors[f"model.{k}"] = tensor
    optim_state = optimizer.state_dict()
    for index, state in optim_state["state"].items():
        for name, value in state.items():
            tensors[f"optim.{index}.{name}"] = torch.as_tensor(value).cpu().contiguous()
    tensors["rng.cpu"] = torch.get_rng_state()
    meta = {"step": step, "history": asdict(history), "param_groups": optim_state["param_groups"],
            "scheduler": None if scheduler is None else scheduler.state_dict()}
    save_file(tensors, str(path), metadata={"training": json.dumps(meta)})


def load_checkpoint(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
                    ) -> tuple[int, History]:
    """Restore what :func:`save_checkpoint` wrote; returns (next step, history so far)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()["training"])
    tensors = load_file(str(path))
    target = _unwrap(model)
    device = next(target.parameters()).device
    target.load_state_dict({k[len("model."):]: v for k, v in tensors.items()
                            if k.startswith("model.")})
    state: dict[int, dict[str, Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, index, name = key.split(".", 2)
            state.setdefault(int(index), {})[name] = value.to(device) if name != "step" else value
    # JSON has no tuples: give back the optimizer's own types (AdamW's betas are a tuple)
    groups = [{k: tuple(v) if isinstance(current.get(k), tuple) else v for k, v in saved.items()}
              for saved, current in zip(meta["param_groups"], optimizer.param_groups)]
    optimizer.load_state_dict({"state": state, "param_groups": groups})
    if scheduler is not None and meta["scheduler"] is not None:
        scheduler.load_state_dict(meta["scheduler"])
    torch.set_rng_state(tensors["rng.cpu"])
    return meta["step"], History(**meta["history"])


# --------------------------------------------------------------------------------------------
# Several processes
# --------------------------------------------------------------------------------------------

def distributed_setup() -> tuple[int, int, torch.device]:
    """(rank, world size, device). Under torchrun (``RANK`` set) this joins the process group:
    nccl with one GPU per process when CUDA is present, gloo on CPUs. Otherwise (0, 1, the
    default device) and nothing is initialised."""
    from lecture_pkg import get_device

    if "RANK" not in os.environ:
        return 0, 1, get_device()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    return dist.get_rank(), dist.get_world_size(), device


def wrap_ddp(model: nn.Module, device: torch.device) -> nn.Module:
    """``model`` wrapped in DistributedDataParallel when a process group is running (its
    gradients are then averaged over ranks in backward), else ``model`` itself."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return model
    ids = [device.index] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=ids)


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def _is_main_process() -> bool:
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def _mean_over_ranks(value: Tensor) -> float:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        value = value.detach().clone()
        dist.all_reduce(value)
        value /= dist.get_world_size()
    return value.item()


# --------------------------------------------------------------------------------------------
# Progress
# --------------------------------------------------------------------------------------------

class _Progress:
    """An HTML progress bar updated in place in a notebook; plain lines in a terminal."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled, self.handle = total, enabled and _is_main_process(), None
        self.done, self.text = 0, "starting"
        if self.enabled and _in_notebook():
            from IPython.display import display

            self.handle = display(self, display_id=True)

    def update(self, done: int, text: str) -> None:
        if not self.enabled:
            return
        self.done, self.text = done, text
        if self.handle is not None:
            self.handle.update(self)
        else:
            print(repr(self), flush=True)

    def __repr__(self) -> str:
        return f"step {self.done}/{self.total} | {self.text}"

    def _repr_html_(self) -> str:
        return (f'<progress value="{self.done}" max="{self.total}" style="width: 40%"></progress>'
                f" <code>{repr(self)}</code>")


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


# --------------------------------------------------------------------------------------------
# The loop
# --------------------------------------------------------------------------------------------

def _batch_source(batches: Iterable[Batch] | Callable[[int], Batch]) -> Callable[[int], Batch]:
    if callable(batches):
        return batches
    iterator: Iterator[Batch] = iter(batches)
    return lambda step: next(iterator)


def train(model: nn.Module, batches: Iterable[Batch] | Callable[[int], Batch],
          loss_fn: Callable[[nn.Module, Batch], Tensor], *, steps: int,
          optimizer: torch.optim.Optimizer,
          scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
          clip_grad_norm: float | None = 1.0, autocast_dtype: torch.dtype | None = None,
          eval_fn: Callable[[nn.Module], dict[str, float]] | None = None,
          eval_every: int | None = None, log_every: int = 10,
          checkpoint: str | Path | None = None, checkpoint_every: int | None = None,
          resume: bool = False, progress: bool = True) -> History:
    """Train ``model`` for ``steps`` optimizer steps and return the :class:`History`.

    Args:
        batches: a function step -> batch (preferred: resuming then replays the same data), or
            an iterable of batches.
        loss_fn: (model, batch) -> scalar loss; it moves the batch to the model's device.
        scheduler: stepped once per optimizer step (e.g. LambdaLR with :func:`warmup_cosine`).
        clip_grad_norm: clip the global gradient norm to this value (None: no clipping).
        autocast_dtype: run forward passes under ``torch.autocast`` in this dtype (bf16 on CPUs
            and recent GPUs; fp16 adds a gradient scaler).
        eval_fn: model -> {metric: value}, called in eval mode under no_grad every
            ``eval_every`` steps and after the last one.
        checkpoint: a ``.safetensors`` path written every ``checkpoint_every`` steps and at the
            end (rank 0 only). ``resume=True`` continues from it if it exists.
    """
    check_int("steps", steps, minimum=1)
    check_int("log_every", log_every, minimum=1)
    if eval_every is not None:
        check_int("eval_every", eval_every, minimum=1)
    if resume and checkpoint is None:
        raise ValueError("resume=True needs a checkpoint path")
    device = next(model.parameters()).device
    get_batch = _batch_source(batches)
    history, start = History(), 0
    if resume and Path(checkpoint).exists():  # type: ignore[arg-type]
        start, history = load_checkpoint(checkpoint, model, optimizer, scheduler)  # type: ignore[arg-type]
    scaler = torch.amp.GradScaler(device.type, enabled=autocast_dtype == torch.float16)
    bar = _Progress(steps, progress)
    began = time.perf_counter() - history.seconds

    def evaluate(step: int) -> None:
        model.eval()
        with torch.no_grad(), torch.autocast(device.type, dtype=autocast_dtype,
                                             enabled=autocast_dtype is not None):
            metrics = eval_fn(model)  # type: ignore[misc]
        model.train()
        history.eval_steps.append(step)
        history.evals.append({k: float(v) for k, v in metrics.items()})

    model.train()
    for step in range(start, steps):
        batch = get_batch(step)
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            loss = loss_fn(model, batch)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss is {loss.item()} at step {step}")
        scaler.scale(loss).backward()
        if clip_grad_norm is not None:
            scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        lr = optimizer.param_groups[0]["lr"]
        if scheduler is not None:
            scheduler.step()
        done = step + 1
        if done % log_every == 0 or done == steps:
            history.steps.append(done)
            history.losses.append(_mean_over_ranks(loss))
            history.lrs.append(lr)
            bar.update(done, f"loss {history.losses[-1]:.4f} | lr {lr:.2e} | "
                             f"{time.perf_counter() - began:.1f} s")
        if eval_fn is not None and (done == steps or (eval_every and done % eval_every == 0)):
            evaluate(done)
        history.seconds = time.perf_counter() - began
        if checkpoint is not None and _is_main_process() and (
                done == steps or (checkpoint_every and done % checkpoint_every == 0)):
            save_checkpoint(checkpoint, model, optimizer, scheduler, done, history)
    return history
