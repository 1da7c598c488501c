"""Parameter-efficient fine-tuning: LoRA, Houlsby adapters and prompt tuning.

All three freeze the pretrained model and train a few new parameters:

* :class:`LoRALinear` (Hu et al. 2022) adds a low-rank update to a frozen linear layer,
  h = W x + (alpha / r) B A x with A: (r, in_features), B: (out_features, r). B starts at zero,
  so training starts from the pretrained model exactly. After training, B A can be merged
  into W (:meth:`LoRALinear.merge`), and inference costs nothing extra. The frozen layer may
  be a :class:`lecture_pkg.quant.Linear4bit`: that is QLoRA (Dettmers et al. 2023).
* :class:`Adapter` (Houlsby et al. 2019): a bottleneck MLP with a residual connection,
  x + up(act(down(x))), inserted after a sublayer; initialised near the identity.
* :class:`SoftPrompt` (Lester et al. 2021): ``n_tokens`` trained vectors prepended to the input
  embeddings; the model itself is untouched.

:func:`inject_lora` and :func:`add_adapters` put them into a model by module name,
:func:`mark_only_trainable` freezes everything else, :func:`count_parameters` counts.
:func:`subspace_similarity` measures how much two trained adapters' subspaces overlap (Hu et al.
2022, section 7.2).
"""

from __future__ import annotations

import itertools
import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lecture_pkg.checks import check_float_tensor, check_int
from lecture_pkg.quant import Linear4bit, name_matches

__all__ = [
    "Adapter",
    "LoRALinear",
    "SoftPrompt",
    "add_adapters",
    "count_parameters",
    "inject_lora",
    "mark_only_trainable",
    "merge_lora",
    "subspace_similarity",
    "subspace_similarity_grid",
]


class LoRALinear(nn.Module):
    """A frozen linear layer plus a trained low-rank update: y = base(x) + s B A dropout(x).

    base: ``nn.Linear`` or :class:`~lecture_pkg.quant.Linear4bit` (in_features -> out_features).
    r: rank, 1 <= r <= min(in_features, out_features). alpha > 0: s = alpha / r, or
    alpha / sqrt(r) with ``rslora=True`` (Kalajdzievski 2023: keeps the update's scale stable as
    r grows). ``init="kaiming"`` draws A like ``nn.Linear`` does (peft's default),
    ``"gaussian"`` from N(0, 1/r^2); B is zero either way.
    forward: x (..., in_features) -> (..., out_features).
    """

    def __init__(self, base: nn.Module, r: int, alpha: float, dropout: float = 0.0,
                 init: Literal["kaiming", "gaussian"] = "kaiming", rslora: bool = False) -> None:
        super().__init__()
        if not isinstance(base, (nn.Linear, Linear4bit)):
            raise TypeError(f"base must be an nn.Linear or Linear4bit, got {type(base).__name__}")
        check_int("r", r, minimum=1)
        if r > min(base.in_features, base.out_features):
            raise ValueError(f"r must be <= min(in_features, out_features) = "
                             f"{min(base.in_features, base.out_features)}, got {r}")
        if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not alpha > 0:
            raise ValueError(f"alpha must be a positive number, got {alpha!r}")
        if not 0 <= dropout < 1:
            raise ValueError(f"dropout must lie in [0, 1), got {dropout}")
        if init not in ("kaiming", "gaussian"):
            raise ValueError(f"init must be 'kaiming' or 'gaussian', got {init!r}")
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        self.r, self.alpha = r, alpha
        self.scaling = alpha / math.sqrt(r) if rslora else alpha / r
        factory = {"dtype": torch.float32, "device": _device_of(base)}
        self.lora_A = nn.Parameter(torch.empty(r, base.in_features, **factory))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, r, **factory))
        if init == "kaiming":
            nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        else:
            nn.init.normal_(self.lora_A, std=1 / r)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.merged = False

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def delta_weight(self) -> Tensor:
        """s B A: (out_features, in_features), the update LoRA adds to W."""
        return self.scaling * (self.lora_B @ self.lora_A)

    def forward(self, x: Tensor) -> Tensor:
        check_float_tensor("x", x)
        y = self.base(x)
        if self.merged:
            return y
        update = F.linear(F.linear(self.dropout(x).to(self.lora_A.dtype), self.lora_A),
                          self.lora_B)
        return y + (self.scaling * update).to(y.dtype)

    def merge(self) -> None:
        """W <- W + s B A in place: the layer then costs what the base costs. Float bases only;
        a 4-bit base would be rounded again, so use :meth:`merged_linear` for it."""
        if self.merged:
            raise RuntimeError("merge(): the LoRA update is already merged (call unmerge() first)")
        if isinstance(self.base, Linear4bit):
            raise TypeError("merge(): a Linear4bit base cannot hold W + BA without rounding it "
                            "again; use merged_linear() for a full-precision merged copy")
        with torch.no_grad():
            self.base.weight += self.delta_weight().to(self.base.weight.dtype)
        self.merged = True

    def unmerge(self) -> None:
        """W <- W - s B A, undoing :meth:`merge` (up to rounding)."""
        if not self.merged:
            raise RuntimeError("unmerge(): nothing to unmerge (merge() was not called)")
        with torch.no_grad():
            self.base.weight -= self.delta_weight().to(self.base.weight.dtype)
        self.merged = False

    def merged_linear(self, dtype: torch.dtype = torch.float32) -> nn.Linear:
        """A new ``nn.Linear`` with weight W + s B A in ``dtype`` (W dequantised for a 4-bit base)."""
        if isinstance(self.base, Linear4bit):
            weight = self.base.dequantized_weight(torch.float32)
        else:
            weight = self.base.weight.detach().float()
        if not self.merged:
            weight = weight + self.delta_weight().detach()
        merged = nn.Linear(self.in_features, self.out_features, bias=self.base.bias is not None,
                           dtype=dtype, device=weight.device)
        with torch.no_grad():
            merged.weight.copy_(weight)
            if self.base.bias is not None:
                merged.bias.copy_(self.base.bias)
        return merged

    def extra_repr(self) -> str:
        return f"r={self.r}, alpha={self.alpha}, scaling={self.scaling:g}, merged={self.merged}"


