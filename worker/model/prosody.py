"""The prosody predictor: durations per token (stage 1), F0 and energy per frame (stage 2).

F0 and energy are predicted at frame resolution, from the token features repeated by the
durations (the alignment), so they can only run once the frame count is known: they belong to
stage 2 even though their weights live here.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from worker.model.layers import AdaLayerNorm, AdainResBlk1d, BiLSTM, Span, zero_padding


class LinearNorm(nn.Module):
    """A Linear under the official name `linear_layer`."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.linear_layer = nn.Linear(in_dim, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_layer(x)


class DurationEncoder(nn.Module):
    """n_layers x (BiLSTM, AdaLayerNorm), the style appended to the features before each LSTM."""

    def __init__(self, style_dim: int, d_model: int, n_layers: int):
        super().__init__()
        self.lstms = nn.ModuleList()
        for _ in range(n_layers):
            self.lstms.append(BiLSTM(d_model + style_dim, d_model // 2))
            self.lstms.append(AdaLayerNorm(style_dim, d_model))

    def forward(self, x: torch.Tensor, style: torch.Tensor, span: Span) -> torch.Tensor:
        """x: [B, T, d_model], style: [B, S] -> [B, T, d_model + S], zero on padded tokens."""
        styles = style.unsqueeze(1).expand(-1, x.shape[1], -1)  # [B, T, S]
        mask = None if span.mask is None else span.mask.transpose(1, 2)  # [1, T, 1]

        def with_style(h: torch.Tensor) -> torch.Tensor:
            h = torch.cat([h, styles], dim=-1)
            return h if mask is None else h * mask

        x = with_style(x)
        for lstm, norm in zip(self.lstms[0::2], self.lstms[1::2]):
            x = with_style(norm(lstm.run(x, span), style))
        return x


class ProsodyPredictor(nn.Module):
    def __init__(self, style_dim: int, d_hid: int, n_layers: int, max_dur: int):
        super().__init__()
        self.text_encoder = DurationEncoder(style_dim, d_hid, n_layers)
        self.lstm = BiLSTM(d_hid + style_dim, d_hid // 2)
        self.duration_proj = LinearNorm(d_hid, max_dur)
        self.shared = BiLSTM(d_hid + style_dim, d_hid // 2)
        self.F0 = nn.ModuleList([
            AdainResBlk1d(d_hid, d_hid, style_dim),
            AdainResBlk1d(d_hid, d_hid // 2, style_dim, upsample=True),
            AdainResBlk1d(d_hid // 2, d_hid // 2, style_dim),
        ])
        self.N = nn.ModuleList([
            AdainResBlk1d(d_hid, d_hid, style_dim),
            AdainResBlk1d(d_hid, d_hid // 2, style_dim, upsample=True),
            AdainResBlk1d(d_hid // 2, d_hid // 2, style_dim),
        ])
        self.F0_proj = nn.Conv1d(d_hid // 2, 1, 1, 1, 0)
        self.N_proj = nn.Conv1d(d_hid // 2, 1, 1, 1, 0)

    def durations(self, d: torch.Tensor, speed: torch.Tensor, span: Span) -> torch.Tensor:
        """d: [B, T, d_hid + S] (DurationEncoder output), speed: [B] -> frames per token [B, T] int64.

        Padded tokens get 0 frames, so they vanish from the alignment.
        """
        logits = self.duration_proj(self.lstm.run(d, span))  # [B, T, max_dur]
        frames = torch.sigmoid(logits).sum(dim=-1) / speed.unsqueeze(-1)  # [B, T]
        frames = torch.round(frames).clamp(min=1).long()
        return frames if span.mask is None else frames * span.mask[:, 0].long()

    def f0_energy(self, en: torch.Tensor, style: torch.Tensor, frames: Span, frames2: Span) -> tuple[torch.Tensor, torch.Tensor]:
        """en: [B, F, d_hid + S] aligned features -> F0 and energy curves [B, 2F] (float32)."""
        x = self.shared.run(en, frames).transpose(1, 2)  # [B, d_hid, F]
        x = x.to(self.F0_proj.weight.dtype)
        style = style.to(x.dtype)
        curves = []
        for blocks, proj in ((self.F0, self.F0_proj), (self.N, self.N_proj)):
            h = blocks[0](x, style, frames)  # [B, d_hid, F]
            h = blocks[1](h, style, frames, frames2)  # [B, d_hid/2, 2F]
            h = blocks[2](h, style, frames2)
            curves.append(zero_padding(proj(h), frames2).squeeze(1).float())  # [B, 2F]
        return curves[0], curves[1]
