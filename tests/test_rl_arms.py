"""lecture_pkg/recorded/rl_arms_cpu.json (scripts/rl_arms.py, command and commit in
benchmarks/RESULTS.md), read by page 10.2: the SFT model's figures recomputed, and the first
seed's DPO arm retrained from its own sampled pairs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lecture_pkg.shakespeare_gpt import load_shakespeare_sft

RECORDED = Path(__file__).resolve().parents[1] / "lecture_pkg" / "recorded" / "rl_arms_cpu.json"


def test_recorded_rl_arms_reproduce_the_sft_figures_and_a_dpo_row(load_script) -> None:
    """Another CPU may sample a few different answers along the way, so the pair count is
    compared within 5 % and the held-out figures within 0.03 (7 of 219 words), far inside the
    spread between seeds and arms."""
    script = load_script("rl_arms")
    recorded = json.loads(RECORDED.read_text(encoding="utf-8"))
    args = script.parse_args(["--out", "unused"])
    vars(args).update(recorded["args"])
    sft, tokenizer = load_shakespeare_sft()
    data = script.load_data()
    sample_seed = recorded["sample_seed"]  # seeds() is shifted under LECTURE_SEED_OFFSET
    again_sft = script.evaluate(sft, sft, tokenizer, data["test"], data["other"], sample_seed)
    assert again_sft == pytest.approx(recorded["sft"], abs=1e-6)
    assert recorded["dpo_steps"] == script.dpo_steps() == 120  # GRPO's 1920 passes / 16
    row = next(r for r in recorded["runs"] if r["arm"] == "dpo")
    again = script.run("dpo", row["seed"], args, sft, tokenizer, data, sample_seed)
    assert abs(again["pairs"] - row["pairs"]) <= 0.05 * row["pairs"]
    for key in ("accuracy", "other"):
        assert abs(again[key] - row[key]) <= 0.03, key
    assert {r["arm"] for r in recorded["runs"]} == set(script.ARMS)
