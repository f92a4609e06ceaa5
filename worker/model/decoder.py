"""The decoder: aligned features + F0 + energy -> waveform (iSTFTNet), all of it stage 2.

Time resolutions, for F frames of 600 samples: the decoder blocks run at F then 2F; the generator
upsamples 2F -> 20F -> 120F (+1 after its reflection pad) STFT frames of hop 5 -> 600F samples.
`FrameSpans` carries the valid length at each of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from worker.audio import SAMPLE_RATE
from worker.model.layers import (AdaINResBlock1, AdainResBlk1d, Span, WNConv1d, WNConvTranspose1d, time_major,
                                 zero_padding)


@dataclass
class FrameSpans:
    frames: Span  # F: decoder input, alignment
    frames2: Span  # 2F: F0 / energy curves, generator input
    up1: Span  # 20F: after the first generator upsampling
    stft: Span  # 120F + 1: STFT frames of the harmonic source and of the output
    samples: Span  # 600F: waveform samples (its positions run 20 further, for the STFT's reflect pad)


class SineSource(nn.Module):
    """The harmonic-plus-noise excitation (SourceModuleHnNSF) from the F0 curve.

    Follows the reference numerics step by step (phase accumulated at frame rate, then linearly
    interpolated to samples) so the same F0 gives the same sine bit for bit. The reference's
    random initial phase never reaches the output (the linear downsampling skips sample 0), so
    it is left out; the additive noise comes in as a tensor from a seeded generator (or None).
    """

    def __init__(self, upsample_scale: int, harmonic_num: int = 8, sine_amp: float = 0.1,
                 noise_std: float = 0.003, voiced_threshold: float = 10.0):
        super().__init__()
        self.upsample_scale = upsample_scale  # samples per F0 step (300)
        self.sine_amp, self.noise_std, self.voiced_threshold = sine_amp, noise_std, voiced_threshold
        self.harmonic_num = harmonic_num
        self.l_linear = nn.Linear(harmonic_num + 1, 1)
        self.make_buffers()

    def make_buffers(self) -> None:
        """The constant tensors, which no state dict holds (a model built on `meta` calls it again)."""
        self.register_buffer("harmonics", torch.arange(1, self.harmonic_num + 2, dtype=torch.float32), persistent=False)

    def forward(self, f0: torch.Tensor, noise: torch.Tensor | None, spans: FrameSpans) -> torch.Tensor:
        """f0: [B, 2F] Hz (float32), noise: [B, 600F, H] standard normal or None -> [B, 600F] float32."""
        rad = (f0.unsqueeze(-1) * self.harmonics / SAMPLE_RATE) % 1  # [B, 2F, H] cycles per sample
        phase = torch.cumsum(rad, dim=1) * 2 * torch.pi  # [B, 2F, H]
        if spans.frames2.index is not None:
            # Hold the last valid phase over the padding: the unpadded run clamps the interpolation
            # at its end, and this makes the padded run compute exactly the same samples there.
            hold = torch.minimum(spans.frames2.positions, spans.frames2.length.unsqueeze(-1) - 1)  # [B, 2F]
            phase = phase.gather(1, hold.unsqueeze(-1).expand(-1, -1, phase.shape[-1]))
        phase = F.interpolate(phase.transpose(1, 2) * self.upsample_scale, scale_factor=self.upsample_scale,
                              mode="linear").transpose(1, 2)  # [B, 600F, H]
        voiced = (f0 > self.voiced_threshold).float()
        voiced = F.interpolate(voiced.unsqueeze(1), scale_factor=self.upsample_scale).transpose(1, 2)  # [B, 600F, 1]
        sines = torch.sin(phase) * self.sine_amp * voiced
        if noise is not None:
            sines = sines + (voiced * self.noise_std + (1 - voiced) * (self.sine_amp / 3)) * noise
        w = self.l_linear.weight.float()
        b = self.l_linear.bias.float()
        return torch.tanh(F.linear(sines, w, b)).squeeze(-1)  # [B, 600F]


class STFT(nn.Module):
    """STFT / iSTFT with a periodic Hann window (n_fft 20, hop 5), center=True like torch.stft.

    The forward transform uses torch.stft on an explicitly reflect-padded signal (so a padded run
    reflects at the true end and frames match the reference's bit for bit). The inverse is a
    transposed convolution with the windowed inverse-DFT basis (overlap-add in one op), divided
    by the window envelope of the valid frames only.
    """

    def __init__(self, n_fft: int, hop: int):
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        self.make_buffers()

    def make_buffers(self) -> None:
        """The window and inverse-DFT basis, which no state dict holds (a model built on `meta`
        calls it again)."""
        n_fft = self.n_fft
        window = torch.hann_window(n_fft, periodic=True, dtype=torch.float64)
        n = torch.arange(n_fft, dtype=torch.float64)
        k = torch.arange(n_fft // 2 + 1, dtype=torch.float64)
        angle = 2 * math.pi * k[:, None] * n[None, :] / n_fft  # [K, N]
        weight = torch.full_like(k, 2.0)
        weight[0] = weight[-1] = 1.0  # DC and Nyquist appear once in the Hermitian sum
        real = weight[:, None] * torch.cos(angle) / n_fft
        imag = -weight[:, None] * torch.sin(angle) / n_fft
        imag[0] = imag[-1] = 0.0  # their imaginary parts are ignored by irfft
        basis = torch.cat([real, imag], dim=0) * window  # [2K, N]
        # the analysis window exactly as the reference builds it (float32 arithmetic)
        self.register_buffer("window", torch.hann_window(n_fft, periodic=True), persistent=False)
        self.register_buffer("inverse_basis", basis.float().unsqueeze(1), persistent=False)  # [2K, 1, N]
        self.register_buffer("window_sq", window.square().float().view(1, 1, -1), persistent=False)
        self.register_buffer("ones", torch.ones(1, 1, 1), persistent=False)

    def magnitude_phase(self, x: torch.Tensor, spans: FrameSpans) -> torch.Tensor:
        """x: [B, S] float32 -> [B, 2K, S / hop + 1] (magnitudes then phases)."""
        half = self.n_fft // 2
        if spans.samples.length is None:
            padded = F.pad(x.unsqueeze(1), (half, half), mode="reflect").squeeze(1)
        else:
            # reflect at each item's true end: position p of the padded signal reads |p - half|
            # mirrored at n - 1
            n = spans.samples.length.unsqueeze(-1)  # [B, 1]
            src = (spans.samples.positions[: x.shape[-1] + 2 * half] - half).abs()  # [S + 2 half]
            src = torch.where(src >= n, 2 * (n - 1) - src, src).clamp(min=0)  # [B, S + 2 half]
            padded = x.gather(1, src)
        spec = torch.stft(padded, self.n_fft, self.hop, self.n_fft, window=self.window, center=False,
                          return_complex=True)  # [B, K, frames]
        return torch.cat([spec.abs(), spec.angle()], dim=1)

    def inverse(self, magnitude: torch.Tensor, phase: torch.Tensor, span: Span) -> torch.Tensor:
        """magnitude, phase: [B, K, NF] -> [B, hop * (NF - 1)] float32."""
        coeffs = torch.cat([magnitude * torch.cos(phase), magnitude * torch.sin(phase)], dim=1)  # [B, 2K, NF]
        frames = self.ones.expand(1, 1, magnitude.shape[-1])
        if span.mask is not None:
            coeffs = coeffs * span.mask
            frames = span.mask.float()
        ola = F.conv_transpose1d(coeffs, self.inverse_basis, stride=self.hop)  # [B, 1, hop*(NF-1) + N]
        envelope = F.conv_transpose1d(frames, self.window_sq, stride=self.hop)  # [B or 1, 1, same]
        half = self.n_fft // 2
        length = self.hop * (magnitude.shape[-1] - 1)
        return (ola / envelope.clamp(min=1e-11))[:, 0, half:half + length]


class Generator(nn.Module):
    """iSTFTNet's generator: G channels at 2F, halved at each upsampling (official: G = 512 ->
    256 at 20F -> 128 at 120F + 1), then conv_post to the n_fft + 2 spectrum channels."""

    def __init__(self, style_dim: int, resblock_kernel_sizes, upsample_rates, upsample_initial_channel,
                 resblock_dilation_sizes, upsample_kernel_sizes, gen_istft_n_fft, gen_istft_hop_size):
        super().__init__()
        if upsample_initial_channel // 2 ** len(upsample_rates) < 1:
            raise ValueError(f"upsample_initial_channel {upsample_initial_channel} halves to 0 channels over "
                             f"{len(upsample_rates)} upsamplings")
        self.num_kernels = len(resblock_kernel_sizes)
        self.num_upsamples = len(upsample_rates)
        self.m_source = SineSource(upsample_scale=math.prod(upsample_rates) * gen_istft_hop_size)
        self.noise_convs = nn.ModuleList()
        self.noise_res = nn.ModuleList()
        self.ups = nn.ModuleList()
        for i, (u, k) in enumerate(zip(upsample_rates, upsample_kernel_sizes)):
            self.ups.append(WNConvTranspose1d(upsample_initial_channel // (2 ** i),
                                              upsample_initial_channel // (2 ** (i + 1)), k, u, padding=(k - u) // 2))
        self.resblocks = nn.ModuleList()
        for i in range(len(self.ups)):
            ch = upsample_initial_channel // (2 ** (i + 1))
            for k, d in zip(resblock_kernel_sizes, resblock_dilation_sizes):
                self.resblocks.append(AdaINResBlock1(ch, k, d, style_dim))
            if i + 1 < len(upsample_rates):
                stride_f0 = math.prod(upsample_rates[i + 1:])
                self.noise_convs.append(nn.Conv1d(gen_istft_n_fft + 2, ch, kernel_size=stride_f0 * 2,
                                                  stride=stride_f0, padding=(stride_f0 + 1) // 2))
                self.noise_res.append(AdaINResBlock1(ch, 7, (1, 3, 5), style_dim))
            else:
                self.noise_convs.append(nn.Conv1d(gen_istft_n_fft + 2, ch, kernel_size=1))
                self.noise_res.append(AdaINResBlock1(ch, 11, (1, 3, 5), style_dim))
        self.post_n_fft = gen_istft_n_fft
        self.conv_post = WNConv1d(ch, self.post_n_fft + 2, 7, 1, padding=3)
        self.stft = STFT(gen_istft_n_fft, gen_istft_hop_size)
        self.channels_last = False

    def use_channels_last(self) -> None:
        """CPU: run the resblocks and conv_post on time-major activations as channels-last convs
        (see WNConv1d.use_channels_last): the upsampled sequences are long, and oneDNN's reorders
        of them to its blocked layout and back cost as much as a convolution."""
        for m in self.modules():
            if isinstance(m, WNConv1d):
                m.use_channels_last()
        self.channels_last = True

    def forward(self, x: torch.Tensor, style: torch.Tensor, f0: torch.Tensor, noise: torch.Tensor | None,
                spans: FrameSpans) -> torch.Tensor:
        """x: [B, G, 2F], f0: [B, 2F] float32 -> waveform [B, 600F] float32."""
        source = self.m_source(f0, noise, spans)  # [B, 600F]
        har = self.stft.magnitude_phase(source, spans).to(x.dtype)  # [B, n_fft + 2, 120F + 1]
        har = zero_padding(har, spans.stft)
        up_spans = (spans.up1, spans.stft)
        in_span = spans.frames2
        dtype = har.dtype
        for i in range(self.num_upsamples):
            x = F.leaky_relu(x, 0.1).to(dtype)
            x_source = self.noise_res[i](self.noise_convs[i](har), style, up_spans[i])  # float32, like x below
            x = self.ups[i](zero_padding(x, in_span))  # [B, G / 2^(i+1), 20F] then [B, G / 4, 120F]
            if i == self.num_upsamples - 1:
                x = F.pad(x, (1, 0), mode="reflect")
            if self.channels_last:
                x = time_major(x)
            x = x + x_source
            del x_source  # one [B, G / 4, 120F] float32 activation less held through the resblocks
            xs = self.resblocks[i * self.num_kernels](x, style, up_spans[i])
            for j in range(1, self.num_kernels):
                out = self.resblocks[i * self.num_kernels + j](x, style, up_spans[i])
                xs = xs + out if torch.is_grad_enabled() else xs.add_(out)  # in place when serving: xs is ours
            x = xs / self.num_kernels
            in_span = up_spans[i]
        # conv_post stays float32: exp() of its output turns any rounding into spectral error
        x = self.conv_post(zero_padding(F.leaky_relu(x), spans.stft))  # [B, n_fft + 2, 120F + 1] float32
        bins = self.post_n_fft // 2 + 1
        return self.stft.inverse(torch.exp(x[:, :bins]), torch.sin(x[:, bins:]), spans.stft)


class Decoder(nn.Module):
    """Aligned text features (D = hidden_dim channels) + F0 + energy -> waveform.

    Channel sizes, official values in brackets: the encode/decode blocks run at H channels
    (`decoder_dim`, 1024), the text features enter them through a 1x1 `asr_res` convolution to R
    channels (`decoder_asr_res_dim`, 64), and the last (upsampling) block hands the generator G
    channels (`istftnet.upsample_initial_channel`, 512).
    """

    def __init__(self, dim_in: int, style_dim: int, dim_out: int, resblock_kernel_sizes, upsample_rates,
                 upsample_initial_channel, resblock_dilation_sizes, upsample_kernel_sizes,
                 gen_istft_n_fft, gen_istft_hop_size, hidden_dim: int = 1024, asr_res_dim: int = 64):
        super().__init__()
        D, H, R, G = dim_in, hidden_dim, asr_res_dim, upsample_initial_channel
        self.encode = AdainResBlk1d(D + 2, H, style_dim)
        self.decode = nn.ModuleList([
            AdainResBlk1d(H + 2 + R, H, style_dim),
            AdainResBlk1d(H + 2 + R, H, style_dim),
            AdainResBlk1d(H + 2 + R, H, style_dim),
            AdainResBlk1d(H + 2 + R, G, style_dim, upsample=True),
        ])
        self.F0_conv = WNConv1d(1, 1, kernel_size=3, stride=2, groups=1, padding=1)
        self.N_conv = WNConv1d(1, 1, kernel_size=3, stride=2, groups=1, padding=1)
        self.asr_res = nn.Sequential(WNConv1d(D, R, kernel_size=1))
        self.generator = Generator(style_dim, resblock_kernel_sizes, upsample_rates, upsample_initial_channel,
                                   resblock_dilation_sizes, upsample_kernel_sizes, gen_istft_n_fft, gen_istft_hop_size)

    def forward(self, asr: torch.Tensor, f0: torch.Tensor, energy: torch.Tensor, style: torch.Tensor,
                noise: torch.Tensor | None, spans: FrameSpans) -> torch.Tensor:
        """asr: [B, D, F], f0 / energy: [B, 2F] float32, style: [B, S] -> waveform [B, 600F] float32."""
        dtype = self.F0_conv.current_weight().dtype
        asr, style = asr.to(dtype), style.to(dtype)
        f0_down = self.F0_conv(f0.unsqueeze(1).to(dtype))  # [B, 1, F]
        energy_down = self.N_conv(energy.unsqueeze(1).to(dtype))  # [B, 1, F]
        x = self.encode(torch.cat([asr, f0_down, energy_down], dim=1), style, spans.frames)  # [B, H, F]
        asr_res = self.asr_res(asr)  # [B, R, F]
        for block in self.decode[:-1]:
            x = block(torch.cat([x, asr_res, f0_down, energy_down], dim=1), style, spans.frames)  # [B, H, F]
        x = self.decode[-1](torch.cat([x, asr_res, f0_down, energy_down], dim=1), style,
                            spans.frames, spans.frames2)  # [B, G, 2F]
        return self.generator(x, style, f0, noise, spans)
