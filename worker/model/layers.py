"""Building blocks of Kokoro-82M, written for serving over padded, bucketed shapes.

Parameter names and shapes follow the official checkpoint (`kokoro-v1_0.pth`), so every component
loads with `strict=True`. Two things differ from a training-time implementation:

* Weight norm is kept as `weight_g` / `weight_v` until `fold()` replaces them with one plain
  `weight` (computed once with the same `torch._weight_norm` the checkpoint was trained with).
* Every layer that looks along time takes a `Span`: the true length of a padded sequence. With
  `Span.mask is None` (an unpadded run) the layers do exactly what the reference does; with a mask,
  statistics are taken over the valid part only, the padded part is zeroed before each convolution
  (so a kernel near the true end sees the zeros it would see in an unpadded run), and the backward
  direction of each BiLSTM starts at the true end.

Shapes in comments: B batch (chunks of different lengths, each with its own Span length), C channels,
T time steps of the bucket (the batch's longest item, or its bucket).
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

RSQRT2 = float(torch.rsqrt(torch.tensor(2.0)))  # the float32 value the reference multiplies by


@dataclass
class Span:
    """The valid prefix of a padded time axis.

    All fields are None on an unpadded run, where every layer behaves exactly as the reference.
    Each item of a batch has its own length (a single padded run is a batch of one):
    mask:      [B, 1, T] (compute dtype), 1 on valid steps.
    count:     [B, 1, 1] float32, the number of valid steps.
    length:    [B] int64, the same on device.
    positions: [T] int64, 0..T-1 (a slice of a preallocated arange).
    index:     [B, T] int64, per item a permutation that reverses the valid prefix and keeps the
               padding in place (for the backward LSTM direction).
    """

    mask: torch.Tensor | None = None
    count: torch.Tensor | None = None
    length: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    index: torch.Tensor | None = None

    @staticmethod
    def of(positions: torch.Tensor, length: torch.Tensor, dtype: torch.dtype) -> "Span":
        """positions: [T] arange (preallocated), length: [B] int64 on the same device."""
        last = length.unsqueeze(-1) - 1  # [B, 1]
        valid = positions <= last  # [B, T] bool, built on device
        index = torch.where(valid, last - positions, positions)  # [B, T]
        return Span(valid.to(dtype).unsqueeze(1), length.to(torch.float32).view(-1, 1, 1), length,
                    positions, index)

    def reverse(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, T, C] with each item's valid prefix reversed in place (its own inverse)."""
        return x.gather(1, self.index.unsqueeze(-1).expand(-1, -1, x.shape[-1]))


def zero_padding(x: torch.Tensor, span: Span) -> torch.Tensor:
    """x: [B, C, T]; zeroes the padded steps (identity on unpadded runs); keeps x's dtype."""
    return x if span.mask is None else x * span.mask.to(x.dtype)


