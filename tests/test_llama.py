"""lecture_pkg.models.llama against transformers' LlamaForCausalLM and Qwen3ForCausalLM
(random-initialised small configurations, offline): logits both ways, cached generation,
padding, the grouped-query cache, and configurations refused by name."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from lecture_pkg.models.llama import Llama, LlamaConfig

transformers = pytest.importorskip("transformers")
VOCAB = 61


def llama_config(**overrides: object) -> transformers.LlamaConfig:
    sizes = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 40,
             "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
             "max_position_embeddings": 64, "pad_token_id": 0}
    return transformers.LlamaConfig(**{**sizes, **overrides})


def qwen3_config(**overrides: object) -> transformers.Qwen3Config:
    sizes = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 40,
             "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 1,
             "head_dim": 12, "max_position_embeddings": 64, "pad_token_id": 0}
    return transformers.Qwen3Config(**{**sizes, **overrides})


CONFIGS = {
    "llama-gqa": lambda: llama_config(),
    "llama-mha-bias-tied-theta": lambda: llama_config(
        num_key_value_heads=4, attention_bias=True, mlp_bias=True, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0}),
    "llama-linear-rope": lambda: llama_config(
        rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}),
    "qwen3-mqa": lambda: qwen3_config(),
    "qwen3-sliding": lambda: qwen3_config(
        num_key_value_heads=2, use_sliding_window=True, sliding_window=3,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
}


def hf_model(name: str) -> torch.nn.Module:
    """HF's model with every weight perturbed (norm gains and biases stop being 1 and 0)."""
    config = CONFIGS[name]()
    torch.manual_seed(0)
    cls = (transformers.Qwen3ForCausalLM if isinstance(config, transformers.Qwen3Config)
           else transformers.LlamaForCausalLM)
    model = cls(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def ids(batch: int = 2, t: int = 11, seed: int = 1) -> torch.Tensor:
    return torch.randint(1, VOCAB, (batch, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_equal_hf_both_directions(name: str) -> None:
    hf = hf_model(name)
    ours = Llama.from_hf(hf)
    x = ids()
    with torch.no_grad():
        expected = hf(x).logits
        torch.testing.assert_close(ours(x).logits, expected, atol=1e-5, rtol=1e-5)
        back = ours.to_hf().eval()  # ours -> HF: a fresh HF model with our weights
        assert type(back) is type(hf)
        torch.testing.assert_close(back(x).logits, expected, atol=1e-6, rtol=1e-6)
    assert ours.config == Llama.from_hf(back).config


@pytest.mark.parametrize("name", ["llama-gqa", "qwen3-sliding"])
def test_our_random_model_equals_its_hf_export(name: str) -> None:
    torch.manual_seed(3)
    ours = Llama(Llama.from_hf(hf_model(name)).config).eval()  # our own initialisation
    hf = ours.to_hf().eval()
    x = ids(3, 13)
    with torch.no_grad():
        torch.testing.assert_close(ours(x).logits, hf(x).logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["llama-gqa", "qwen3-sliding"])
def test_output_attentions_equals_fused_path(name: str) -> None:
    ours = Llama.from_hf(hf_model(name))
    x = ids()
    with torch.no_grad():
        fused = ours(x)
        taught = ours(x, output_attentions=True)
    torch.testing.assert_close(taught.logits, fused.logits, atol=1e-5, rtol=1e-5)
    assert taught.attentions is not None and len(taught.attentions) == 3
    for weights in taught.attentions:
        assert weights.shape == (2, 4, 11, 11)
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 11))
        assert not weights.triu(1).any()  # causal
    window = ours.config.window(0)
    if window is not None:  # a sliding layer gives no weight beyond its window
        first = taught.attentions[0]
        assert not first.tril(-window).any() and taught.attentions[1].tril(-window).any()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_cached_generation_equals_uncached_and_hf(name: str) -> None:
    hf = hf_model(name)
    ours = Llama.from_hf(hf)
    prompt = ids(2, 5)
    cached = ours.generate(prompt, max_new_tokens=8)
    uncached = ours.generate(prompt, max_new_tokens=8, use_cache=False)
    theirs = hf.generate(prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False,
                         pad_token_id=0)
    assert torch.equal(cached, uncached) and torch.equal(cached, theirs)


def test_cache_in_chunks_equals_one_pass_and_stores_only_kv_heads() -> None:
    ours = Llama.from_hf(hf_model("qwen3-sliding"))
    x = ids(2, 12)
    cache = ours.new_cache()
    with torch.no_grad():
        full = ours(x).logits
        pieces = [ours(x[:, a:b], cache=cache).logits for a, b in ((0, 5), (5, 6), (6, 12))]
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-5)
    assert cache[0].k is not None and cache[0].k.shape == (2, 2, 12, 12)  # 2 kv heads, not 4
    config = ours.config
    assert config.kv_cache_bytes_per_token(2) == 2 * 3 * 2 * 12 * 2


