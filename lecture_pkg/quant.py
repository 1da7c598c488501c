"""Quantisation: store weights in 8 or 4 bits and dequantise them when they are used.

Every scheme here maps a float to the nearest of a few representable values after dividing by a
scale constant, and multiplies back to dequantise:

* :func:`absmax_quantize` (symmetric int8): q = round(127 x / absmax(x)), x ~ q / c with
  c = 127 / absmax(x). One outlier inflates absmax and squeezes every other value into few codes.
* :func:`zeropoint_quantize` (asymmetric int8): the range [min, max] is stretched over all 256
  codes, which suits one-sided data such as activations after a ReLU.
* :func:`blockwise_absmax_quantize`: one constant per block of ``blocksize`` values, so an
  outlier only costs precision inside its own block.
* :func:`int8_matmul` (LLM.int8, Dettmers et al. 2022): rows of the input and of the weight get
  their own constants (vector-wise), and the few input features holding a value with
  |x| >= ``threshold`` (6 in the paper) are multiplied in high precision instead.
* 4-bit codes (:func:`nf4_codes`, :func:`fp4_codes`, :func:`int4_codes`) with blockwise absmax
  scaling, two codes packed per byte: :func:`quantize_4bit` / :func:`dequantize_4bit`.
  NF4 (QLoRA, Dettmers et al. 2023) places its 16 codes at quantiles of a normal distribution,
  because trained weights are roughly normal; :func:`quantize_nf4` is bit-for-bit
  ``bitsandbytes.functional.quantize_4bit(x, quant_type="nf4")``.
* Double quantisation (:func:`double_quantize`): the float32 absmax constants (32 bits per block
  of 64 weights = 0.5 bit per weight) are themselves quantised to 8 bits in blocks of 256 after
  subtracting their mean, which brings 4.5 bits per weight down to about 4.127. The layout is
  bitsandbytes' ``compress_statistics=True``; the 8-bit codes agree except at rare near-ties
  (about 0.2% of the constants), where bitsandbytes' kernel picks the farther code and ours the
  nearer one.
* :class:`Linear4bit`: a frozen linear layer that holds NF4 codes and double-quantised constants
  and dequantises the weight on the fly in the compute dtype (what QLoRA fine-tunes adapters on).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lecture_pkg.checks import check_float_tensor, check_int

__all__ = [
    "DoubleQuantized",
    "Linear4bit",
    "NF4Tensor",
    "absmax_dequantize",
    "absmax_quantize",
    "bits_per_parameter",
    "blockwise_absmax_dequantize",
    "blockwise_absmax_quantize",
    "dequantize_4bit",
    "dequantize_blockwise",
    "dequantize_nf4",
    "double_quantize",
    "dynamic_codes",
    "fp4_codes",
    "int4_codes",
    "int8_matmul",
    "name_matches",
    "nf4_codes",
    "quantize_4bit",
    "quantize_blockwise",
    "quantize_linears",
    "quantize_nf4",
    "vectorwise_quantize",
    "zeropoint_dequantize",
    "zeropoint_quantize",
]


def _check_blocksize(name: str, value: object) -> int:
    """``value`` if it is a power-of-two int >= 2 (bitsandbytes' rule: blocks tile memory)."""
    check_int(name, value, minimum=2)
    if value & (value - 1):
        raise ValueError(f"{name} must be a power of two (64, 128, ...), got {value}")
    return value


# ---------------------------------------------------------------------------------------------
# int8: one constant for the whole tensor, symmetric or with a zero point
# ---------------------------------------------------------------------------------------------

def absmax_quantize(x: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric int8: returns (q, c) with c = 127 / absmax(x) and q = round(c x) as int8.

    x: any shape, floating. c is a float32 scalar tensor; dequantise with q / c.
    """
    check_float_tensor("x", x)
    c = 127 / x.abs().amax().float().clamp(min=torch.finfo(torch.float32).tiny)
    return torch.round(c * x.float()).to(torch.int8), c


def absmax_dequantize(q: Tensor, c: Tensor) -> Tensor:
    """x ~ q / c (float32), the inverse of :func:`absmax_quantize`."""
    return q.float() / c


def zeropoint_quantize(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Asymmetric int8: returns (q, scale, zero_point) with q = clamp(round(scale x) + zero_point).

    scale = 255 / (max - min) stretches the data's range over all 256 codes; zero_point shifts
    min to -128. The range always includes 0, so that 0 (padding, ReLU zeros) is exact.
    Dequantise with (q - zero_point) / scale.
    """
    check_float_tensor("x", x)
    x = x.float()
    lo, hi = x.amin().clamp(max=0), x.amax().clamp(min=0)
    width = hi - lo
    scale = 255 / torch.where(width > 0, width, torch.ones_like(width))
    zero_point = -128 - torch.round(scale * lo)
    q = torch.clamp(torch.round(scale * x) + zero_point, -128, 127)
    return q.to(torch.int8), scale, zero_point


def zeropoint_dequantize(q: Tensor, scale: Tensor, zero_point: Tensor) -> Tensor:
    """x ~ (q - zero_point) / scale (float32), the inverse of :func:`zeropoint_quantize`."""
    return (q.float() - zero_point) / scale


# ---------------------------------------------------------------------------------------------
# Blocks: one constant per block of `blocksize` consecutive values (row-major order)
# ---------------------------------------------------------------------------------------------

def _scale_blocks(x: Tensor, blocksize: int) -> tuple[Tensor, Tensor]:
    """(x / absmax of its block, clamped to [-1, 1], flat float32; absmax per block, float32).

    The operations are bitsandbytes' CPU ones, so that the codes chosen later agree bit for bit:
    full blocks are multiplied by 1/absmax, a shorter last block is divided by its absmax.
    """
    flat = x.reshape(-1).float()
    n = flat.numel()
    blocks = -(-n // blocksize)
    padded = F.pad(flat, (0, blocks * blocksize - n)).view(blocks, blocksize)
    absmax = padded.abs().amax(dim=1)
    safe = absmax.clamp(min=1e-38)
    scaled = padded * (1.0 / safe)[:, None]
    if n % blocksize:
        scaled[-1] = padded[-1] / safe[-1]
    return scaled.clamp(-1, 1).reshape(-1)[:n], absmax


def _unscale_blocks(values: Tensor, absmax: Tensor, blocksize: int) -> Tensor:
    """values (flat, n) times the absmax of their block; the inverse of :func:`_scale_blocks`.

    ``values`` must be a fresh tensor: it is multiplied in place, which saves a pass over memory
    (dequantisation is memory-bound)."""
    n = values.numel()
    if n % blocksize:
        values = F.pad(values, (0, absmax.numel() * blocksize - n))
    return values.view(-1, blocksize).mul_(absmax[:, None]).view(-1)[:n]


def _nearest_code(scaled: Tensor, codes: Tensor) -> Tensor:
    """Index of the nearest entry of the sorted ``codes`` (a tie goes to the lower code)."""
    midpoints = (codes[:-1] + codes[1:]) / 2
    return torch.bucketize(scaled, midpoints)


def blockwise_absmax_quantize(x: Tensor, blocksize: int = 64) -> tuple[Tensor, Tensor]:
    """Absmax int8 per block: returns (q, c), q: (n,) int8 over the flattened x, c: (blocks,).

    Dequantise with :func:`blockwise_absmax_dequantize`. The last block may be shorter.
    """
    check_float_tensor("x", x)
    _check_blocksize("blocksize", blocksize)
    scaled, absmax = _scale_blocks(x, blocksize)
    return torch.round(127 * scaled).to(torch.int8), 127 / absmax.clamp(min=1e-38)


def blockwise_absmax_dequantize(q: Tensor, c: Tensor, shape: tuple[int, ...],
                                blocksize: int = 64) -> Tensor:
    """float32 tensor of ``shape`` from :func:`blockwise_absmax_quantize`'s (q, c)."""
    return _unscale_blocks(q.float(), 1 / c, blocksize).view(shape)


# ---------------------------------------------------------------------------------------------
# LLM.int8: vector-wise constants and outlier decomposition
# ---------------------------------------------------------------------------------------------

def vectorwise_quantize(x: Tensor) -> tuple[Tensor, Tensor]:
    """Absmax int8 per row: x (rows, k) -> (q: (rows, k) int8, absmax: (rows,) float32)."""
    check_float_tensor("x", x)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (rows, k), got shape {tuple(x.shape)}")
    absmax = x.abs().amax(dim=1).float()
    q = torch.round(x.float() * (127.0 / absmax.clamp(min=1e-38))[:, None])
    return q.to(torch.int8), absmax


def int8_matmul(x: Tensor, weight: Tensor, threshold: float | None = 6.0) -> Tensor:
    """x @ weight.T with both operands in int8, LLM.int8 style; returns float32 (tokens, out).

    x: (tokens, k), weight: (out, k). Each row of x and of weight gets its own absmax constant,
    the int8 product is accumulated exactly in int32 and rescaled by absmax_x absmax_w / 127^2.
    With a ``threshold``, every input feature (column of x) that holds a value with
    |x| >= threshold is taken out of the int8 product and multiplied in float32 instead;
    ``threshold=None`` quantises everything.
    """
    check_float_tensor("x", x)
    check_float_tensor("weight", weight)
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"need x (tokens, k) and weight (out, k), got {tuple(x.shape)} and "
                         f"{tuple(weight.shape)}")
    x, weight = x.float(), weight.float()
    outliers = torch.zeros(x.shape[1], dtype=torch.bool, device=x.device)
    if threshold is not None:
        if threshold <= 0:
            raise ValueError(f"threshold must be positive or None, got {threshold}")
        outliers = (x.abs() >= threshold).any(dim=0)
    out = x[:, outliers] @ weight[:, outliers].T
    regular = ~outliers
    if regular.any():
        qx, ax = vectorwise_quantize(x[:, regular])
        qw, aw = vectorwise_quantize(weight[:, regular])
        # the int32 accumulation of int8 hardware, done exactly in float64 (sums < 2^53)
        acc = qx.double() @ qw.double().T
        out = out + acc.float() * (ax[:, None] * aw[None, :] / 127**2)
    return out


# ---------------------------------------------------------------------------------------------
# 4-bit code tables
# ---------------------------------------------------------------------------------------------

def nf4_codes(offset: float | None = None) -> Tensor:
    """The 16 NormalFloat4 codes in [-1, 1], sorted (float32), built as QLoRA describes.

    Split the normal distribution at 8 equally likely quantiles on the positive side and 7 on
    the negative side, so that 0 is a code exactly and the table stays within 16 entries:
    positives are Phi^-1 at 8 evenly spaced probabilities from 0.5 to ``offset`` (0.5 excluded),
    negatives are minus Phi^-1 at 7 from 0.5 to ``offset``, then all are divided by the largest.
    ``offset`` defaults to QLoRA's 1/2 (1 - 1/(2*15) + 1 - 1/(2*16)) = 0.96770833..., written to
    7 digits (0.9677083) as bitsandbytes does; with that, the table equals bitsandbytes' NF4.
    """
    if offset is None:
        offset = round((1 - 1 / (2 * 15) + 1 - 1 / (2 * 16)) / 2, 7)
    if not 0.5 < offset < 1:
        raise ValueError(f"offset must lie in (0.5, 1), got {offset}")
    # bitsandbytes spaces the probabilities in float32 and evaluates Phi^-1 in float64
    positive = torch.special.ndtri(torch.linspace(offset, 0.5, 9)[:-1].double())
    negative = -torch.special.ndtri(torch.linspace(offset, 0.5, 8)[:-1].double())
    codes = torch.cat([negative, torch.zeros(1, dtype=torch.float64), positive]).float()
    codes = codes.sort().values
    return codes / codes.max()


def fp4_codes() -> Tensor:
    """bitsandbytes' FP4 values, sorted (float32, 16 entries, +0 and -0 both present).

    1 sign, 2 exponent and 1 mantissa bit: magnitudes 0, 0.0625 (the one subnormal), 2, 3, 4, 6,
    8, 12, divided by 12. A float format spends its codes on dynamic range, not on where
    normally distributed weights lie.
    """
    magnitudes = torch.tensor([0.0, 0.0625, 2, 3, 4, 6, 8, 12]) / 12
    return torch.cat([-magnitudes, magnitudes]).sort().values


def int4_codes() -> Tensor:
    """Uniform symmetric int4: k/7 for k = -7..7 plus a second zero (16 entries, sorted).

    A symmetric absmax grid has an odd number of levels, so one of the 16 codes is wasted
    (bitsandbytes' "int4" table does the same).
    """
    return torch.cat([torch.arange(-7, 8) / 7, torch.zeros(1)]).sort().values


def dynamic_codes() -> Tensor:
    """bitsandbytes' signed 8-bit dynamic map (256 sorted float32 values in [-1, 1]).

    A dynamic exponent: one more decade of range per leading zero bit, the remaining bits
    spread linearly over [0.1, 1) of that decade. Double quantisation stores absmax constants
    with it.
    """
    values = []
    for i in range(7):  # 7 decades, 10^-6 .. 10^0, with 2^i fraction steps each
        bounds = torch.linspace(0.1, 1, 2**i + 1, dtype=torch.float32)
        means = (bounds[:-1] + bounds[1:]) / 2.0
        values += (10 ** (i - 6) * means).tolist() + (-(10 ** (i - 6)) * means).tolist()
    values += [0.0, 1.0]
    values += [0.0] * (256 - len(values))
    return torch.tensor(sorted(values), dtype=torch.float32)


# ---------------------------------------------------------------------------------------------
# Blockwise quantisation to a code table
# ---------------------------------------------------------------------------------------------

def quantize_blockwise(x: Tensor, codes: Tensor, blocksize: int) -> tuple[Tensor, Tensor]:
    """Codes of x scaled by its block's absmax: (indices (n,) uint8, absmax (blocks,) float32).

    x: any shape, floating; codes: sorted, at most 256 entries in [-1, 1].
    """
    check_float_tensor("x", x)
    _check_blocksize("blocksize", blocksize)
    if codes.numel() > 256:
        raise ValueError(f"codes must have at most 256 entries for uint8, got {codes.numel()}")
    scaled, absmax = _scale_blocks(x, blocksize)
    return _nearest_code(scaled, codes.to(scaled.device)).to(torch.uint8), absmax


def dequantize_blockwise(indices: Tensor, absmax: Tensor, codes: Tensor, blocksize: int) -> Tensor:
    """codes[indices] times the absmax of their block: flat float32 (n,)."""
    return _unscale_blocks(codes.to(absmax.device)[indices.long()], absmax, blocksize)


def quantize_4bit(x: Tensor, codes: Tensor, blocksize: int = 64) -> tuple[Tensor, Tensor]:
    """4-bit blockwise quantisation to a 16-entry sorted code table, two codes per byte.

    Returns (packed: (ceil(n/2),) uint8, absmax: (ceil(n/blocksize),) float32). Element 2i goes
    to the high nibble of byte i, element 2i+1 to the low nibble; an odd count is padded with
    the code nearest 0.
    """
    if codes.numel() != 16:
        raise ValueError(f"codes must have 16 entries for 4 bits, got {codes.numel()}")
    indices, absmax = quantize_blockwise(x, codes, blocksize)
    if indices.numel() % 2:
        zero = _nearest_code(torch.zeros(1, device=indices.device), codes.to(indices.device))
        indices = torch.cat([indices, zero.to(torch.uint8)])
    return (indices[0::2] << 4) | indices[1::2], absmax


def dequantize_4bit(packed: Tensor, absmax: Tensor, codes: Tensor, shape: tuple[int, ...],
                    blocksize: int = 64, dtype: torch.dtype = torch.float32) -> Tensor:
    """Tensor of ``shape`` and ``dtype`` from :func:`quantize_4bit`'s (packed, absmax).

    A byte holds two codes, so one lookup in a 256 x 2 table (the code pair of every byte value)
    unpacks and decodes at once. The products are formed in float32 and cast once, as
    bitsandbytes does.
    """
    n = math.prod(shape)
    byte = torch.arange(256, device=packed.device)
    codes = codes.to(packed.device)
    pairs = torch.stack([codes[byte >> 4], codes[byte & 0xF]], dim=1)  # (256, 2)
    values = pairs.index_select(0, packed.int()).view(-1)[:n]
    return _unscale_blocks(values, absmax, blocksize).view(shape).to(dtype)


def quantize_nf4(x: Tensor, blocksize: int = 64) -> tuple[Tensor, Tensor]:
    """NF4 quantisation: (packed uint8 (ceil(n/2),), absmax float32 (blocks,)).

    Bit for bit ``bitsandbytes.functional.quantize_4bit(x, quant_type="nf4", blocksize=...)``
    (its packed bytes are ours viewed as (ceil(n/2), 1)).
    """
    return quantize_4bit(x, nf4_codes(), blocksize)


def dequantize_nf4(packed: Tensor, absmax: Tensor, shape: tuple[int, ...], blocksize: int = 64,
                   dtype: torch.dtype = torch.float32) -> Tensor:
    """The inverse of :func:`quantize_nf4` (equal to bitsandbytes' ``dequantize_4bit``)."""
    return dequantize_4bit(packed, absmax, nf4_codes(), shape, blocksize, dtype)


# ---------------------------------------------------------------------------------------------
# Double quantisation and the tensors a 4-bit weight really holds
# ---------------------------------------------------------------------------------------------

@dataclass
class DoubleQuantized:
    """Quantised absmax constants: ``indices`` into :func:`dynamic_codes` (uint8), one float32
    ``absmax`` per block of ``blocksize`` constants, and the float32 ``offset`` (their mean)."""

    indices: Tensor
    absmax: Tensor
    offset: Tensor
    blocksize: int

    def dequantize(self) -> Tensor:
        """The constants back in float32 (n,)."""
        codes = dynamic_codes().to(self.absmax.device)
        return dequantize_blockwise(self.indices, self.absmax, codes, self.blocksize) + self.offset

    def tensors(self) -> list[Tensor]:
        return [self.indices, self.absmax, self.offset]


def double_quantize(absmax: Tensor, blocksize: int = 256) -> DoubleQuantized:
    """Quantise absmax constants (n,) to 8 bits: subtract their mean, blockwise dynamic codes.

    All constants are positive; without the mean removed, half of the signed 8-bit codes would
    go unused. This is the layout of bitsandbytes' ``compress_statistics=True`` (same offset,
    block scales and code table); the codes are the nearest ones, which bitsandbytes' kernel
    misses at rare near-ties (about 0.2% of constants), so those differ by one code.
    """
    check_float_tensor("absmax", absmax)
    offset = absmax.float().mean()
    indices, scale = quantize_blockwise(absmax.float() - offset, dynamic_codes(), blocksize)
    return DoubleQuantized(indices, scale, offset, blocksize)


@dataclass
class NF4Tensor:
    """A weight in NF4: packed codes, its absmax constants (plain float32 or double-quantised),
    its shape and block size. ``nbytes`` counts every tensor it holds."""

    packed: Tensor
    absmax: Tensor | DoubleQuantized
    shape: tuple[int, ...]
    blocksize: int

    @classmethod
    def from_float(cls, x: Tensor, blocksize: int = 64, double_quant: bool = True,
                   dq_blocksize: int = 256) -> NF4Tensor:
        packed, absmax = quantize_nf4(x, blocksize)
        if double_quant:
            absmax = double_quantize(absmax, dq_blocksize)
        return cls(packed, absmax, tuple(x.shape), blocksize)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        absmax = self.absmax
        if isinstance(absmax, DoubleQuantized):
            absmax = absmax.dequantize()
        return dequantize_nf4(self.packed, absmax, self.shape, self.blocksize, dtype)

    def tensors(self) -> list[Tensor]:
        if isinstance(self.absmax, DoubleQuantized):
            return [self.packed, *self.absmax.tensors()]
        return [self.packed, self.absmax]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


def bits_per_parameter(weight: NF4Tensor) -> float:
    """Bits held per weight, counted from the tensors actually stored (codes and constants)."""
    return 8 * weight.nbytes / math.prod(weight.shape)


# ---------------------------------------------------------------------------------------------
# A frozen 4-bit linear layer
# ---------------------------------------------------------------------------------------------

class _DequantizedMatmul(torch.autograd.Function):
    """x @ W.T where W is dequantised in forward and again in backward, so that autograd never
    keeps the full-precision weight alive between the two (bitsandbytes' MatMul4Bit does the
    same). Only x's gradient exists: the 4-bit codes are frozen."""

    @staticmethod
    def forward(ctx, x: Tensor, layer: Linear4bit) -> Tensor:
        ctx.layer = layer
        return F.linear(x, layer.dequantized_weight(x.dtype))

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return grad @ ctx.layer.dequantized_weight(grad.dtype), None


class Linear4bit(nn.Module):
    """A frozen ``nn.Linear`` stored in NF4 with double-quantised constants.

    forward: x (..., in_features) -> (..., out_features). The weight is dequantised to
    ``compute_dtype`` (default: x's dtype) at every call and discarded afterwards, and again in
    the backward pass, so only the 4-bit codes stay in memory between them; gradients flow to x,
    never to the codes. The stored tensors are
    buffers (they move with ``.to`` and go into ``state_dict``), the bias a frozen parameter.
    """

    def __init__(self, weight: NF4Tensor, bias: Tensor | None = None,
                 compute_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if not isinstance(weight.absmax, DoubleQuantized):
            raise TypeError("Linear4bit stores double-quantised constants: build the weight "
                            "with NF4Tensor.from_float(..., double_quant=True)")
        self.out_features, self.in_features = weight.shape
        self.blocksize, self.dq_blocksize = weight.blocksize, weight.absmax.blocksize
        self.compute_dtype = compute_dtype
        self.register_buffer("packed", weight.packed)
        self.register_buffer("absmax_indices", weight.absmax.indices)
        self.register_buffer("absmax_scale", weight.absmax.absmax)
        self.register_buffer("absmax_offset", weight.absmax.offset)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(),
                                                           requires_grad=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear, blocksize: int = 64,
                    compute_dtype: torch.dtype | None = None) -> Linear4bit:
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be an nn.Linear, got {type(linear).__name__}")
        weight = NF4Tensor.from_float(linear.weight.detach(), blocksize, double_quant=True)
        return cls(weight, linear.bias, compute_dtype)

    @property
    def nf4(self) -> NF4Tensor:
        absmax = DoubleQuantized(self.absmax_indices, self.absmax_scale, self.absmax_offset,
                                 self.dq_blocksize)
        return NF4Tensor(self.packed, absmax, (self.out_features, self.in_features),
                         self.blocksize)

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """(out_features, in_features) weight in ``dtype``."""
        return self.nf4.dequantize(dtype)

    def forward(self, x: Tensor) -> Tensor:
        check_float_tensor("x", x)
        dtype = self.compute_dtype or x.dtype
        out = _DequantizedMatmul.apply(x.to(dtype), self)
        if self.bias is not None:
            out = out + self.bias.to(dtype)
        return out.to(x.dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"nf4 blocksize={self.blocksize}, double-quantised constants")


def quantize_linears(model: nn.Module, skip: tuple[str, ...] = (), blocksize: int = 64,
                     compute_dtype: torch.dtype | None = None) -> list[str]:
    """Replace every ``nn.Linear`` in ``model`` by a :class:`Linear4bit`, in place, except those
    whose qualified name equals or ends with ``.``-separated ``skip`` entries (e.g. a task head).

    Returns the names replaced.
    """
    replaced = []
    for name, module in list(model.named_modules()):
        if not isinstance(module, nn.Linear) or name_matches(name, skip):
            continue
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child,
                Linear4bit.from_linear(module, blocksize, compute_dtype))
        replaced.append(name)
    return replaced


def name_matches(name: str, targets: tuple[str, ...]) -> bool:
    """True when the qualified module name ``name`` is one of ``targets`` or ends with
    ``"." + target`` (so "value" matches "layer.0.attention.value" but not "layer.0.novalue")."""
    return any(name == t or name.endswith("." + t) for t in targets)
