"""GRUSeq2Seq: shapes, attention weights, padding, greedy decoding, bad input, and learning."""

from __future__ import annotations

import pytest
import torch

from lecture_pkg.seq2seq_rnn import GRUSeq2Seq

PAD, BOS, EOS = 0, 1, 2


def model(seed: int = 0, **kwargs: object) -> GRUSeq2Seq:
    torch.manual_seed(seed)
    return GRUSeq2Seq(12, **({"d_embed": 8, "hidden": 6, "dropout": 0.0} | kwargs)).eval()


def test_shapes_and_attention_weights() -> None:
    m = model()
    src = torch.tensor([[3, 4, 5, 2], [6, 7, 2, PAD]])
    tgt = torch.tensor([[BOS, 3, 4], [BOS, 5, PAD]])
    logits, weights = m(src, tgt, output_attentions=True)
    assert logits.shape == (2, 3, 12) and weights.shape == (2, 3, 4)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3))
    assert (weights[1, :, 3] == 0).all()  # padding is never read
    assert (weights[0] > 0).all()


def test_padding_changes_nothing() -> None:
    """A source padded to a longer length gives the logits of the unpadded source."""
    m = model()
    src = torch.tensor([[3, 4, 2]])
    tgt = torch.tensor([[BOS, 5, 6]])
    padded = torch.tensor([[3, 4, 2, PAD, PAD]])
    torch.testing.assert_close(m(padded, tgt), m(src, tgt))


def test_one_step_against_a_hand_written_reference() -> None:
    """The first logits from the formulas: additive scores, masked softmax, GRU cell, output."""
    m = model().double()
    src = torch.tensor([[3, 4, 5, 2], [6, 2, PAD, PAD]])
    tgt = torch.tensor([[BOS], [BOS]])
    memory, mask, state = m.encode(src)
    s = m.score
    scores = s.v(torch.tanh(s.query_proj(state)[:, None] + s.key_proj(memory))).squeeze(-1)
    scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(-1)
    context = (weights[:, :, None] * memory).sum(1)
    emb = m.embed(tgt[:, 0])
    new_state = m.cell(torch.cat([emb, context], -1), state)
    expected = m.output(torch.cat([new_state, context, emb], -1))
    torch.testing.assert_close(m(src, tgt)[:, 0], expected)


def test_encoder_state_reads_real_tokens_only() -> None:
    """The backward direction starts at the last real token: a direct GRU run agrees."""
    m = model().double()
    src = torch.tensor([[3, 4, 2, PAD, PAD]])
    memory, _, _ = m.encode(src)
    direct, _ = m.encoder(m.embed(src[:, :3]))
    torch.testing.assert_close(memory[:, :3], direct)
    assert (memory[:, 3:] == 0).all()


def test_generate_is_greedy_over_forward() -> None:
    """Each generated token is the argmax of forward() on the prefix so far."""
    m = model(seed=3)
    src = torch.tensor([[3, 4, 5, 2], [6, 7, 2, PAD]])
    out = m.generate(src, bos_token_id=BOS, eos_token_id=EOS, max_new_tokens=5)
    assert out.shape[0] == 2 and (out[:, 0] == BOS).all() and out.shape[1] <= 6
    for row in range(2):
        prefix = out[row : row + 1, :1]
        for t in range(1, out.shape[1]):
            if prefix[0, -1] == EOS:
                assert (out[row, t:] == PAD).all()
                break
            nxt = m(src[row : row + 1], prefix)[0, -1].argmax()
            assert nxt == out[row, t]
            prefix = torch.cat([prefix, nxt.view(1, 1)], dim=1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"vocab_size": 0}, "vocab_size"), ({"hidden": 0}, "hidden"),
     ({"dropout": 1.0}, "dropout"), ({"pad_token_id": 20}, "pad_token_id")],
)
def test_bad_arguments(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        GRUSeq2Seq(**({"vocab_size": 12} | kwargs))


def test_bad_input() -> None:
    m = model()
    with pytest.raises(ValueError, match="src"):
        m(torch.zeros(2, 3), torch.ones(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="padding only"):
        m(torch.tensor([[3, 2], [PAD, PAD]]), torch.ones(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="batch"):
        memory, mask, state = m.encode(torch.tensor([[3, 2]]))
        m.decode(torch.ones(2, 2, dtype=torch.long), memory, mask, state)


def test_it_learns_to_reverse() -> None:
    """Reversal needs attention to the opposite end; a few hundred steps learn it."""
    torch.manual_seed(0)
    m = GRUSeq2Seq(10, d_embed=16, hidden=32, dropout=0.0)
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)

    def batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randint(3, 10, (n, 4), generator=g)
        src = torch.cat([x, torch.full((n, 1), EOS)], 1)
        tgt = torch.cat([torch.full((n, 1), BOS), x.flip(1), torch.full((n, 1), EOS)], 1)
        return src, tgt

    for _ in range(300):
        src, tgt = batch(64)
        loss = torch.nn.functional.cross_entropy(m(src, tgt[:, :-1]).flatten(0, 1),
                                                 tgt[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    src, tgt = batch(200)
    out = m.eval().generate(src, bos_token_id=BOS, eos_token_id=EOS, max_new_tokens=5)
    exact = (out == tgt).all(1).float().mean().item()
    assert exact > 0.9, exact
