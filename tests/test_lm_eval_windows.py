"""lecture_pkg.lm_eval.window_losses: every position's loss of fixed windows, checked against a
float64 loop over windows and positions, and against nats_per_char's mean."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lecture_pkg.lm_eval import eval_starts, nats_per_char, window_losses
from lecture_pkg.models.gpt import GPT, GPTConfig


def _model() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=20, n_positions=12, n_embd=32, n_layer=2, n_head=4,
                         dropout=0.0, embd_dropout=0.0)).eval()


def test_window_losses_match_a_loop_and_nats_per_char() -> None:
    model = _model()
    ids = torch.randint(0, 20, (200,), generator=torch.Generator().manual_seed(1))
    starts = eval_starts(len(ids), 7, 12)
    got = window_losses(model, ids, starts, 12, batch_size=3)
    assert got.shape == (7, 11) and got.dtype == np.float64
    with torch.no_grad():
        for w, s in enumerate(starts):
            window = ids[s:s + 12]
            logp = model(window[None]).logits[0].double().log_softmax(-1)
            for t in range(1, 12):  # position t predicted from positions < t
                assert got[w, t - 1] == pytest.approx(-logp[t - 1, window[t]].item(), abs=1e-5)
    assert got.mean() == pytest.approx(nats_per_char(model, ids, starts, 12), abs=1e-6)


def test_window_losses_refuse_bad_ids() -> None:
    with pytest.raises(ValueError, match="ids must be a 1-D"):
        window_losses(_model(), torch.zeros(2, 30, dtype=torch.long), [0], 12)
    with pytest.raises(ValueError, match="length"):
        window_losses(_model(), torch.zeros(30, dtype=torch.long), [0], 1)
