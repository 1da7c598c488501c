"""Chapter 10's RL arms on one task at matched compute: GRPO against DPO on the eight-letter
upper-casing task of page 10.2, and GRPO's alignment tax with and without its mitigations.

Every arm starts from chapter 10's SFT model, and every seed's arms share that seed's prompt
draws. The arms:

* ``grpo``: GRPO as page 10.2 runs it (30 steps of 4 prompts x a group of 8, two inner steps,
  rate 3e-4, beta 0.04);
* ``grpo_beta0`` and ``grpo_beta04``: the same with beta 0 (no KL) and beta 0.4 (ten times
  stronger);
* ``grpo_ptx``: beta 0.04 plus PPO-ptx: each update also takes the SFT loss on 16 of the
  instructions the SFT model was trained on (``ptx_coef`` 1);
* ``dpo``: DPO at the same compute. Its preference pairs come from the SFT model's own answers
  to the same prompts GRPO draws with the seed (120 prompts x 8 sampled answers: as many
  samples as GRPO draws), judged by the same rule (:func:`lecture_pkg.rlhf.verifier_pairs`:
  within a group each wrong answer against a right one); then 120 DPO steps of 8 pairs
  (16 sequences), so that DPO runs as many sequence forward-backward passes as GRPO
  (30 steps x 2 inner steps x 32 answers = 1920), beta 1, rate 5e-5 (page 10.3's setting).

Each policy is scored greedily on the held-out eight-letter words and on the held-out
instructions of page 10.1 (per task), with the mean reward of one sampled answer per
held-out word, and the exact KL to the SFT model on the SFT model's greedy answers to the
held-out words. Results go to one JSON file that page 10.2 reads; ``tests/test_rl_arms.py``
reruns one row.

    OMP_NUM_THREADS=1 python scripts/rl_arms.py --out lecture_pkg/recorded/rl_arms_cpu.json

(``make rl-arms``; about twenty minutes on one CPU thread.)
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from lecture_pkg import seeds
from lecture_pkg.alignment import encode_chat, generate_answers
from lecture_pkg.lm_eval import pad_right
from lecture_pkg.rlhf import dpo_train, exact_reward, grpo_train, masked_answer_kl, verifier_pairs
from lecture_pkg.shakespeare_gpt import load_shakespeare_sft
from lecture_pkg.shakespeare_tasks import (
    Instruction,
    eight_letter_upper,
    exact_match,
    shakespeare_instructions,
)
from lecture_pkg.shipped import provenance

ARMS = ("grpo", "grpo_beta0", "grpo_beta04", "grpo_ptx", "dpo")
STEPS, PROMPTS, GROUP, INNER = 30, 4, 8, 2
DPO_BATCH = 8
OTHER_ITEMS, OTHER_SEED = 300, 1  # page 10.1's held-out instructions
SFT_ITEMS = 20000  # the instructions the SFT model was trained on (scripts/train_sft.py)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="the JSON file the results go to")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--ptx-coef", type=float, default=1.0)
    parser.add_argument("--dpo-beta", type=float, default=1.0)
    parser.add_argument("--dpo-lr", type=float, default=5e-5)
    parser.add_argument("--resume", action="store_true",
                        help="keep the (arm, seed) rows already in --out and run the rest")
    return parser.parse_args(argv)


def dpo_steps() -> int:
    """DPO steps with GRPO's sequence forward-backward passes: 30 x 2 x 32 / 16 = 120."""
    return STEPS * INNER * PROMPTS * GROUP // (2 * DPO_BATCH)


def grpo_prompts(train: list[Instruction], seed: int) -> list[Instruction]:
    """The STEPS x PROMPTS prompts grpo_train draws with ``seed``, in order."""
    picks = torch.Generator().manual_seed(seed)
    return [train[int(i)] for _ in range(STEPS)
            for i in torch.randint(len(train), (PROMPTS,), generator=picks)]


