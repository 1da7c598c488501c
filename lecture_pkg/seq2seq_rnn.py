"""A recurrent encoder-decoder with attention (Bahdanau et al. 2015): the model the Transformer
replaced, kept as the baseline it is compared with.

1. the encoder: a bidirectional GRU over the source embeddings; its outputs, the forward and
   backward states side by side, are the *memory* (batch, t_src, 2 * hidden);
2. the decoder: a GRU cell that, at every target position, scores its previous state against
   the memory with the additive score of :class:`lecture_pkg.attention.AdditiveScore`, reads a
   context vector from it with :func:`lecture_pkg.attention.attention`, and takes the previous
   token's embedding and that context as its input; the logits read the new state, the context
   and the embedding;
3. :meth:`GRUSeq2Seq.generate`: greedy decoding through :func:`lecture_pkg.generation.greedy_search`.

Shapes: src (batch, t_src), tgt (batch, t_tgt) LongTensors, padded at the end with
``pad_token_id``; one vocabulary and one embedding matrix for both sides.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lecture_pkg.attention import AdditiveScore, attention
from lecture_pkg.checks import check_int
from lecture_pkg.generation import greedy_search

__all__ = ["GRUSeq2Seq"]


def _check_ids(name: str, ids: object) -> Tensor:
    if not isinstance(ids, Tensor) or ids.dtype != torch.long or ids.dim() != 2:
        got = (f"{ids.dtype} {tuple(ids.shape)}" if isinstance(ids, Tensor)
               else type(ids).__name__)
        raise ValueError(f"{name} must be a LongTensor of shape (batch, t), got {got}")
    if ids.shape[1] == 0:
        raise ValueError(f"{name} must hold at least one position, got shape {tuple(ids.shape)}")
    return ids


class GRUSeq2Seq(nn.Module):
    """GRU encoder-decoder with additive attention.

    Args:
        vocab_size: the shared source/target vocabulary.
        d_embed: embedding width.
        hidden: GRU state width of each encoder direction and of the decoder.
        dropout: on the embeddings and before the output layer.
        pad_token_id: padding id; the encoder skips it, attention never reads it.

    forward(src, tgt, output_attentions=False) -> logits (batch, t_tgt, vocab_size), with
        output_attentions also the attention weights (batch, t_tgt, t_src). tgt is the decoder
        input (BOS y1 ... y_{n-1}), read one position at a time (teacher forcing).
    """

    def __init__(self, vocab_size: int, d_embed: int = 64, hidden: int = 64,
                 dropout: float = 0.1, pad_token_id: int = 0) -> None:
        super().__init__()
        check_int("vocab_size", vocab_size, minimum=1)
        check_int("d_embed", d_embed, minimum=1)
        check_int("hidden", hidden, minimum=1)
        check_int("pad_token_id", pad_token_id)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if pad_token_id >= vocab_size:
            raise ValueError(f"pad_token_id {pad_token_id} must be < vocab_size {vocab_size}")
        self.pad_token_id = pad_token_id
        self.embed = nn.Embedding(vocab_size, d_embed, padding_idx=pad_token_id)
        self.encoder = nn.GRU(d_embed, hidden, batch_first=True, bidirectional=True)
        self.bridge = nn.Linear(2 * hidden, hidden)  # encoder summary -> first decoder state
        self.score = AdditiveScore(hidden, 2 * hidden, hidden)
        self.cell = nn.GRUCell(d_embed + 2 * hidden, hidden)
        self.output = nn.Linear(hidden + 2 * hidden + d_embed, vocab_size)
        self.dropout = nn.Dropout(dropout)

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(memory (batch, t_src, 2 hidden), mask (batch, t_src) bool, state (batch, hidden)).

        Each source is read up to its padding only (packed sequences), so the backward
        direction starts at the last real token."""
        _check_ids("src", src)
        mask = src != self.pad_token_id
        lengths = mask.sum(1)
        if (lengths == 0).any():
            raise ValueError("src has a row of padding only; every source needs a token")
        x = self.dropout(self.embed(src))
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True,
                                                   enforce_sorted=False)
        out, last = self.encoder(packed)
        memory, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True,
                                                     total_length=src.shape[1])
        # last: (2, batch, hidden), the forward state after the last token and the backward
        # state after the first
        state = torch.tanh(self.bridge(torch.cat([last[0], last[1]], dim=-1)))
        return memory, mask, state

    def decode(self, tgt: Tensor, memory: Tensor, mask: Tensor, state: Tensor,
               output_attentions: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Logits (batch, t_tgt, vocab) for decoder input ``tgt`` (batch, t_tgt), starting
        from ``state`` (batch, hidden) given by :meth:`encode`."""
        _check_ids("tgt", tgt)
        if tgt.shape[0] != memory.shape[0]:
            raise ValueError(f"tgt has batch {tgt.shape[0]} but memory has {memory.shape[0]}")
        embedded = self.dropout(self.embed(tgt))
        logits, weights = [], []
        for t in range(tgt.shape[1]):
            # score the previous state against every source position: (batch, 1, t_src)
            context, w = attention(state[:, None], memory, memory, score=self.score,
                                   mask=mask[:, None])
            context = context[:, 0]
            state = self.cell(torch.cat([embedded[:, t], context], dim=-1), state)
            features = torch.cat([state, context, embedded[:, t]], dim=-1)
            logits.append(self.output(self.dropout(features)))
            weights.append(w[:, 0])
        logits_t = torch.stack(logits, dim=1)
        return (logits_t, torch.stack(weights, dim=1)) if output_attentions else logits_t

    def forward(self, src: Tensor, tgt: Tensor,
                output_attentions: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        memory, mask, state = self.encode(src)
        return self.decode(tgt, memory, mask, state, output_attentions)

    @torch.no_grad()
    def generate(self, src: Tensor, *, bos_token_id: int, eos_token_id: int,
                 max_new_tokens: int | None = None) -> Tensor:
        """Greedy translation: (batch, 1 + t_out) ids starting with BOS, padded after EOS.

        By default at most source length + 50 new tokens, the Transformer chapter's limit.
        Each step re-reads the prefix (no cache): the targets here are a few tokens long."""
        check_int("bos_token_id", bos_token_id)
        check_int("eos_token_id", eos_token_id)
        memory, mask, state = self.encode(src)
        start = torch.full((src.shape[0], 1), bos_token_id, dtype=torch.long,
                           device=src.device)

        def step(ids: Tensor, cache: object) -> Tensor:
            return self.decode(ids, memory, mask, state)  # type: ignore[return-value]

        return greedy_search(step, start, max_new_tokens=max_new_tokens or src.shape[1] + 50,
                             eos_token_id=eos_token_id, pad_token_id=self.pad_token_id,
                             use_cache=False)
