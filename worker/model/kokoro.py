"""Kokoro-82M: PL-BERT -> prosody predictor -> alignment -> iSTFTNet decoder, split for serving.

The forward is two pure functions around the one data-dependent number, the total frame count:

    stage1(ids, n_tokens, style, speed) -> durations [1, T], features [1, T, D + S + D]
        PL-BERT, the duration encoder and the durations; the acoustic text encoder.
    (the caller reads durations.sum() once: the only device-to-host sync of a synthesis)
    stage2(durations, features, n_frames, frames, style, noise) -> waveform [1, 600 * frames]
        alignment (built on device), F0 and energy (frame resolution, so here), the decoder.

D is the text channel count (`hidden_dim`, 512 in Kokoro-82M) and S the prosody style width
(`style_dim`, 128; a voice row is [2S] = [256]), so features are 1152 wide in Kokoro-82M.

Both take padded shapes: a bucket of T tokens holding n_tokens real ones, a bucket of `frames`
frames holding n_frames real ones; padding is masked or trimmed so a padded run computes the same
waveform as an unpadded one. Pass n_tokens / n_frames = None for an unpadded run (batch of one):
then every layer does exactly what the reference KModel does.

A batch is B chunks of different lengths padded to the longest (or its bucket), with n_tokens,
n_frames, speed [B] per item: every statistic over time, both LSTM directions, attention, the
alignment, the excitation source and every convolution edge see each item's own valid prefix only,
so each item computes what its single run computes (to float rounding; the shapes differ).
"""

from __future__ import annotations

import torch
import torch.nn as nn
from transformers import AlbertConfig, AlbertModel

from worker.audio import SAMPLES_PER_FRAME
from worker.model.decoder import Decoder, FrameSpans
from worker.model.layers import AdaINResBlock1, BiLSTM, Span, fold_weight_norm
from worker.model.prosody import ProsodyPredictor
from worker.model.text_encoder import TextEncoder

COMPONENTS = ("bert", "bert_encoder", "predictor", "text_encoder", "decoder")