def _device_of(module: nn.Module) -> torch.device:
    return next(itertools.chain(module.parameters(), module.buffers())).device


def _matching(model: nn.Module, targets: tuple[str, ...], kind: type | tuple[type, ...],
              argument: str) -> list[str]:
    """Qualified names of ``kind`` modules equal to a target or ending with ``"." + target``."""
    if isinstance(targets, str):
        targets = (targets,)
    names = [name for name, module in model.named_modules()
             if isinstance(module, kind) and name_matches(name, targets)]
    if not names:
        available = sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                            if isinstance(module, kind)})
        raise ValueError(f"{argument}={targets!r} matches no linear module; last name parts "
                         f"present: {available}")
    return names


def _replace(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent), child, module)


def inject_lora(model: nn.Module, target_modules: tuple[str, ...], r: int, alpha: float,
                dropout: float = 0.0, init: Literal["kaiming", "gaussian"] = "kaiming",
                rslora: bool = False) -> list[str]:
    """Wrap every linear layer named by ``target_modules`` in a :class:`LoRALinear`, in place.

    A target matches a module whose qualified name equals it or ends with ``"." + target``, e.g.
    ``("query", "value")`` matches ``encoder.layer.0.attention.self.query``. Returns the names
    wrapped; ValueError if none matches. Does not freeze the rest: see :func:`mark_only_trainable`.
    """
    names = _matching(model, target_modules, (nn.Linear, Linear4bit), "target_modules")
    for name in names:
        _replace(model, name, LoRALinear(model.get_submodule(name), r, alpha, dropout, init,
                                         rslora))
    return names


def merge_lora(model: nn.Module, dtype: torch.dtype = torch.float32,
               requantize: bool = False) -> list[str]:
    """Replace every :class:`LoRALinear` by a plain layer holding W + s B A, in place; returns
    the names replaced.

    Float bases become an ``nn.Linear`` in ``dtype`` (peft's ``merge_and_unload``). A 4-bit base
    becomes an ``nn.Linear`` holding dequant(W) + s B A in ``dtype`` (the outputs are kept, the
    4-bit saving is not), or with ``requantize=True`` a new :class:`Linear4bit` holding that sum
    quantised again, which is what peft does for bitsandbytes' 4-bit layers: the size is kept,
    at the price of a second rounding.
    """
    names = [name for name, module in model.named_modules() if isinstance(module, LoRALinear)]
    for name in names:
        lora = model.get_submodule(name)
        if requantize and isinstance(lora.base, Linear4bit):
            merged = Linear4bit.from_linear(lora.merged_linear(torch.float32),
                                            lora.base.blocksize, lora.base.compute_dtype)
        else:
            merged = lora.merged_linear(dtype)
        _replace(model, name, merged)
    return names


