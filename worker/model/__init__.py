"""Our Kokoro-82M in PyTorch (official parameter names), built for serving. See kokoro.py."""

from worker.model.kokoro import COMPONENTS, SAMPLES_PER_FRAME, KokoroModel

__all__ = ["COMPONENTS", "SAMPLES_PER_FRAME", "KokoroModel"]
