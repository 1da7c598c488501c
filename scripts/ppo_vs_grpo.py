"""PPO with a value model against GRPO's group baseline, from chapter 10's SFT model, on the
eight-letter upper-casing task of page 10.2, at the same number of sampled answers per step
(GRPO: 4 prompts x a group of 8; PPO: 32 prompts x 1 answer), the same steps, rate, clip and
inner steps, every method on the same seeds. Each seed's policy is scored on the held-out words
(greedy accuracy and the mean reward of one sampled answer per word). Results go to one JSON
file that page 10.2 reads; ``tests/test_rlhf.py`` reruns one PPO row.

    OMP_NUM_THREADS=1 python scripts/ppo_vs_grpo.py --out lecture_pkg/recorded/ppo_vs_grpo_cpu.json

(``make ppo-vs-grpo``; a few minutes on one CPU thread.)
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from lecture_pkg import seeds
from lecture_pkg.alignment import generate_answers
from lecture_pkg.rlhf import exact_reward as correct
from lecture_pkg.rlhf import grpo_train, ppo_train
from lecture_pkg.shakespeare_gpt import load_shakespeare_sft
from lecture_pkg.shakespeare_tasks import Instruction, eight_letter_upper
from lecture_pkg.shipped import provenance

METHODS = ("grpo", "ppo")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="the JSON file the results go to")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--beta", type=float, default=0.04)
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    return parser.parse_args(argv)


def held_out(policy: torch.nn.Module, tokenizer, test: list[Instruction],
             sample_seed: int) -> dict[str, float]:
    """Greedy accuracy and the mean reward of one sampled answer per held-out word."""
    prompts = [it.prompt for it in test]
    greedy = correct(generate_answers(policy, tokenizer, prompts).texts, test)
    sampler = torch.Generator().manual_seed(sample_seed)
    sampled = correct(generate_answers(policy, tokenizer, prompts, do_sample=True,
                                       generator=sampler).texts, test)
    return {"accuracy": greedy.mean().item(), "sampled": sampled.mean().item()}


def run(method: str, seed: int, args: argparse.Namespace, sft, tokenizer, train, test,
        sample_seed: int) -> dict:
    began = time.perf_counter()
    if method == "grpo":
        result = grpo_train(sft, sft, tokenizer, train, correct, args.steps, args.beta, seed,
                            prompts=4, group=8)
    else:
        result = ppo_train(sft, sft, tokenizer, train, correct, args.steps, args.beta, seed,
                           prompts=32)
    seconds = time.perf_counter() - began
    return {"method": method, "seed": seed, "seconds": round(seconds, 1),
            "curve": result.curve, **held_out(result.policy, tokenizer, test, sample_seed)}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    sft, tokenizer = load_shakespeare_sft()
    train, test = eight_letter_upper("train"), eight_letter_upper("test")
    sample_seed = seeds(1, start=100)[0]
    out = {"args": vars(args), **provenance(__file__, argv), "torch": torch.__version__,
           "machine": platform.processor() or platform.machine(),
           "sample_seed": sample_seed, "sft": held_out(sft, tokenizer, test, sample_seed),
           "runs": []}
    began = time.perf_counter()
    for seed in seeds(args.seeds):
        for method in args.methods:
            out["runs"].append(run(method, seed, args, sft, tokenizer, train, test,
                                   sample_seed))
            row = out["runs"][-1]
            print(f"{method} seed {seed}: accuracy {row['accuracy']:.3f}, sampled "
                  f"{row['sampled']:.3f}, {row['seconds']} s", flush=True)
            out["total_seconds"] = round(time.perf_counter() - began, 1)
            Path(args.out).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