def instance_stats(x: torch.Tensor, span: Span, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and 1/std over time of x [B, C, T], valid steps only: ([B, C, 1], [B, C, 1]) in float32."""
    if span.mask is None:
        if is_time_major(x):  # the kernels see contiguous [B, T, C] and reduce over T (dim 1)
            mean, rstd = kernels.stats(x.transpose(1, 2), eps, 1)
            return mean.transpose(1, 2), rstd.transpose(1, 2)
        return kernels.stats(x, eps, -1)
    else:
        xf = x.float()
        mask = span.mask.float()
        mean = (xf * mask).sum(-1, keepdim=True) / span.count
        var = ((xf - mean) * mask).square().sum(-1, keepdim=True) / span.count
    return mean, torch.rsqrt(var + eps)


# --- weight norm -------------------------------------------------------------------------------

class _WeightNorm:
    """Mixin: replaces `weight` by `weight_g` / `weight_v` (dim 0, the official layout)."""

    def _init_weight_norm(self) -> None:
        weight = self.weight.detach()
        del self.weight
        self.weight_g = nn.Parameter(torch.norm_except_dim(weight, 2, 0))
        self.weight_v = nn.Parameter(weight.clone())

    def current_weight(self) -> torch.Tensor:
        if "weight" in self._parameters:
            return self.weight
        return torch._weight_norm(self.weight_v, self.weight_g, 0)

    @torch.no_grad()
    def fold(self) -> None:
        """Compute the weight once (after loading) and drop g and v."""
        if "weight" in self._parameters:
            return
        weight = torch._weight_norm(self.weight_v, self.weight_g, 0)
        del self.weight_g, self.weight_v
        self.weight = nn.Parameter(weight, requires_grad=False)


def time_major(x: torch.Tensor) -> torch.Tensor:
    """x [B, C, T] stored time-major (memory [B, T, C], the same logical tensor); a no-op if it is."""
    return x if x.stride(1) == 1 else x.transpose(1, 2).contiguous().transpose(1, 2)


class WNConv1d(_WeightNorm, nn.Conv1d):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_weight_norm()
        self._weight_2d: torch.Tensor | None = None
        self._int8: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.int8_window = 0

    @torch.no_grad()
    def use_channels_last(self) -> None:
        """Convolve time-major input as a channels-last conv2d (after folding and moving; CPU).

        oneDNN then reads and writes the [T, C] memory as it is, instead of reordering input and
        output to its blocked layout and back on every call: about 1.5x faster on the generator's
        long sequences (measured with and without AVX-512). The weight is kept apart from the
        parameters, so the state dict keeps the official layout.
        """
        self._weight_2d = self.current_weight().unsqueeze(2).contiguous(memory_format=torch.channels_last)

    @torch.no_grad()
    def use_int8(self, levels: int, window: int) -> None:
        """Convolve int8 activations with int8 weights through oneDNN (CPU; after folding and moving).

        The weight is quantized per output channel, symmetric, to +-`levels`: 127, or 63 on a CPU
        without VNNI, whose int8 kernels (vpmaddubsw) add pairs of u8 x s8 products in 16 bits and
        would saturate beyond 7-bit weights. The input comes quantized per window of `window`
        output steps, each with its own scale and zero point (`styled_snake_int8`): see
        `int8_accumulate`. Kept apart from the parameters (the state dict keeps the official layout);
        the float copy for channels-last convs is dropped.
        """
        if self.stride[0] != 1 or self.padding[0] * 2 != self.dilation[0] * (self.kernel_size[0] - 1):
            raise ValueError("int8 convolutions here are stride-1 and 'same'-padded")
        weight = self.current_weight().float()
        scales = (weight.abs().amax(dim=(1, 2)) / levels).clamp(min=torch.finfo(torch.float32).tiny)
        q = torch.round(weight / scales[:, None, None]).clamp(-levels, levels)
        row_sums = scales * q.sum(dim=(1, 2))  # what a zero point of 1 adds to each output channel
        q = q.to(torch.int8).unsqueeze(2).contiguous(memory_format=torch.channels_last)
        packed = torch.ops.onednn.qconv_prepack(q, scales, 1.0, 0, [1, 1], [0, 0], [1, self.dilation[0]],
                                                self.groups, None)
        self._int8 = (packed, scales, torch.zeros(len(scales), dtype=torch.long), row_sums)
        self.int8_window = window
        self._weight_2d = None

    def int8_accumulate(self, q: torch.Tensor) -> torch.Tensor:
        """q: [B, N, W + 2 halo, C] uint8, N windows of the input with their halos (from
        `styled_snake_int8`) -> [B, N * W, C_out] float32: each window's integer sums times the
        weight scales, as if every window had scale 1 and zero point 0; `int8_output` applies
        the windows' own.

        One oneDNN call for all windows (the batch dimension): a window's scale and zero point
        are applied after the sums (y = scale * (sum - zero * row_sum) + bias), which is exact,
        and the windows' outputs lie in time order in memory, so nothing needs concatenating."""
        packed, w_scales, w_zero_points, _ = self._int8
        B, N, width, C = q.shape
        windows = q.view(B * N, width, C).transpose(1, 2).unsqueeze(2)  # [B N, C, 1, W + 2 halo] channels-last
        acc = torch.ops.onednn.qconv_pointwise(windows, 1.0, 0, packed, w_scales, w_zero_points, None, [1, 1],
                                               [0, 0], [1, self.dilation[0]], self.groups, 1.0, 0, torch.float32,
                                               "none", [], "")  # [B N, C_out, 1, W] channels-last
        return acc.squeeze(2).transpose(1, 2).view(B, -1, acc.shape[1])  # the same memory, [B, N W, C_out]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._weight_2d is not None and x.shape[1] > 1 and x.stride(1) == 1:
            return F.conv2d(x.unsqueeze(2), self._weight_2d, self.bias, (1, self.stride[0]), (0, self.padding[0]),
                            (1, self.dilation[0]), self.groups).squeeze(2)
        return self._conv_forward(x, self.current_weight(), self.bias)


class WNConvTranspose1d(_WeightNorm, nn.ConvTranspose1d):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_weight_norm()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv_transpose1d(x, self.current_weight(), self.bias, self.stride, self.padding,
                                  self.output_padding, self.groups, self.dilation)


def fold_weight_norm(module: nn.Module) -> None:
    for m in module.modules():
        if isinstance(m, _WeightNorm):
            m.fold()


# --- recurrent ---------------------------------------------------------------------------------

class BiLSTM(nn.LSTM):
    """A one-layer bidirectional `nn.LSTM` (official parameter names) that runs over padded input.

    Unpadded: the stock bidirectional call. Padded: the forward direction runs as is (its outputs
    on the valid prefix never see the padding); the backward direction runs its own weights forward
    over the valid prefix reversed in place by a device-side gather (`Span.index`), and the result
    is gathered back. No lengths leave the device (pack_padded_sequence would need them on the CPU).
    """

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__(input_size, hidden_size, num_layers=1, batch_first=True, bidirectional=True)
        self._directions: tuple[nn.LSTM, nn.LSTM] | None = None

    def split_directions(self) -> None:
        """Build one-direction LSTMs sharing this module's weights (after loading and moving).

        They live outside the module tree so the state dict keeps the official names; cuDNN gets
        flat weights per direction instead of compacting them on every call.
        """
        directions = []
        for suffix in ("", "_reverse"):
            lstm = nn.LSTM(self.input_size, self.hidden_size, num_layers=1, batch_first=True,
                           device=self.weight_ih_l0.device, dtype=self.weight_ih_l0.dtype)
            for name in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"):
                getattr(lstm, name).data = getattr(self, name + suffix).data
            lstm.flatten_parameters()
            lstm.requires_grad_(False)
            directions.append(lstm)
        self.flatten_parameters()
        self._directions = (directions[0], directions[1])

    def run(self, x: torch.Tensor, span: Span) -> torch.Tensor:
        """x: [B, T, C_in] -> [B, T, 2H]."""
        if span.index is None:
            return super().forward(x)[0]
        if self._directions is None:
            self.split_directions()
        forward, backward = self._directions
        ahead = forward(x)[0]  # [B, T, H]
        # each item's backward pass starts at its own true end
        behind = span.reverse(backward(span.reverse(x))[0])  # [B, T, H]
        return torch.cat([ahead, behind], dim=-1)


# --- normalization -----------------------------------------------------------------------------

class LayerNorm(nn.Module):
    """LayerNorm over channels of a [B, C, T] tensor (parameters `gamma`, `beta`)."""

    def __init__(self, channels: int, eps: float = 1e-5):
        super().__init__()
        self.channels, self.eps = channels, eps
        self.gamma = nn.Parameter(torch.ones(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.transpose(1, -1), (self.channels,), self.gamma, self.beta, self.eps).transpose(1, -1)


class AdaLayerNorm(nn.Module):
    """Style-conditioned LayerNorm over channels of a [B, T, C] tensor."""

    def __init__(self, style_dim: int, channels: int, eps: float = 1e-5):
        super().__init__()
        self.channels, self.eps = channels, eps
        self.fc = nn.Linear(style_dim, channels * 2)

    def forward(self, x: torch.Tensor, style: torch.Tensor) -> torch.Tensor:
        gamma, beta = self.fc(style).unsqueeze(1).chunk(2, dim=-1)  # [B, 1, C] each
        return (1 + gamma) * F.layer_norm(x, (self.channels,), eps=self.eps) + beta


class AdaIN1d(nn.Module):
    """Style-conditioned instance norm of [B, C, T]: (1 + gamma(s)) * IN(x) + beta(s).

    The released weights have no InstanceNorm affine parameters (trained with affine=False; the
    reference adds identity ones for its ONNX export), so neither do we. The whole thing folds into
    one per-channel scale and shift, so applying it is a single multiply-add pass over x (fused
    with the activation by the callers).
    """

    def __init__(self, style_dim: int, channels: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.fc = nn.Linear(style_dim, channels * 2)

    def scale_shift(self, x: torch.Tensor, style: torch.Tensor, span: Span,
                    moments: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [B, C, T] -> scale, shift: [B, C, 1] in x's dtype. moments: x's mean and variance over
        time ([B, C, 1] float32 each) when the kernel that wrote x computed them (`int8_conv`)."""
        if moments is None:
            mean, rstd = instance_stats(x, span, self.eps)  # [B, C, 1] float32
        else:
            mean, rstd = moments[0], torch.rsqrt(moments[1] + self.eps)
        gamma, beta = self.fc(style).float().unsqueeze(-1).chunk(2, dim=1)  # [B, C, 1]
        scale = (1 + gamma) * rstd
        return scale.to(x.dtype), (beta - scale * mean).to(x.dtype)

    def forward(self, x: torch.Tensor, style: torch.Tensor, span: Span) -> torch.Tensor:
        scale, shift = self.scale_shift(x, style, span)
        return torch.addcmul(shift, x, scale)

    def reference_forward(self, x: torch.Tensor, style: torch.Tensor) -> torch.Tensor:
        """The reference's exact float32 arithmetic (unpadded runs of the F0 path; see AdainResBlk1d)."""
        gamma, beta = self.fc(style).unsqueeze(-1).chunk(2, dim=1)  # [B, C, 1]
        return (1 + gamma) * F.instance_norm(x, eps=self.eps) + beta


# --- fused elementwise steps -------------------------------------------------------------------
# Small pure functions over whole activations: in eager mode each is a few passes over memory;
# `use_compiled_kernels()` swaps in torch.compile'd versions (one pass each, float32 inside, one
# rounding at the end), which on CPU halves the decoder's time outside the convolutions.

def _stats(x: torch.Tensor, eps: float, dim: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and 1/std over the time axis `dim`, float32: [B, C, T] -> [B, C, 1] twice (dim -1), or
    [B, T, C] -> [B, 1, C] (dim 1)."""
    var, mean = torch.var_mean(x.float(), dim=dim, keepdim=True, correction=0)  # one pass (Welford) when compiled
    return mean, torch.rsqrt(var + eps)


def _styled_leaky_relu(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, slope: float) -> torch.Tensor:
    """leaky_relu(x * scale + shift)."""
    return F.leaky_relu(torch.addcmul(shift, x, scale), slope)


def _styled_snake(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor,
                  alpha: torch.Tensor, inv_alpha: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Snake1D of the AdaIN output, y + sin(alpha * y)^2 / alpha with y = x * scale + shift, in dtype."""
    y = torch.addcmul(shift, x, scale)
    return torch.addcmul(y, torch.sin(y * alpha).square_(), inv_alpha).to(dtype)


def _styled_snake_int8(x, scale, shift, alpha, inv_alpha, mask, window: int, halo: int):
    """The Snake of the AdaIN output (as `_styled_snake`, float32), zeroed where mask is 0, cut
    into windows of `window` steps with `halo` steps either side (halo <= window; zeros beyond
    the ends: the convolution's own padding) and quantized per window for an int8 convolution.

    x, scale, shift, alpha, inv_alpha, mask (or None): [B, T, C]-shaped (broadcast) ->
    (uint8 [B, N, window + 2 halo, C], scale [B, N], zero point [B, N] (float32, integer-valued)).
    A window's range is that of its own steps and its two neighbours' (which hold its halo), so
    quiet stretches (pauses, soft sounds) are not quantized as coarsely as the loudest one; the
    range always holds 0, so 0 is exact.
    """
    y = x.float() * scale.float() + shift.float()
    y = y + torch.sin(y * alpha.float()).square() * inv_alpha.float()
    if mask is not None:
        y = y * mask
    B, steps, C = y.shape
    n = (steps + window - 1) // window
    y = F.pad(y, (0, 0, halo, n * window - steps + halo))  # [B, halo + N window + halo, C]
    core = y[:, halo:halo + n * window].reshape(B, n, window * C)
    lo = F.pad(core.amin(dim=2).clamp(max=0.0), (1, 1))  # [B, N + 2]: a zero either side
    hi = F.pad(core.amax(dim=2).clamp(min=0.0), (1, 1))
    lo = torch.minimum(torch.minimum(lo[:, :-2], lo[:, 1:-1]), lo[:, 2:])  # [B, N]
    hi = torch.maximum(torch.maximum(hi[:, :-2], hi[:, 1:-1]), hi[:, 2:])
    step = ((hi - lo) / 255.0).clamp(min=1e-12)
    zero = torch.round(-lo / step)
    windows = y.unfold(1, window + 2 * halo, window).transpose(2, 3)  # [B, N, window + 2 halo, C]
    q = (torch.round(windows / step[..., None, None]) + zero[..., None, None]).clamp(0.0, 255.0)
    return q.to(torch.uint8).contiguous(), step, zero


def _int8_output(acc, step, zero, row_sums, bias, residual, steps: int):
    """A window-quantized convolution's float output from its integer sums (`int8_accumulate`),
    with its mean and variance over time (what the next AdaIN needs, in the same pass):
    acc [B, N W, C] (N windows of W steps), step / zero [B, N], row_sums / bias [C], residual
    [B, T, C] or None, steps: T (<= N W) -> [B, T, C] float32 (plus the residual), mean and
    variance [B, 1, C]."""
    B, padded, C = acc.shape
    N = step.shape[1]
    y = acc.view(B, N, padded // N, C) - zero[:, :, None, None] * row_sums
    y = (y * step[:, :, None, None] + bias).view(B, padded, C)[:, :steps]
    if residual is not None:
        y = y + residual
    var, mean = torch.var_mean(y, dim=1, keepdim=True, correction=0)
    return y, mean, var


def _styled_snake_f32(x, scale, shift, alpha, inv_alpha, dtype: torch.dtype):
    y = x.float() * scale.float() + shift.float()
    return (y + torch.sin(y * alpha.float()).square() * inv_alpha.float()).to(dtype)


def _styled_leaky_relu_f32(x, scale, shift, slope: float):
    return F.leaky_relu(x.float() * scale.float() + shift.float(), slope).to(x.dtype)


class _Kernels:
    """The elementwise kernels a thread's syntheses call: eager or fused, chosen per thread, so a
    replica can serve with the eager ones in its inference thread while another thread compiles
    the fused ones (worker/engine.py, `Engine.compile_kernels`)."""

    def __init__(self):
        self._fused: tuple | None = None
        self._eager = (_stats, _styled_snake, _styled_leaky_relu, _styled_snake_int8, _int8_output)
        self._choice = threading.local()
        self.broken = False

    @property
    def compiled(self) -> bool:
        """Whether the calling thread runs the fused kernels."""
        return getattr(self._choice, "compiled", False) and not self.broken

    def _current(self) -> tuple:
        if torch.compiler.is_compiling():  # traced into a compiled pass: inductor fuses these itself
            return self._eager
        return self._fused if self.compiled else self._eager

    stats = property(lambda self: self._current()[0])
    snake = property(lambda self: self._current()[1])
    leaky_relu = property(lambda self: self._current()[2])
    snake_int8 = property(lambda self: self._current()[3])
    int8_output = property(lambda self: self._current()[4])

    def use_eager(self) -> None:
        self._choice.compiled = False

    def use_compiled(self) -> None:
        if self.broken:
            return
        if self._fused is None:  # built once; switching back and forth costs nothing
            self._fused = (self._compiled(_stats, "stats"), self._compiled(_styled_snake_f32, "snake"),
                           self._compiled(_styled_leaky_relu_f32, "leaky_relu"),
                           self._compiled(_styled_snake_int8, "snake_int8"),
                           self._compiled(_int8_output, "int8_output"))
        self._choice.compiled = True

    def _compiled(self, fn, name: str):
        """torch.compile'd fn; if compiling fails (no C++ compiler, say), every kernel goes back
        to eager for good, in every thread, with one warning, instead of failing the synthesis."""
        compiled = torch.compile(fn, dynamic=True, fullgraph=True)

        def call(*args):
            if self.broken:
                return getattr(_EAGER, name)(*args)
            if not getattr(_THREAD, "recompile_limit_raised", False):
                # Each kernel is specialized per channel count, dtype and grad mode: a model has a
                # handful of each, a process that also builds the tiny test model more. Past
                # dynamo's default of 8 variants fullgraph fails, and every kernel would fall back
                # to eager for good. The setting is per thread (syntheses run in worker threads).
                torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
                _THREAD.recompile_limit_raised = True
            try:
                return compiled(*args)
            except Exception as error:  # noqa: BLE001 - any compiler failure means: run eagerly
                warnings.warn(f"fused kernels unavailable ({type(error).__name__}: {error}); running eagerly")
                self.broken = True
                return getattr(_EAGER, name)(*args)

        return call


_THREAD = threading.local()
_EAGER = type("_Eager", (), {"stats": staticmethod(_stats), "snake": staticmethod(_styled_snake),
                              "leaky_relu": staticmethod(_styled_leaky_relu),
                              "snake_int8": staticmethod(_styled_snake_int8),
                              "int8_output": staticmethod(_int8_output)})
kernels = _Kernels()


def use_compiled_kernels(enabled: bool = True) -> None:
    """For the calling thread: fused (torch.compile) elementwise kernels for eager runs on CPU (each
    Engine sets its choice before each synthesis).
    The first call of each costs a compile (half a minute or more; cached on disk afterwards)."""
    kernels.use_compiled() if enabled else kernels.use_eager()


def is_time_major(x: torch.Tensor) -> bool:
    """x [B, C, T] stored as [B, T, C] (see `time_major`)."""
    return x.dim() == 3 and x.shape[1] > 1 and x.shape[2] > 1 and x.stride(1) == 1


def styled_leaky_relu(x, scale, shift, slope: float) -> torch.Tensor:
    return kernels.leaky_relu(x, scale, shift, slope)


def styled_snake(x, scale, shift, alpha, inv_alpha, dtype: torch.dtype) -> torch.Tensor:
    if is_time_major(x):
        # The compiled kernels get contiguous [B, T, C] operands (they are compiled for dense
        # layouts; a transposed view is one), and the result goes back as a time-major view.
        t = lambda a: a.transpose(1, 2)  # noqa: E731
        return t(kernels.snake(t(x), t(scale), t(shift), t(alpha), t(inv_alpha), dtype))
    return kernels.snake(x, scale, shift, alpha, inv_alpha, dtype)


def int8_conv(x, scale, shift, alpha, inv_alpha, span: Span, conv: "WNConv1d",
              residual: torch.Tensor | None = None) -> tuple[torch.Tensor, tuple | None]:
    """conv(Snake(AdaIN(x))) (+ residual) with an int8 convolution (`WNConv1d.use_int8`): x,
    residual [B, C, T] time-major -> ([B, C_out, T] float32 time-major, its mean and variance
    over time [B, C_out, 1] for the next AdaIN, or None on a padded run, whose statistics cover
    each item's valid steps only).

    The Snake output is quantized per window of the conv's `int8_window` output steps with the
    halo of inputs they read (zeros beyond the ends and on padding), each window with its own
    scale and zero point, so quiet stretches keep their precision."""
    t = lambda a: a.transpose(1, 2)  # noqa: E731  (contiguous [B, T, C] operands, as styled_snake)
    mask = None if span.mask is None else t(span.mask).float()
    q, step, zero = kernels.snake_int8(t(x), t(scale), t(shift), t(alpha), t(inv_alpha), mask, conv.int8_window,
                                       conv.padding[0])
    acc = conv.int8_accumulate(q)
    _, _, _, row_sums = conv._int8
    bias = conv.bias if conv.bias is not None else torch.zeros_like(row_sums)
    y, mean, var = kernels.int8_output(acc, step, zero, row_sums, bias, None if residual is None else t(residual),
                                       x.shape[-1])
    return t(y), (None if span.mask is not None else (t(mean), t(var)))


# --- residual blocks ---------------------------------------------------------------------------

class AdainResBlk1d(nn.Module):
    """StyleTTS2's AdainResBlk1d (prosody predictor and decoder), optional 2x upsampling."""

    def __init__(self, dim_in: int, dim_out: int, style_dim: int, upsample: bool = False):
        super().__init__()
        self.upsample = upsample
        self.learned_sc = dim_in != dim_out
        self.conv1 = WNConv1d(dim_in, dim_out, 3, 1, 1)
        self.conv2 = WNConv1d(dim_out, dim_out, 3, 1, 1)
        self.norm1 = AdaIN1d(style_dim, dim_in)
        self.norm2 = AdaIN1d(style_dim, dim_out)
        if self.learned_sc:
            self.conv1x1 = WNConv1d(dim_in, dim_out, 1, 1, 0, bias=False)
        if upsample:  # depthwise transposed conv: T -> 2T
            self.pool = WNConvTranspose1d(dim_in, dim_in, kernel_size=3, stride=2, groups=dim_in,
                                          padding=1, output_padding=1)

    def forward(self, x: torch.Tensor, style: torch.Tensor, span: Span, span_out: Span | None = None) -> torch.Tensor:
        """x: [B, C_in, T] -> [B, C_out, T_out] (T_out = 2T when upsampling; span_out its span).

        Unpadded float32 runs use the reference's exact arithmetic for the norms: the F0 curve
        comes out of these blocks, and the harmonic source built from it is chaotic in the last
        bits (a 1e-7 relative change of F0 moves the reference's own output by ~30 dB SNR:
        the phases of near-empty STFT bins flip), so parity needs F0 bit for bit.
        """
        span_out = span if span_out is None else span_out
        exact = span.mask is None and x.dtype == torch.float32
        if exact:
            h = F.leaky_relu(self.norm1.reference_forward(x, style), 0.2)
        else:
            h = styled_leaky_relu(x, *self.norm1.scale_shift(x, style, span), 0.2)
        if self.upsample:
            h = self.pool(zero_padding(h, span))  # [B, C_in, 2T]
        h = self.conv1(zero_padding(h, span_out))
        if exact:
            h = F.leaky_relu(self.norm2.reference_forward(h, style), 0.2)
        else:
            h = styled_leaky_relu(h, *self.norm2.scale_shift(h, style, span_out), 0.2)
        h = self.conv2(zero_padding(h, span_out))

        shortcut = F.interpolate(x, scale_factor=2.0, mode="nearest") if self.upsample else x
        if self.learned_sc:
            shortcut = self.conv1x1(shortcut)
        return (h + shortcut) * RSQRT2


class AdaINResBlock1(nn.Module):
    """iSTFTNet's resblock: three dilated conv pairs with AdaIN + Snake, residual each."""

    def __init__(self, channels: int, kernel_size: int, dilation: tuple[int, ...], style_dim: int):
        super().__init__()

        def conv(d: int) -> WNConv1d:
            return WNConv1d(channels, channels, kernel_size, 1, dilation=d, padding=(kernel_size - 1) * d // 2)

        self.convs1 = nn.ModuleList([conv(d) for d in dilation])
        self.convs2 = nn.ModuleList([conv(1) for _ in dilation])
        self.adain1 = nn.ModuleList([AdaIN1d(style_dim, channels) for _ in dilation])
        self.adain2 = nn.ModuleList([AdaIN1d(style_dim, channels) for _ in dilation])
        self.alpha1 = nn.ParameterList([nn.Parameter(torch.ones(1, channels, 1)) for _ in dilation])
        self.alpha2 = nn.ParameterList([nn.Parameter(torch.ones(1, channels, 1)) for _ in dilation])
        self._inverse_alpha: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None

    @torch.no_grad()
    def cache_inverse_alpha(self) -> None:
        """1 / alpha once (after loading and moving), not per call."""
        self._inverse_alpha = ([1.0 / a for a in self.alpha1], [1.0 / a for a in self.alpha2])

    def forward(self, x: torch.Tensor, style: torch.Tensor, span: Span) -> torch.Tensor:
        """x: [B, C, T] -> [B, C, T] float32.

        The residual stream stays float32 whatever the convolutions' precision: with bf16 convs,
        rounding it at every one of the 6 residual adds per block is what costs the most accuracy.
        """
        dtype = self.convs1[0].current_weight().dtype
        x = x.float()
        if self.convs1[0]._weight_2d is not None or self.convs1[0]._int8 is not None:
            x = time_major(x)
        if self._inverse_alpha is None:
            inv1, inv2 = [1.0 / a for a in self.alpha1], [1.0 / a for a in self.alpha2]
        else:
            inv1, inv2 = self._inverse_alpha
        moments = None  # x's mean and variance over time, when the int8 path computed them with x
        owned = False  # whether x is this block's own (after the first residual add), not the caller's
        for c1, c2, n1, n2, a1, a2, i1, i2 in zip(self.convs1, self.convs2, self.adain1, self.adain2,
                                                  self.alpha1, self.alpha2, inv1, inv2):
            if c1._int8 is not None:  # int8 mode (CPU): each conv reads its input quantized per window
                h, h_moments = int8_conv(x, *n1.scale_shift(x, style, span, moments), a1, i1, span, c1)
                x, moments = int8_conv(h, *n2.scale_shift(h, style, span, h_moments), a2, i2, span, c2, residual=x)
                continue
            h = styled_snake(x, *n1.scale_shift(x, style, span), a1, i1, dtype)
            h = c1(zero_padding(h, span))
            h = styled_snake(h, *n2.scale_shift(h, style, span), a2, i2, dtype)
            h = c2(zero_padding(h, span))
            # in place once x is ours: the long [B, C, 120F] float32 stream is not held twice (not
            # under autograd, which needs it: a voice fit's gradient, worker/voice_fit/gradient.py)
            x = x.add_(h) if owned else h + x
            owned = not torch.is_grad_enabled()
        return x
