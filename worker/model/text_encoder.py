"""The acoustic text encoder: phoneme embeddings -> 3 x (conv, LayerNorm, LeakyReLU) -> BiLSTM."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from worker.model.layers import BiLSTM, LayerNorm, Span, WNConv1d, zero_padding


class TextEncoder(nn.Module):
    def __init__(self, channels: int, kernel_size: int, depth: int, n_symbols: int):
        super().__init__()
        self.embedding = nn.Embedding(n_symbols, channels)
        padding = (kernel_size - 1) // 2
        # Sequential (conv, norm, activation, dropout) only to keep the official names cnn.N.0/1.
        self.cnn = nn.ModuleList([
            nn.Sequential(WNConv1d(channels, channels, kernel_size, padding=padding), LayerNorm(channels),
                          nn.LeakyReLU(0.2), nn.Dropout(0.2))
            for _ in range(depth)
        ])
        self.lstm = BiLSTM(channels, channels // 2)

    def forward(self, ids: torch.Tensor, span: Span) -> torch.Tensor:
        """ids: [B, T] int64 -> [B, C, T], zero on padded tokens."""
        x = zero_padding(self.embedding(ids).transpose(1, 2), span)  # [B, C, T]
        for conv, norm, _, _ in self.cnn:
            x = zero_padding(F.leaky_relu(norm(conv(x)), 0.2), span)
        x = self.lstm.run(x.transpose(1, 2), span)  # [B, T, C]
        return zero_padding(x.transpose(1, 2), span)