class KokoroModel(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        self.config = config
        albert = AlbertConfig(vocab_size=config["n_token"], **config["plbert"])
        albert._attn_implementation = "sdpa"
        self.bert = AlbertModel(albert)
        self.bert_encoder = nn.Linear(albert.hidden_size, config["hidden_dim"])
        self.predictor = ProsodyPredictor(config["style_dim"], config["hidden_dim"], config["n_layer"], config["max_dur"])
        self.text_encoder = TextEncoder(config["hidden_dim"], config["text_encoder_kernel_size"], config["n_layer"],
                                        config["n_token"])
        # decoder_dim / decoder_asr_res_dim: optional keys (absent from the official config.json,
        # whose decoder has them as 1024 / 64 in code); the tiny config shrinks them.
        self.decoder = Decoder(dim_in=config["hidden_dim"], style_dim=config["style_dim"], dim_out=config["n_mels"],
                               hidden_dim=config.get("decoder_dim", 1024),
                               asr_res_dim=config.get("decoder_asr_res_dim", 64), **config["istftnet"])
        self.max_tokens = albert.max_position_embeddings
        self.style_dim = config["style_dim"]
        self.hidden_dim = config["hidden_dim"]
        self.decoder_dtype = torch.float32
        self.compiled_decode = None  # `decode` compiled, once `use_compiled_decode()` runs
        self.register_buffer("_arange", torch.arange(albert.max_position_embeddings), persistent=False)

    # --- set-up ----------------------------------------------------------------------------------

    @classmethod
    def on_meta(cls, config: dict) -> "KokoroModel":
        """The model with every tensor on the `meta` device: no memory, no random init. Loading a
        state dict with `assign=True` then makes the model's parameters the loaded tensors
        themselves (memory-mapped file pages stay shared between processes);
        `make_buffers()` computes the constants no state dict holds."""
        with torch.device("meta"):
            return cls(config)

    def load_components(self, state_dict: dict[str, dict[str, torch.Tensor]], assign: bool = False) -> None:
        """Load per-component state dicts strictly: the official names (weight norm as `weight_g` /
        `weight_v`), or the serving layout once `fold()` has run."""
        missing = [c for c in COMPONENTS if c not in state_dict]
        if missing:
            raise KeyError(f"state dict lacks component(s) {missing}; has {sorted(state_dict)}")
        for name in COMPONENTS:
            getattr(self, name).load_state_dict(state_dict[name], strict=True, assign=assign)

    def components_state_dict(self) -> dict[str, dict[str, torch.Tensor]]:
        return {name: getattr(self, name).state_dict() for name in COMPONENTS}

    @torch.no_grad()
    def fold(self, decoder_dtype: torch.dtype = torch.float32) -> "KokoroModel":
        """Turn the parameters into the ones served: weight norm folded into plain weights, the
        decoder's convolutions cast to `decoder_dtype`. Stage 1 and the F0/energy predictor stay
        float32 (they decide durations and pitch, and cost little); the decoder's excitation
        source, STFTs, last convolution and the generator's residual stream stay float32.
        On a `meta` model it changes the structure only, so a folded state dict loads into it."""
        fold_weight_norm(self)
        self.decoder.to(decoder_dtype)
        self.decoder.generator.m_source.float()
        self.decoder.generator.stft.float()
        self.decoder.generator.conv_post.float()
        self.decoder_dtype = decoder_dtype
        return self

    def make_buffers(self) -> None:
        """(Re)compute the non-persistent buffers on the CPU: after a `meta` build they have no values."""
        for module in self.modules():
            if module is not self and hasattr(module, "make_buffers"):
                module.make_buffers()
        embeddings = self.bert.embeddings
        positions = torch.arange(embeddings.position_ids.shape[-1]).expand((1, -1))
        embeddings.register_buffer("position_ids", positions, persistent=False)
        embeddings.register_buffer("token_type_ids", torch.zeros(positions.shape, dtype=torch.long), persistent=False)
        self.register_buffer("_arange", torch.arange(self._arange.numel()), persistent=False)

    @classmethod
    def for_serving(cls, config: dict, folded_state_dict: dict[str, dict[str, torch.Tensor]],
                    decoder_dtype: torch.dtype, device: str | torch.device = "cpu") -> "KokoroModel":
        """A model ready to serve whose parameters are the tensors of `folded_state_dict` (the
        output of `fold(decoder_dtype).components_state_dict()`), not copies of them: with a
        memory-mapped state dict on the CPU, every process serving from the same file shares
        its pages."""
        model = cls.on_meta(config)
        # Buffers first, so that fold() casts them exactly as it does those of a model built on the
        # CPU: the same arithmetic, bit for bit, whichever way the model was built.
        model.make_buffers()
        model.fold(decoder_dtype)
        model.load_components(folded_state_dict, assign=True)
        on_meta = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
        if on_meta:
            raise RuntimeError(f"tensors left on the meta device after loading: {on_meta[:5]}")
        return model.finish(device)

    @torch.no_grad()
    def prepare(self, device: str | torch.device = "cpu", decoder_dtype: torch.dtype = torch.float32) -> "KokoroModel":
        """Make a model loaded with the official names ready to serve: folded (see `fold`), moved."""
        return self.fold(decoder_dtype).finish(device)

    @torch.no_grad()
    def finish(self, device: str | torch.device) -> "KokoroModel":
        """eval, no gradients, moved to `device`, per-layer caches built."""
        self.eval().requires_grad_(False)
        self.to(device)
        if torch.device(device).type == "cpu":
            self.decoder.generator.use_channels_last()
        for m in self.modules():
            if isinstance(m, BiLSTM):
                m.split_directions()
            if isinstance(m, AdaINResBlock1):
                m.cache_inverse_alpha()
        return self

    @torch.no_grad()
    def use_int8(self, levels: int = 127, window: int = 600) -> "KokoroModel":
        """CPU: the generator's residual blocks (resblocks and noise_res, about three quarters of
        a float32 synthesis) convolve in int8: weights per output channel to +-`levels` (see
        WNConv1d.use_int8), activations quantized per `window` steps, each window (with the halo
        its outputs read) with its own scale, per item of a batch (layers.int8_conv). Everything
        else, stage 1 (durations) and F0 included, stays as it is (float32 with a float32
        decoder). The parameters and their names are untouched: the int8 weights live beside them.

        Window size: log-spectral distance to float32 on the real weights, 100-phoneme chunk,
        with one scale per tensor (kokoro-onnx's dynamic quantization) 1.64 dB (the bound is 1),
        per 2400 steps 0.71, per 600 steps 0.53-0.64, per 120 steps 0.46; at 120 frames' rate
        the generator's last stage runs 72,000 steps for a 250-phoneme chunk."""
        for m in self.decoder.generator.modules():
            if isinstance(m, AdaINResBlock1):
                for conv in [*m.convs1, *m.convs2]:
                    conv.use_int8(levels, window)
        return self

    def positions(self, n: int) -> torch.Tensor:
        """0..n-1 as a slice of one preallocated arange (grown here, never inside a CUDA graph:
        the engine reserves the largest bucket before capturing)."""
        if self._arange.numel() < n:
            self._arange = torch.arange(max(n, 2 * self._arange.numel()), device=self._arange.device)
        return self._arange[:n]

    # --- stage 1: tokens -> durations + features ---------------------------------------------------

    def stage1(self, ids: torch.Tensor, n_tokens: torch.Tensor | None, style: torch.Tensor,
               speed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ids: [B, T] int64 (boundary pads included; token 0 after n_tokens), n_tokens: [B] int64 or
        None (unpadded; B = 1), style: [B, 2S], speed: [B] float32.

        Returns durations [B, T] int64 (frames per token, 0 on padding) and features [B, T, D + S + D]
        (duration-encoder output D + S ++ acoustic text encoder D), which stage 2 aligns to frames.
        """
        B, T = ids.shape
        positions = self.positions(T)
        span = Span() if n_tokens is None else Span.of(positions, n_tokens, torch.float32)

        # PL-BERT: padded keys are masked out of attention (additive mask), padded queries ignored.
        attention = None
        if span.mask is not None:
            attention = ((1.0 - span.mask) * torch.finfo(torch.float32).min).view(B, 1, 1, T)
        token_types = self.bert.embeddings.token_type_ids[:, :T]  # zeros, preallocated by transformers
        h = self.bert.embeddings(ids, token_type_ids=token_types, position_ids=positions.unsqueeze(0))
        h = self.bert.encoder(h, attention).last_hidden_state  # [B, T, plbert.hidden_size]
        d_en = self.bert_encoder(h)  # [B, T, D]

        style_prosody = style[:, self.style_dim:]  # [B, S]
        d = self.predictor.text_encoder(d_en, style_prosody, span)  # [B, T, D + S]
        durations = self.predictor.durations(d, speed, span)  # [B, T]
        t_en = self.text_encoder(ids, span)  # [B, D, T]
        return durations, torch.cat([d, t_en.transpose(1, 2)], dim=-1)

    # --- stage 2: aligned frames -> waveform -------------------------------------------------------

    def frame_spans(self, n_frames: torch.Tensor | None, frames: int) -> FrameSpans:
        if n_frames is None:
            return FrameSpans(Span(), Span(), Span(), Span(), Span())
        dtype = self.decoder_dtype
        samples_positions = self.positions(SAMPLES_PER_FRAME * frames + 20)
        return FrameSpans(
            frames=Span.of(samples_positions[:frames], n_frames, torch.float32),
            frames2=Span.of(samples_positions[:2 * frames], 2 * n_frames, dtype),
            up1=Span.of(samples_positions[:20 * frames], 20 * n_frames, dtype),
            stft=Span.of(samples_positions[:120 * frames + 1], 120 * n_frames + 1, dtype),
            samples=Span(length=SAMPLES_PER_FRAME * n_frames, positions=samples_positions),
        )

    def stage2(self, durations: torch.Tensor, features: torch.Tensor, n_frames: torch.Tensor | None, frames: int,
               style: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        """durations: [B, Tt] int64, features: [B, Tt, D + S + D] (any Tt >= the tokens used), n_frames:
        [B] int64 true frame counts or None (B = 1, frames == durations.sum()), frames: the bucket size
        (>= every item's), style: [B, 2S], noise: [B, 600 * frames, 9] standard normal or None
        -> [B, 600 * frames] float32.
        """
        asr, f0, energy = self.frame_prosody(durations, features, n_frames, frames, style)
        decode = self.compiled_decode or self.decode
        return decode(asr, f0, energy, n_frames, style, noise)

    def frame_prosody(self, durations: torch.Tensor, features: torch.Tensor, n_frames: torch.Tensor | None,
                      frames: int, style: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Stage 2 up to the decoder: the features aligned to frames, then F0 and energy. Arguments as
        `stage2`'s -> asr [B, D, frames], f0 (Hz) and energy [B, 2 frames] float32."""
        B = durations.shape[0]
        spans = self.frame_spans(n_frames, frames)
        # Alignment on device: frame f belongs to the token whose cumulative end first exceeds f.
        ends = durations.cumsum(dim=-1)  # [B, Tt]
        frame_positions = self.positions(frames).unsqueeze(0).expand(B, -1).contiguous()  # [B, F]
        token_of_frame = torch.searchsorted(ends, frame_positions, right=True)
        token_of_frame = token_of_frame.clamp_(max=durations.shape[1] - 1)  # frames past the end: masked below
        index = token_of_frame.unsqueeze(-1).expand(-1, -1, features.shape[-1])
        aligned = features.gather(1, index)  # [B, F, D + S + D]
        if spans.frames.mask is not None:
            aligned = aligned * spans.frames.mask.transpose(1, 2)
        D = self.hidden_dim
        en, asr = aligned.split([aligned.shape[-1] - D, D], dim=-1)  # [B, F, D + S], [B, F, D]

        style_prosody = style[:, self.style_dim:]  # [B, S]
        f0, energy = self.predictor.f0_energy(en, style_prosody, spans.frames, spans.frames2)  # [B, 2F] each
        return asr.transpose(1, 2), f0, energy

    def decode(self, asr: torch.Tensor, f0: torch.Tensor, energy: torch.Tensor, n_frames: torch.Tensor | None,
               style: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        """Stage 2's decoder, the part worth compiling (most of the time, in many small elementwise
        kernels; no LSTM, which dynamo cannot trace): asr [B, D, frames], f0 / energy [B, 2 frames]
        float32, n_frames / style / noise as in `stage2` -> [B, 600 * frames] float32."""
        spans = self.frame_spans(n_frames, asr.shape[-1])
        return self.decoder(asr, f0, energy, style[:, :self.style_dim], noise, spans)

    def use_compiled_decode(self, enabled: bool = True) -> None:
        """`decode` through torch.compile (inductor), one compile per shape family: the batch and
        frame dimensions are dynamic, so every bucket of a family shares one compiled graph (a
        static grid would cost a compile per shape). A batch of one is its own family (dynamo
        specializes size 1), and so is a run without noise."""
        if not enabled:
            self.compiled_decode = None
            return
        compiled = torch.compile(self.decode, fullgraph=True)

        def decode(asr, f0, energy, n_frames, style, noise):
            # Every engine of a process adds its families to the one code object's cache: past
            # dynamo's default of 8 entries (several engines: tests, bench) it would run eagerly.
            # Set per call, as layers.py does: syntheses run in worker threads.
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
            batched = asr.shape[0] > 1
            for tensor, time_dim in ((asr, 2), (f0, 1), (energy, 1), (noise, 1), (n_frames, None), (style, None)):
                if tensor is None:
                    continue
                if batched:
                    torch._dynamo.maybe_mark_dynamic(tensor, 0)
                if time_dim is not None:
                    torch._dynamo.maybe_mark_dynamic(tensor, time_dim)
            return compiled(asr, f0, energy, n_frames, style, noise)

        self.compiled_decode = decode

    # --- convenience (tests, tools) ----------------------------------------------------------------

    @torch.no_grad()
    def synthesize(self, ids: torch.Tensor, style: torch.Tensor, speed: float = 1.0,
                   noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Unpadded run of both stages: ids [1, T] (pads included) -> (waveform [600F], durations [T])."""
        speed_t = torch.tensor([speed], dtype=torch.float32, device=ids.device)
        durations, features = self.stage1(ids, None, style, speed_t)
        frames = int(durations.sum())
        audio = self.stage2(durations, features, None, frames, style, noise)
        return audio[0], durations[0]
