"""lecture_pkg.interpretability against TransformerLens (Nanda et al.), on the same weights.

TransformerLens is not installed here: ``scripts/transformer_lens_fixture.py``, run in a
throwaway environment, stored a tiny random GPT-2 (``tests/data/transformer_lens_gpt2.safetensors``)
and what TransformerLens 4 computes for it (``tests/data/transformer_lens_gpt2.json``): its
``detect_head`` induction score and its per-head direct logit attribution
(``stack_head_results`` then ``logit_attrs``). The package's functions, on the same weights
loaded through Hugging Face's GPT-2, must give the same numbers.
"""

import json
from pathlib import Path

import pytest
import torch

from lecture_pkg.interpretability import (
    direct_logit_attribution,
    induction_scores,
    prefix_matches,
    run_with_cache,
)
from lecture_pkg.models.gpt import GPT

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

DATA = Path(__file__).parent / "data"
RECORD = json.loads((DATA / "transformer_lens_gpt2.json").read_text())


@pytest.fixture(scope="module")
def model_and_tokens() -> tuple[GPT, torch.Tensor, torch.Tensor]:
    config = transformers.GPT2Config(**RECORD["config"], resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0)
    hf = transformers.GPT2LMHeadModel(config).eval()
    state = safetensors_torch.load_file(str(DATA / "transformer_lens_gpt2.safetensors"))
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and missing == ["lm_head.weight"]  # tied to the embedding
    hf.tie_weights()
    model = GPT.from_hf(hf).eval()
    tokens = torch.tensor(RECORD["tokens"])
    torch.testing.assert_close(model(tokens).logits, hf(tokens).logits.detach(),
                               atol=1e-4, rtol=1e-4)
    return model, tokens, torch.tensor(RECORD["targets"])


def test_fixture_was_made_on_a_faithful_bridge():
    assert RECORD["bridge_vs_hf_max_gap"] < 1e-4
    assert RECORD["labels"] == [f"L{layer}H{head}" for layer in range(2) for head in range(4)]


def test_induction_score_matches_transformer_lens(model_and_tokens):
    """TransformerLens's "mul" score is the attention on the prefix matches summed over every
    query and divided by the number of queries; the package averages over the queries that
    have a match. The same patterns and the same matches give one from the other."""
    model, tokens, _ = model_and_tokens
    _, cache = run_with_cache(model, tokens)
    patterns = torch.stack([cache[f"pattern{i}"] for i in range(2)])  # (2, batch, heads, t, t)
    matches = prefix_matches(tokens).to(patterns.dtype)  # (batch, t, t)
    t = tokens.shape[1]
    tl_style = ((patterns * matches[None, :, None]).sum((-1, -2)) / t).mean(1)
    expected = torch.tensor(RECORD["induction"])
    torch.testing.assert_close(tl_style, expected, atol=1e-5, rtol=1e-4)
    # the package's score: the same sum over the queries with a match only
    with_match = matches.any(-1)  # (batch, t)
    package = induction_scores(list(patterns), tokens)
    rescaled = (patterns * matches[None, :, None]).sum(-1)  # (2, batch, heads, t)
    rescaled = (rescaled * with_match[None, :, None]).sum((1, 3)) / with_match.sum()
    torch.testing.assert_close(package, rescaled)
    # every row here repeats its first half, so the queries with a match are the same count
    # in each row, and the two scores differ by one factor
    share = float(with_match.float().mean())
    torch.testing.assert_close(package * share, expected, atol=1e-5, rtol=1e-4)


def test_direct_logit_attribution_matches_transformer_lens(model_and_tokens):
    """Per head, logit(target) - logit(token 0) at every position: TransformerLens freezes the
    final LayerNorm's scale at its value in the run, as the package does."""
    model, tokens, targets = model_and_tokens
    names, to_target = direct_logit_attribution(model, tokens, targets)
    _, to_zero = direct_logit_attribution(model, tokens, torch.zeros_like(targets))
    heads = [names.index(label) for label in RECORD["labels"]]
    ours = (to_target - to_zero)[heads]  # (8, batch, t)
    expected = torch.tensor(RECORD["dla"])
    assert ours.shape == expected.shape
    assert float(expected.abs().max()) > 0.1  # the heads write something to compare
    torch.testing.assert_close(ours, expected, atol=2e-5, rtol=1e-4)
