"""lecture_pkg.training: the loop learns, resumes exactly, and its schedule and optimiser are
what they say."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from lecture_pkg.training import History, adamw, load_checkpoint, train, warmup_cosine


def regression_task(seed: int = 0) -> tuple[nn.Module, callable]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 1))
    w = torch.randn(4, 1, generator=torch.Generator().manual_seed(99))

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(32, 4, generator=torch.Generator().manual_seed(step))
        return x, x @ w

    return model, batch


def mse(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return nn.functional.mse_loss(model(x), y)


def test_warmup_cosine_shape() -> None:
    f = warmup_cosine(10, 110, min_ratio=0.1)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(60) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert f(110) == pytest.approx(0.1) and f(500) == pytest.approx(0.1)
    values = [f(s) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(values, values[1:]))  # monotone decay after warmup
    with pytest.raises(ValueError, match="warmup_steps 20 exceeds total_steps 10"):
        warmup_cosine(20, 10)


def test_adamw_decays_matrices_only() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3))
    opt = adamw(model, lr=1e-3, weight_decay=0.5)
    decayed, plain = opt.param_groups
    assert decayed["weight_decay"] == 0.5 and [p.dim() for p in decayed["params"]] == [2]
    assert plain["weight_decay"] == 0.0 and len(plain["params"]) == 3


def test_train_reduces_the_loss_and_evaluates(capsys: pytest.CaptureFixture[str]) -> None:
    model, batch = regression_task()
    opt = adamw(model, lr=1e-2, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(20, 100))
    evals = []

    def eval_fn(m: nn.Module) -> dict[str, float]:
        evals.append(m.training)
        return {"held-out mse": mse(m, batch(10_000)).item()}

    history = train(model, batch, mse, steps=100, optimizer=opt, scheduler=sched,
                    eval_fn=eval_fn, eval_every=50, log_every=10)
    assert history.steps == list(range(10, 101, 10))
    assert history.losses[-1] < 0.2 * history.losses[0]
    assert history.eval_steps == [50, 100] and evals == [False, False]  # eval mode
    assert history.evals[-1]["held-out mse"] < history.evals[0]["held-out mse"]
    assert history.lrs[0] < history.lrs[1]  # still warming up at step 10
    out = capsys.readouterr().out
    assert "step 100/100 | loss" in out  # outside a notebook: plain progress lines
    assert {r["series"] for r in history.records()} == {"train loss", "held-out mse"}


def test_resume_from_checkpoint_gives_the_same_curve(tmp_path: Path) -> None:
    def run(steps: int, resume: bool, path: Path) -> tuple[History, nn.Module]:
        model, batch = regression_task()
        opt = adamw(model, lr=1e-2)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(5, 40))
        torch.manual_seed(123)  # dropout's random stream
        history = train(model, batch, mse, steps=steps, optimizer=opt, scheduler=sched,
                        log_every=5, checkpoint=path, resume=resume, progress=False)
        return history, model

    straight, model_a = run(40, False, tmp_path / "a.safetensors")
    run(20, False, tmp_path / "b.safetensors")
    resumed, model_b = run(40, True, tmp_path / "b.safetensors")  # continues at step 20
    assert resumed.steps == straight.steps
    assert resumed.losses == pytest.approx(straight.losses, rel=0, abs=0)
    for p, q in zip(model_a.parameters(), model_b.parameters()):
        assert torch.equal(p, q)
    model, _ = regression_task()
    opt = adamw(model, lr=1e-2)
    step, history = load_checkpoint(tmp_path / "b.safetensors", model, opt)
    assert step == 40 and history.losses == straight.losses


def test_train_under_bf16_autocast_and_errors() -> None:
    model, batch = regression_task()
    opt = adamw(model, lr=1e-2)
    history = train(model, batch, mse, steps=20, optimizer=opt,
                    autocast_dtype=torch.bfloat16, progress=False)
    assert history.losses[-1] < history.losses[0]
    with pytest.raises(ValueError, match="steps must be positive"):
        train(model, batch, mse, steps=0, optimizer=opt)
    with pytest.raises(ValueError, match="resume=True needs a checkpoint"):
        train(model, batch, mse, steps=1, optimizer=opt, resume=True)
    with pytest.raises(FloatingPointError, match="loss is nan at step 0"):
        train(model, batch, lambda m, b: torch.tensor(float("nan"), requires_grad=True),
              steps=1, optimizer=opt, progress=False)


def test_iterable_batches() -> None:
    model, batch = regression_task()
    history = train(model, (batch(i) for i in range(30)), mse, steps=30,
                    optimizer=adamw(model, lr=1e-2), progress=False, log_every=30)
    assert history.steps == [30]


def test_progress_bar_html_is_one_finished_bar() -> None:
    from lecture_pkg.training import _Progress

    bar = _Progress(total=50, enabled=False)
    bar.done, bar.text = 50, "loss 0.1"
    assert bar._repr_html_().startswith('<progress value="50" max="50"')
    assert repr(bar) == "step 50/50 | loss 0.1"


def test_checkpoint_restores_optimizer_hyper_parameters_exactly(tmp_path: Path) -> None:
    """Every param-group entry comes back equal and of the same type: AdamW's betas as a
    tuple (JSON would make it a list), floats as floats, flags as bools."""
    model, batch = regression_task()
    opt = adamw(model, lr=3e-3, weight_decay=0.05, betas=(0.85, 0.97), eps=1e-7)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(2, 10))
    train(model, batch, mse, steps=3, optimizer=opt, scheduler=sched,
          checkpoint=tmp_path / "c.safetensors", progress=False)
    fresh, _ = regression_task(seed=1)
    opt2 = adamw(fresh, lr=1.0, betas=(0.5, 0.5))
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, warmup_cosine(2, 10))
    step, _ = load_checkpoint(tmp_path / "c.safetensors", fresh, opt2, sched2)
    assert step == 3
    for saved, loaded in zip(opt.param_groups, opt2.param_groups):
        assert saved.keys() == loaded.keys()
        for key in saved:
            if key == "params":
                continue
            assert type(loaded[key]) is type(saved[key]), key
            assert loaded[key] == saved[key], key
    assert opt2.param_groups[0]["betas"] == (0.85, 0.97)
    assert sched2.state_dict() == sched.state_dict()
    for p, q in zip(model.parameters(), fresh.parameters()):
        assert torch.equal(p, q)
        assert torch.equal(opt.state[p]["exp_avg_sq"], opt2.state[q]["exp_avg_sq"])