def test_left_padding_equals_hf_and_the_unpadded_row() -> None:
    hf = hf_model("qwen3-sliding")
    ours = Llama.from_hf(hf)
    x = ids(2, 9)
    mask = torch.ones_like(x)
    mask[0, :3], x[0, :3] = 0, 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        theirs = hf(x, attention_mask=mask, position_ids=positions).logits
        padded = ours(x, mask).logits
        alone = ours(x[:1, 3:]).logits
    torch.testing.assert_close(padded[1], theirs[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(padded[0, 3:], theirs[0, 3:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(padded[0, 3:], alone[0], atol=1e-5, rtol=1e-5)
    assert torch.isfinite(padded).all()
    generated = ours.generate(x, mask, max_new_tokens=4)
    assert torch.equal(generated[0, 9:], ours.generate(x[:1, 3:], max_new_tokens=4)[0, 6:])


def test_parameter_count_equals_hf_on_meta_device() -> None:
    for name in CONFIGS:
        hf = hf_model(name)
        ours = Llama.from_config(hf.config, device="meta")
        assert sum(p.numel() for p in ours.parameters()) == sum(
            p.numel() for p in hf.parameters())


def test_backward_reaches_every_parameter() -> None:
    ours = Llama.from_hf(hf_model("qwen3-mqa")).train()
    ours(ids()).logits.square().mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in ours.parameters())


def test_bad_configurations_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="num_attention_heads 6 must be divisible by "
                                         "num_key_value_heads 4"):
        LlamaConfig(hidden_size=48, num_attention_heads=6, num_key_value_heads=4)
    with pytest.raises(ValueError, match="head_dim must be even for RoPE"):
        LlamaConfig(hidden_size=36, num_attention_heads=4)
    with pytest.raises(ValueError, match="head_dim must be even for RoPE"):
        LlamaConfig(head_dim=7)
    with pytest.raises(ValueError, match="hidden_size 30 must be divisible by"):
        LlamaConfig(hidden_size=30, num_attention_heads=4)
    with pytest.raises(ValueError, match="layer_types must hold one of"):
        LlamaConfig(num_hidden_layers=2, layer_types=("full_attention",))
    with pytest.raises(ValueError, match="give sliding_window"):
        LlamaConfig(num_hidden_layers=1, layer_types=("sliding_attention",))
    with pytest.raises(ValueError, match="rope_scaling_factor must be >= 1"):
        LlamaConfig(rope_scaling_factor=0.5)
    with pytest.raises(ValueError, match="rope_type='yarn' is not supported"):
        LlamaConfig.from_hf(llama_config(
            rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}))
    with pytest.raises(ValueError, match="hidden_act='gelu' is not supported"):
        LlamaConfig.from_hf(llama_config(hidden_act="gelu"))
    with pytest.raises(TypeError, match="hf_config must be a transformers LlamaConfig"):
        LlamaConfig.from_hf(transformers.GPT2Config())
    with pytest.raises(TypeError, match="config must be a LlamaConfig"):
        Llama(llama_config())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="hf_model must be a transformers"):
        Llama.from_hf(torch.nn.Linear(2, 2))


def test_bad_inputs_are_refused_by_name() -> None:
    ours = Llama.from_hf(hf_model("llama-gqa"))
    with pytest.raises(ValueError, match=r"input_ids must lie in \[0, 61\)"):
        ours(torch.tensor([[VOCAB]]))
    with pytest.raises(TypeError, match="input_ids must be an integer tensor"):
        ours(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="attention_mask must have the shape"):
        ours(ids(), torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="position_ids must have shape"):
        ours(ids(), position_ids=torch.arange(3)[None])
    with pytest.raises(TypeError, match="cache must be a list of 3 KVCache"):
        ours(ids(), cache=[])
    with pytest.raises(ValueError, match="pass do_sample=True"):
        ours.generate(ids(), top_k=3)