def evaluate(policy, sft, tokenizer, test: list[Instruction], other: list[Instruction],
             sample_seed: int) -> dict[str, float]:
    """Held-out eight-letter words (greedy accuracy, sampled reward, exact KL to the SFT
    model on its greedy answers) and page 10.1's instructions (greedy accuracy per task)."""
    prompts = [it.prompt for it in test]
    greedy = generate_answers(policy, tokenizer, prompts).texts
    sampler = torch.Generator().manual_seed(sample_seed)
    sampled = generate_answers(policy, tokenizer, prompts, do_sample=True,
                               generator=sampler).texts
    rows = [encode_chat(tokenizer, it.prompt, it.answer) for it in test]
    ids, _, mask = pad_right(rows, tokenizer.pad_id)
    with torch.no_grad():
        kl = masked_answer_kl(policy(ids).logits, sft(ids).logits, mask).item()
    per_task = exact_match(generate_answers(policy, tokenizer,
                                            [it.prompt for it in other]).texts, other)
    return {"accuracy": exact_reward(greedy, test).mean().item(),
            "sampled": exact_reward(sampled, test).mean().item(), "kl": kl,
            "other": sum(per_task.values()) / len(per_task),
            **{f"other_{task}": v for task, v in sorted(per_task.items())}}


def run(arm: str, seed: int, args: argparse.Namespace, sft, tokenizer, data: dict,
        sample_seed: int) -> dict:
    began = time.perf_counter()
    extra: dict = {}
    if arm == "dpo":
        items, chosen, rejected = verifier_pairs(
            sft, tokenizer, grpo_prompts(data["train"], seed), exact_reward, GROUP, seed)
        rows = [encode_chat(tokenizer, it.prompt, c) for it, c in zip(items, chosen)]
        rows += [encode_chat(tokenizer, it.prompt, r) for it, r in zip(items, rejected)]
        ids, _, mask = pad_right(rows, tokenizer.pad_id)
        result = dpo_train(sft, sft, ids, mask, dpo_steps(), args.dpo_beta, seed,
                           batch=DPO_BATCH, lr=args.dpo_lr)
        extra = {"pairs": len(items)}
    else:
        beta = {"grpo_beta0": 0.0, "grpo_beta04": 0.4}.get(arm, 0.04)
        ptx = args.ptx_coef if arm == "grpo_ptx" else 0.0
        result = grpo_train(sft, sft, tokenizer, data["train"], exact_reward, STEPS, beta,
                            seed, prompts=PROMPTS, group=GROUP, inner_steps=INNER,
                            ptx_coef=ptx, ptx_items=data["sft_items"])
        extra = {"beta": beta, "ptx_coef": ptx}
    seconds = time.perf_counter() - began
    return {"arm": arm, "seed": seed, "seconds": round(seconds, 1), **extra,
            "curve": result.curve,
            **evaluate(result.policy, sft, tokenizer, data["test"], data["other"],
                       sample_seed)}


def load_data() -> dict:
    return {"train": eight_letter_upper("train"), "test": eight_letter_upper("test"),
            "other": shakespeare_instructions("test", OTHER_ITEMS, seed=OTHER_SEED),
            "sft_items": shakespeare_instructions("train", SFT_ITEMS, seed=0)}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    sft, tokenizer = load_shakespeare_sft()
    data = load_data()
    sample_seed = seeds(1, start=100)[0]
    out = {"args": vars(args), **provenance(__file__, argv), "torch": torch.__version__,
           "machine": platform.processor() or platform.machine(),
           "sample_seed": sample_seed, "dpo_steps": dpo_steps(),
           "sft": evaluate(sft, sft, tokenizer, data["test"], data["other"], sample_seed),
           "runs": []}
    done: set[tuple[str, int]] = set()
    if args.resume and Path(args.out).exists():
        before = json.loads(Path(args.out).read_text(encoding="utf-8"))
        out["runs"] = before["runs"]
        out["earlier"] = [*before.get("earlier", []), {k: before[k] for k in
                                                       ("command", "commit", "total_seconds")}]
        done = {(r["arm"], r["seed"]) for r in out["runs"]}
    began = time.perf_counter()
    for seed in seeds(args.seeds):
        for arm in args.arms:
            if (arm, seed) in done:
                continue
            out["runs"].append(run(arm, seed, args, sft, tokenizer, data, sample_seed))
            row = out["runs"][-1]
            print(f"{arm} seed {seed}: accuracy {row['accuracy']:.3f}, other "
                  f"{row['other']:.3f}, kl {row['kl']:.3f}, {row['seconds']} s", flush=True)
            out["total_seconds"] = round(time.perf_counter() - began, 1)
            Path(args.out).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
