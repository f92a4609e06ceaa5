"""What Kokoro-82M's audio is, for every part that handles it: mono float samples at 24 kHz, and
durations counted in frames of 600 samples (25 ms), the model's iSTFTNet hop times its upsampling."""

SAMPLE_RATE = 24_000
SAMPLES_PER_FRAME = 600
FRAME_SECONDS = SAMPLES_PER_FRAME / SAMPLE_RATE  # 0.025
