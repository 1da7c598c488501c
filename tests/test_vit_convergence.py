"""lecture_pkg.digits_vision (chapter 8's digits recipe) and scripts/vit_convergence.py's record."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lecture_pkg.digits_vision import (
    digits_split,
    error_rate,
    fit,
    load_vit_convergence,
    optimizer_for,
    random_shift,
    recorded_arm,
    small_cnn,
    small_deit,
    small_swin,
    steps_for_epochs,
)


@pytest.fixture(scope="module")
def data():
    return digits_split(260)


def test_split_sizes_and_rows(data):
    plain = digits_split()
    assert (len(plain.y_train), len(plain.y_test), len(plain.y_val)) == (1300, 497, 0)
    assert (len(data.y_train), len(data.y_test), len(data.y_val)) == (1040, 497, 260)
    torch.testing.assert_close(data.x_test, plain.x_test, rtol=0, atol=0)
    # the validation rows are training rows moved aside: same multiset of (image, label)
    def rows(x, y):
        return sorted(map(tuple, torch.cat([x.flatten(1), y[:, None].float()], 1).tolist()))
    assert rows(torch.cat([data.x_train, data.x_val]), torch.cat([data.y_train, data.y_val])) \
        == rows(plain.x_train, plain.y_train)
    # normalised by the 1,300 training images: mean 0, sd 1 there (float64 reference)
    pool = plain.x_train.double()
    assert abs(pool.mean().item()) < 1e-6 and abs(pool.std().item() - 1) < 1e-6
    # stratified: every class gives a fifth of its training images (+- 1) to validation
    share = torch.bincount(data.y_val) / torch.bincount(plain.y_train) * 1300
    assert ((share - 260).abs() / 260 < 0.05).all()
    with pytest.raises(ValueError, match="validation"):
        digits_split(1300)


def test_steps_for_epochs():
    assert steps_for_epochs(1040, 100) == 1625  # 100 * 1040 / 64
    assert steps_for_epochs(50, 100) == 100  # one batch of 50 per epoch
    assert steps_for_epochs(200, 3) == 10  # ceil(600 / 64)
    with pytest.raises(ValueError, match="epochs"):
        steps_for_epochs(50, 0)


def test_random_shift_matches_a_loop():
    x = torch.randn(6, 1, 8, 8)
    got = random_shift(x, torch.Generator().manual_seed(3), background=-7.0)
    offsets = torch.randint(3, (6, 2), generator=torch.Generator().manual_seed(3)).tolist()
    for k, (a, b) in enumerate(offsets):
        for i in range(8):
            for j in range(8):
                si, sj = i + a - 1, j + b - 1
                inside = 0 <= si < 8 and 0 <= sj < 8
                assert got[k, 0, i, j] == (x[k, 0, si, sj] if inside else -7.0)


def test_optimizer_spares_tokens_positions_and_bias_tables():
    _, skip = optimizer_for(small_deit(0))
    assert skip == {"cls_token", "distillation_token", "position"}
    model = small_swin(0)
    tables = [n for n, _ in model.named_parameters() if "bias_table" in n]
    assert tables  # Swin has relative-position bias tables ...
    optimizer, _ = optimizer_for(model)
    spared = {id(p) for p in optimizer.param_groups[1]["params"]}
    named = dict(model.named_parameters())
    assert all(id(named[n]) in spared for n in tables)  # ... trained without decay
    assert optimizer.param_groups[0]["weight_decay"] == 0.05


def test_error_rate_and_early_stopping(data):
    x, y = data.x_train[:128], data.y_train[:128]
    run = fit(small_cnn(0), x, y, seed=0, steps=60, val=(data.x_val, data.y_val),
              eval_every=10)
    assert [step for step, _, _ in run.val_curve] == [10, 20, 30, 40, 50, 60]
    best = min(run.val_curve, key=lambda t: (t[1], t[2]))
    assert run.best_step == best[0] and run.val_error == best[1]
    # the kept weights are the best evaluation's: their validation error and loss, recomputed
    logits = run.model.eval()(data.x_val)
    assert error_rate(run.model, data.x_val, data.y_val) == pytest.approx(best[1], abs=1e-7)
    assert F.cross_entropy(logits, data.y_val).item() == pytest.approx(best[2], rel=1e-5)
    with pytest.raises(ValueError, match="labels"):
        fit(small_cnn(0), x, y[:-1], seed=0, steps=1)


def test_recorded_arms_read_back():
    record = load_vit_convergence()
    info = record["info"]
    full = info["train_pool"]
    assert info["arms"] == ["CNN", "ViT", "hybrid", "ViT + shifts", "DeiT",
                            "ViT, no positions", "Swin", "Swin, no shift"]
    for arm in info["arms"]:
        for n in info["sizes"]:
            got = recorded_arm(record, arm, n)
            assert got.seeds == tuple(info["seeds"])
            rows = {r["seed"]: r for r in record["runs"] if r["arm"] == arm and r["n"] == n}
            assert got.values == tuple(rows[s]["test_error"] for s in info["seeds"])
    logreg = recorded_arm(record, "logistic regression", full)
    assert len(set(logreg.values)) == 1  # the same 1,040 images for every seed
    for r in record["runs"]:  # the rule: at least the floor, else the fixed epochs
        assert r["steps"] == max(steps_for_epochs(r["n"], info["epochs"]), info["min_steps"])
        assert 0 < r["best_step"] <= r["steps"]
    with pytest.raises(ValueError, match="no recorded runs"):
        recorded_arm(record, "ViT", 7)
    with pytest.raises(ValueError, match="key"):
        recorded_arm(record, "ViT", full, key="accuracy")


def test_script_reproduces_a_recorded_run(load_script, data):
    """The ViT on 50 images, first recorded seed (500 steps, about 10 s on one thread)."""
    script = load_script("vit_convergence")
    record = load_vit_convergence()
    seed = record["info"]["seeds"][0]
    (expected,) = [r for r in record["runs"]
                   if r["arm"] == "ViT" and r["n"] == 50 and r["seed"] == seed]
    torch.set_num_threads(1)
    got, _ = script.run_arm(data, "ViT", 50, seed)
    assert got["steps"] == expected["steps"]
    # equal on the recording machine; another CPU kernel path may move a few images
    for key in ("val_error", "test_error", "train_error"):
        assert got[key] == pytest.approx(expected[key], abs=0.02), key


def test_script_reproduces_the_new_arms(load_script, data):
    """DeiT (taught by the CNN, both retrained) and Swin without the shift, 50 images, the
    first recorded seed: 1,500 steps, about 25 s on one thread."""
    script = load_script("vit_convergence")
    record = load_vit_convergence()
    seed = record["info"]["seeds"][0]
    expected = {r["arm"]: r for r in record["runs"] if r["n"] == 50 and r["seed"] == seed}
    torch.set_num_threads(1)
    cnn, teacher = script.run_arm(data, "CNN", 50, seed)
    got = {"CNN": cnn, "DeiT": script.run_arm(data, "DeiT", 50, seed, teacher.eval())[0],
           "Swin, no shift": script.run_arm(data, "Swin, no shift", 50, seed)[0]}
    for arm, row in got.items():
        assert row["steps"] == expected[arm]["steps"] == 500
        for key in ("val_error", "test_error", "train_error"):
            assert row[key] == pytest.approx(expected[arm][key], abs=0.02), (arm, key)
    # the shift flag: same weights at the start, only the windows differ
    assert script.MAKERS["Swin, no shift"](seed).config.shift_windows is False
    assert script.MAKERS["Swin"](seed).config.shift_windows is True
    with pytest.raises(ValueError, match="teacher"):
        script.run_arm(data, "DeiT", 50, seed)
    with pytest.raises(ValueError, match="arm must be one of"):
        script.run_arm(data, "ResNet", 50, seed)