def mark_only_trainable(model: nn.Module, also: tuple[str, ...] = ()) -> None:
    """Freeze every parameter except those of LoRA, adapters and soft prompts, and those under
    the modules named in ``also`` (e.g. a freshly initialised classification head)."""
    for p in model.parameters():
        p.requires_grad_(False)
    for name, module in model.named_modules():
        if isinstance(module, LoRALinear):
            module.lora_A.requires_grad_(True)
            module.lora_B.requires_grad_(True)
        elif isinstance(module, (Adapter, SoftPrompt)) or name_matches(name, also):
            for p in module.parameters():
                p.requires_grad_(True)


def count_parameters(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts (4-bit buffers count as the weights they encode)."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    total += sum(m.in_features * m.out_features for m in model.modules()
                 if isinstance(m, Linear4bit))
    return trainable, total


class Adapter(nn.Module):
    """Houlsby bottleneck adapter: x + up(act(down(x))), x (..., d_model) -> (..., d_model).

    down: d_model -> bottleneck, up: bottleneck -> d_model. Weights start at N(0, init_std^2)
    and biases at zero, so the adapter starts as (almost) the identity and fine-tuning starts
    from the pretrained model. 2 d_model bottleneck + d_model + bottleneck parameters.
    """

    def __init__(self, d_model: int, bottleneck: int, init_std: float = 1e-3) -> None:
        super().__init__()
        check_int("d_model", d_model, minimum=1)
        check_int("bottleneck", bottleneck, minimum=1)
        self.down = nn.Linear(d_model, bottleneck)
        self.up = nn.Linear(bottleneck, d_model)
        for layer in (self.down, self.up):
            nn.init.normal_(layer.weight, std=init_std)
            nn.init.zeros_(layer.bias)

    def forward(self, x: Tensor) -> Tensor:
        check_float_tensor("x", x)
        return x + self.up(F.gelu(self.down(x)))


def add_adapters(model: nn.Module, target_modules: tuple[str, ...], bottleneck: int,
                 init_std: float = 1e-3) -> list[str]:
    """Insert an :class:`Adapter` after every linear layer named by ``target_modules``, in place.

    For BERT, ``("attention.output.dense", "output.dense")`` are the projections after
    attention and after the feed-forward block, the two places Houlsby et al. use (the
    adapter sits before the residual sum and layer norm). Returns the names changed.
    """
    names = _matching(model, target_modules, nn.Linear, "target_modules")
    for name in names:
        linear = model.get_submodule(name)
        adapter = Adapter(linear.out_features, bottleneck, init_std).to(linear.weight.device)
        _replace(model, name, nn.Sequential(linear, adapter))
    return names


