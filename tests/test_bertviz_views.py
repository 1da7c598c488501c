"""lecture_pkg.bertviz: bertviz's head and model views, copied so that chapter 7 does not need the
bertviz distribution (its neuron view pulls in boto3/botocore). They write the same page output as
bertviz itself where bertviz is installed, and work without it."""

from __future__ import annotations

import re

import pytest
import torch

from lecture_pkg.bertviz import head_view, model_view


def _attention(layers: int = 2, heads: int = 3, n: int = 4, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.rand(1, heads, n, n, generator=gen).softmax(-1) for _ in range(layers)]


def _html(view: object) -> str:
    return re.sub(r"bertviz-[0-9a-f]{32}", "bertviz-ID", view.data)


def test_views_write_their_script_and_the_weights() -> None:
    attention, tokens = _attention(), ["[CLS]", "the", "cat", "[SEP]"]
    for view in (head_view(attention, tokens, html_action="return"),
                 model_view(attention, tokens, html_action="return")):
        html = view.data
        assert re.search(r'<div id="bertviz-[0-9a-f]{32}"', html)
        assert "PYTHON_PARAMS" not in html and '"the"' in html and "require.config" in html
        assert f"{attention[1][0, 2, 3, 1].item()}"[:6] in html  # the weights are in the page
    with pytest.raises(ValueError, match="'tokens' is required"):
        head_view(attention, html_action="return")


def test_encoder_decoder_model_view() -> None:
    enc, dec, cross = _attention(n=4), _attention(n=3, seed=1), [torch.rand(1, 3, 3, 4) for _ in range(2)]
    html = model_view(encoder_attention=enc, decoder_attention=dec, cross_attention=cross,
                      encoder_tokens=list("abcd"), decoder_tokens=list("xyz"), html_action="return").data
    assert all(f'"name": "{part}"' in html for part in ("Encoder", "Decoder", "Cross"))


def test_same_output_as_bertviz() -> None:
    bertviz = pytest.importorskip("bertviz")
    attention, tokens = _attention(), ["[CLS]", "a", "b", "[SEP]"]
    for ours, theirs in ((head_view, bertviz.head_view), (model_view, bertviz.model_view)):
        assert _html(ours(attention, tokens, sentence_b_start=2, html_action="return")) == \
            _html(theirs(attention, tokens, sentence_b_start=2, html_action="return"))
