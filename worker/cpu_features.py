"""What this CPU runs natively: its model name and the instruction-set flags that decide our modes.

bf16 convolutions are fast only with AVX512-BF16 or AMX (oneDNN then runs them about twice as fast
as float32); without either, oneDNN emulates them, hundreds of times slower. fp16 likewise needs
AVX512-FP16 or AMX-FP16. `auto` never picks a precision the CPU lacks, and a forced one logs a
warning naming the missing feature (`precision_warning`).

Emulating an older CPU: `ISA_CAPS` lists the variables that make oneDNN, ATen, torch.compile's
C++ kernels and MKL stop at AVX2 (`python -m loadtest.bench --isa avx2` re-runs itself with them set).
With ONEDNN_MAX_CPU_ISA set, `cpu_info()` leaves out the flags above that cap, so `auto` picks
what it would pick on such a CPU.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass

# The flags `python -m loadtest.bench` prints, in the order it prints them (Linux /proc/cpuinfo names).
REPORTED_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16",
                  "amx_bf16", "amx_int8", "amx_fp16")

# Any one of these makes a precision native; the first is the one a warning names as missing.
NATIVE_FEATURES = {
    "bf16": ("avx512_bf16", "amx_bf16"),
    "fp16": ("avx512_fp16", "amx_fp16"),
}


# What `--isa avx2` sets: oneDNN (convolutions, LSTMs), ATen's own kernels and torch.compile's C++
# backend (it follows ATEN_CPU_CAPABILITY), MKL (float32 matmuls) and fbgemm stop at AVX2.
ISA_CAPS = {
    "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
             "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2"},
}

# Flags a oneDNN ISA cap leaves out (ONEDNN_MAX_CPU_ISA values, lowest first; a cap keeps nothing
# named after the caps above it).
_ABOVE_CAP = (
    ("AVX2", ("avx512", "amx", "avx_vnni")),
    ("AVX2_VNNI", ("avx512", "amx")),
    ("AVX512_CORE", ("avx512_vnni", "avx512_bf16", "avx512_fp16", "amx")),
    ("AVX512_CORE_VNNI", ("avx512_bf16", "avx512_fp16", "amx")),
    ("AVX512_CORE_BF16", ("avx512_fp16", "amx")),
    ("AVX512_CORE_FP16", ("amx",)),
)


def isa_cap() -> str | None:
    """The oneDNN ISA cap in force (ONEDNN_MAX_CPU_ISA, or its old name DNNL_MAX_CPU_ISA), if any."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    return cap.upper() if cap else None


def capped_flags(flags: frozenset[str], cap: str | None) -> frozenset[str]:
    """`flags` less the instruction sets a oneDNN ISA cap keeps oneDNN from using."""
    dropped = dict(_ABOVE_CAP).get(cap or "", ())
    return frozenset(f for f in flags if not f.startswith(dropped)) if dropped else flags


@dataclass(frozen=True)
class CpuInfo:
    model: str
    flags: frozenset[str]
    cap: str | None = None  # an ISA cap in force (emulating an older CPU)

    def has(self, flag: str) -> bool:
        return flag in self.flags

    def native(self, precision: str) -> bool:
        """Whether `precision` (fp32, bf16, fp16) runs on native instructions here."""
        return any(f in self.flags for f in NATIVE_FEATURES.get(precision, ())) or precision not in NATIVE_FEATURES

    def summary(self) -> str:
        present = [f for f in REPORTED_FLAGS if f in self.flags]
        emulated = f" (capped at {self.cap}: ONEDNN_MAX_CPU_ISA)" if self.cap else ""
        return f"{self.model} [{' '.join(present) or 'none of ' + ' '.join(REPORTED_FLAGS)}]{emulated}"


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
    """This machine's CPU as oneDNN may use it: its flags less those above an ISA cap in force (an
    empty flag set where /proc/cpuinfo is unreadable: nothing counts as native)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="ignore") as f:
            info = parse_cpuinfo(f.read())
    except OSError:
        info = CpuInfo(platform.processor() or platform.machine(), frozenset())
    cap = isa_cap()
    return CpuInfo(info.model, capped_flags(info.flags, cap), cap) if cap else info


def int8_weight_levels(info: CpuInfo | None = None) -> int:
    """The int8 weight range oneDNN computes exactly here: +-127 with VNNI (products summed in 32
    bits), else +-63 (AVX2's vpmaddubsw sums pairs of u8 x s8 products in saturating 16 bits)."""
    info = info or cpu_info()
    return 127 if info.has("avx512_vnni") or info.has("avx_vnni") else 63


def precision_warning(precision: str, info: CpuInfo | None = None) -> str | None:
    """The warning for running `precision` on a CPU that lacks its instructions, or None if native."""
    info = info or cpu_info()
    if info.native(precision):
        return None
    needed = NATIVE_FEATURES[precision]
    return (f"KOKORO_DTYPE={precision} on a CPU without native {precision} ({info.model} lacks "
            f"{' and '.join(needed)}): oneDNN emulates it, many times slower than fp32; "
            f"set KOKORO_DTYPE=auto or fp32")
