"""What this CPU runs natively: its model name and the instruction-set flags that decide our modes.

bf16 convolutions are fast only with AVX512-BF16 or AMX (oneDNN then runs them about twice as fast
as float32); without either, oneDNN emulates them, hundreds of times slower. fp16 likewise needs
AVX512-FP16 or AMX-FP16. `auto` never picks a precision the CPU lacks, and a forced one logs a
warning naming the missing feature (`precision_warning`).
"""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass

# The flags `kokoro-fleet bench` prints, in the order it prints them (Linux /proc/cpuinfo names).
REPORTED_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16",
                  "amx_bf16", "amx_int8", "amx_fp16")

# Any one of these makes a precision native; the first is the one a warning names as missing.
NATIVE_FEATURES = {
    "bf16": ("avx512_bf16", "amx_bf16"),
    "fp16": ("avx512_fp16", "amx_fp16"),
}


@dataclass(frozen=True)
class CpuInfo:
    model: str
    flags: frozenset[str]

    def has(self, flag: str) -> bool:
        return flag in self.flags

    def native(self, precision: str) -> bool:
        """Whether `precision` (fp32, bf16, fp16) runs on native instructions here."""
        return any(f in self.flags for f in NATIVE_FEATURES.get(precision, ())) or precision not in NATIVE_FEATURES

    def summary(self) -> str:
        present = [f for f in REPORTED_FLAGS if f in self.flags]
        return f"{self.model} [{' '.join(present) or 'none of ' + ' '.join(REPORTED_FLAGS)}]"


def parse_cpuinfo(text: str) -> CpuInfo:
    """A CpuInfo from the text of /proc/cpuinfo (its first processor's model name and flags)."""
    model, flags = "", frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = frozenset(value.split())
    return CpuInfo(model or platform.processor() or platform.machine(), flags)


@functools.lru_cache(maxsize=1)
def cpu_info() -> CpuInfo:
    """This machine's CPU (an empty flag set where /proc/cpuinfo is unreadable: nothing counts as native)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="ignore") as f:
            return parse_cpuinfo(f.read())
    except OSError:
        return CpuInfo(platform.processor() or platform.machine(), frozenset())


def precision_warning(precision: str, info: CpuInfo | None = None) -> str | None:
    """The warning for running `precision` on a CPU that lacks its instructions, or None if native."""
    info = info or cpu_info()
    if info.native(precision):
        return None
    needed = NATIVE_FEATURES[precision]
    return (f"KOKORO_DTYPE={precision} on a CPU without native {precision} ({info.model} lacks "
            f"{' and '.join(needed)}): oneDNN emulates it, many times slower than fp32; "
            f"set KOKORO_DTYPE=auto or fp32")