class SoftPrompt(nn.Module):
    """Prompt tuning: ``n_tokens`` trained vectors prepended to every sequence's embeddings.

    forward(embeddings (batch, t, dim), mask (batch, t) bool, True = real token) ->
    (embeddings (batch, n_tokens + t, dim), mask (batch, n_tokens + t)). ``init`` (n_tokens,
    dim) starts the prompt from given vectors, e.g. embeddings of vocabulary words, which
    Lester et al. found to train better than random vectors.
    """

    def __init__(self, n_tokens: int, dim: int, init: Tensor | None = None) -> None:
        super().__init__()
        check_int("n_tokens", n_tokens, minimum=1)
        check_int("dim", dim, minimum=1)
        if init is None:
            init = torch.randn(n_tokens, dim) * 0.02
        elif tuple(init.shape) != (n_tokens, dim):
            raise ValueError(f"init must have shape ({n_tokens}, {dim}), got {tuple(init.shape)}")
        self.prompt = nn.Parameter(init.detach().clone().float())

    def forward(self, embeddings: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        check_float_tensor("embeddings", embeddings)
        if embeddings.dim() != 3 or embeddings.shape[-1] != self.prompt.shape[1]:
            raise ValueError(f"embeddings must be (batch, t, {self.prompt.shape[1]}), got "
                             f"{tuple(embeddings.shape)}")
        if mask.shape != embeddings.shape[:2] or mask.dtype != torch.bool:
            raise ValueError(f"mask must be a bool (batch, t) = {tuple(embeddings.shape[:2])} "
                             f"tensor, got {mask.dtype} {tuple(mask.shape)}")
        batch = embeddings.shape[0]
        prompt = self.prompt.to(embeddings.dtype).expand(batch, -1, -1)
        prompt_mask = torch.ones(batch, self.prompt.shape[0], dtype=torch.bool,
                                 device=mask.device)
        return torch.cat([prompt, embeddings], dim=1), torch.cat([prompt_mask, mask], dim=1)


def _top_right_singular_vectors(name: str, matrix: Tensor, n: int) -> Tensor:
    """The top ``n`` right-singular vectors of ``matrix`` (rows, cols) as columns of a float64
    (cols, n) tensor; ValueError when the matrix has fewer than ``n`` nonzero singular values
    (its top-``n`` subspace would then be arbitrary)."""
    _, sigma, vh = torch.linalg.svd(matrix.detach().to("cpu", torch.float64), full_matrices=False)
    # numerical rank as in numpy.linalg.matrix_rank, at the precision the matrix was stored in
    tol = max(matrix.shape) * torch.finfo(matrix.dtype).eps * sigma[0].item()
    rank = int((sigma > tol).sum())
    if rank < n:
        raise ValueError(f"{name} has numerical rank {rank}, fewer than the {n} directions asked "
                         f"for: its top-{n} subspace is not defined")
    return vh[:n].T


def _check_pair(a1: Tensor, a2: Tensor) -> None:
    for name, a in (("a1", a1), ("a2", a2)):
        check_float_tensor(name, a)
        if a.dim() != 2:
            raise ValueError(f"{name} must be a 2-D (rows, d) matrix, got shape {tuple(a.shape)}")
    if a1.shape[1] != a2.shape[1]:
        raise ValueError(f"a1 has {a1.shape[1]} columns but a2 has {a2.shape[1]} (both must "
                         "act on the same d-dimensional input space)")


def subspace_similarity_grid(a1: Tensor, a2: Tensor) -> Tensor:
    """phi(a1, a2, i, j) for every i <= min(a1.shape) and j <= min(a2.shape) at once.

    a1: (r1, d), a2: (r2, d), e.g. the ``lora_A`` of two adapters on the same layer, or two
    updates ``delta_weight()`` (out, d). Returns a float64 (min(r1, d), min(r2, d)) tensor whose
    entry [i - 1, j - 1] is :func:`subspace_similarity` (a1, a2, i, j). Each matrix must have
    full rank min(rows, d).
    """
    _check_pair(a1, a2)
    u = _top_right_singular_vectors("a1", a1, min(a1.shape))
    v = _top_right_singular_vectors("a2", a2, min(a2.shape))
    overlap = (u.T @ v).square().cumsum(0).cumsum(1)  # [i-1, j-1] = ||U_i^T V_j||_F^2
    i = torch.arange(1, u.shape[1] + 1, dtype=torch.float64)[:, None]
    j = torch.arange(1, v.shape[1] + 1, dtype=torch.float64)[None, :]
    return overlap / torch.minimum(i, j)


def subspace_similarity(a1: Tensor, a2: Tensor, i: int, j: int) -> float:
    """Hu et al.'s normalised subspace similarity phi(a1, a2, i, j) = ||U_i^T V_j||_F^2 / min(i, j).

    a1: (r1, d) and a2: (r2, d) act on the same d-dimensional space (LoRA's A: (r, in_features));
    U_i: (d, i) holds the top-i right-singular vectors of a1, V_j: (d, j) the top-j of a2.
    The result lies in [0, 1]: 1 when one subspace contains the other, 0 when they are
    orthogonal. It equals the mean of cos^2 of the min(i, j) principal angles between them.
    For a random i-dimensional subspace its expectation is max(i, j) / d.
    1 <= i <= min(r1, d) and 1 <= j <= min(r2, d), and the top-i (top-j) singular values must be
    nonzero. Computed in float64 on the CPU.
    """
    _check_pair(a1, a2)
    for name, value, a in (("i", i, a1), ("j", j, a2)):
        check_int(name, value, minimum=1)
        if value > min(a.shape):
            source = "a1" if name == "i" else "a2"
            raise ValueError(f"{name} must be <= min{tuple(a.shape)} = {min(a.shape)} "
                             f"(the number of right-singular vectors of {source}), got {value}")
    u = _top_right_singular_vectors("a1", a1, i)
    v = _top_right_singular_vectors("a2", a2, j)
    return (u.T @ v).square().sum().item() / min(i, j)