def test_scaling_sweep_script_writes_its_runs(tmp_path, load_script) -> None:
    """scripts/scaling_sweep.py at its tiny preset: every planned run recorded with its config,
    its compute 6ND and a curve that ends at the recorded loss."""

    sweep = load_script("scaling_sweep")
    out = tmp_path / "sweep.json"
    payload = sweep.main(["--preset", "tiny", "--flops", "1e9", "--holdout-flops", "1e9",
                          "--device", "cpu", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(payload))
    runs = payload["runs"]
    assert payload["complete"] and [r["role"] for r in runs] == ["grid", "holdout"]
    for run in runs:
        assert run["tokens"] == run["steps"] * run["batch_size"] * run["block_size"]
        assert run["flops"] == 6 * run["non_embedding_params"] * run["tokens"]
        assert run["curve"]["val_loss"][-1] == run["val_loss"]
        assert 0 < run["val_loss"] < math.log(payload["vocab_size"]) + 0.5


@pytest.mark.parametrize("change", [{"position_embedding": "learned"},
                                    {"position_embedding": "none"}, {"norm": "layer"},
                                    {"mlp": "gelu"}, {"mlp": "relu2"}])
def test_ablations_undo_one_change_each(change: dict) -> None:
    base = {"vocab_size": VOCAB, "hidden_size": 24, "num_hidden_layers": 2,
            "num_attention_heads": 2, "max_position_embeddings": 16}
    mlp = change.get("mlp", "swiglu")
    width = 64 if mlp == "swiglu" else 96  # 8d/3 gated vs 4d plain: the same parameters
    torch.manual_seed(0)
    reference = Llama(LlamaConfig(**base, intermediate_size=64))
    torch.manual_seed(0)
    ablated = Llama(LlamaConfig(**base, intermediate_size=width, **change))
    extra = 16 * 24 if change.get("position_embedding") == "learned" else 0
    n = sum(p.numel() for p in reference.parameters())
    assert sum(p.numel() for p in ablated.parameters()) == n + extra
    x = ids(2, 16)
    out = ablated(x).logits
    assert out.shape == (2, 16, VOCAB) and torch.isfinite(out).all()
    cache = ablated.new_cache()
    with torch.no_grad():  # the cache works for every variant
        pieces = [ablated(x[:, :9], cache=cache).logits, ablated(x[:, 9:], cache=cache).logits]
    torch.testing.assert_close(torch.cat(pieces, 1), out.detach(), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="is an ablation"):
        ablated.to_hf()
    if mlp == "relu2":
        h = torch.linspace(-2, 2, 9)
        torch.testing.assert_close(ablated.layers[0].ffn.act(h), h.clamp(min=0) ** 2)
    if change.get("norm") == "layer":
        assert isinstance(ablated.norm, torch.nn.LayerNorm) and ablated.norm.bias is None
    if change.get("position_embedding") == "none":  # one layer sees a causal bag of tokens
        one = Llama(LlamaConfig(**{**base, "num_hidden_layers": 1}, intermediate_size=64,
                                **change))
        swapped = x.clone()
        swapped[:, [0, 1]] = x[:, [1, 0]]
        with torch.no_grad():
            torch.testing.assert_close(one(swapped).logits[:, 2:], one(x).logits[:, 2:],
                                       atol=1e-5, rtol=1e-5)
            rope = Llama(LlamaConfig(**{**base, "num_hidden_layers": 1}, intermediate_size=64))
            assert not torch.allclose(rope(swapped).logits[:, 2:], rope(x).logits[:, 2:])
    if change.get("position_embedding") == "learned":
        with pytest.raises(ValueError, match="outside the context: the learned table has max_position_embeddings"):
            ablated(ids(1, 17))


def test_unknown_ablation_refused_by_name() -> None:
    with pytest.raises(ValueError, match="mlp must be one of"):
        LlamaConfig(mlp="geglu")
    with pytest.raises(ValueError, match="position_embedding must be one of"):
        LlamaConfig(position_embedding="alibi")


def test_ablation_script_compares_arms_over_seeds(tmp_path, load_script) -> None:
    script = load_script("modern_ablations")
    out = tmp_path / "ablations.json"
    payload = script.main(["--tiny", "--arms", "gpt2", "modern", "relu2", "--device", "cpu",
                           "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(payload))
    assert len(payload["runs"]) == 6 and set(payload["comparisons"]) == {
        "gpt2 - modern", "relu2 - modern"}
    for result in payload["comparisons"].values():
        assert result["low"] <= result["effect"] <= result["high"]
        assert result["verdict"] in ("better", "worse", "within the noise")


def test_ablation_results_reproduce_a_recorded_row(load_script) -> None:
    """lecture_pkg/recorded/modern_ablations_cpu.json (scripts/modern_ablations.py at the CPU size,
    commit and command in benchmarks/RESULTS.md): the modern arm's seed-0 run, retrained."""
    root = Path(__file__).resolve().parents[1]
    script = load_script("modern_ablations")
    recorded = json.loads((root / "lecture_pkg" / "recorded" / "modern_ablations_cpu.json").read_text())
    args = script.parse_args(["--out", "unused"])
    vars(args).update(recorded["args"])
    row = next(r for r in recorded["runs"] if r["arm"] == "modern" and r["seed"] == 0)
    data = script.load_data(args, torch.device("cpu"))
    again = script.run("modern", 0, args, data, torch.device("cpu"), None)
    assert again["params"] == row["params"]
    assert abs(again["val_loss"] - row["val_loss"]) < 2e-3
