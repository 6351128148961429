"""Facts about the machine, for logs, model cards and benchmark reports."""

from __future__ import annotations

import platform
from collections.abc import Sequence
from functools import cache
from pathlib import Path


def cpu_name() -> str:
    """The CPU's marketing name where the OS tells it (Linux /proc/cpuinfo), else the architecture."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# Instruction sets that decide what a bfloat16 forward costs on a CPU: the same "Intel Xeon Processor" name covered
# a host without AMX (plain decoding of the bundled target 96-133 tok/s) and one with it (255 tok/s), and speedups
# differ between the two by up to half (benchmarks print these so their tables say which ran).
MATRIX_FLAGS = ("avx512_bf16", "amx_bf16")


@cache
def cpu_flags() -> tuple[str, ...]:
    """The CPU's feature flags as Linux lists them (x86 "flags", Arm "Features"); () where /proc/cpuinfo is absent.
    Read once per process: training asks for every step (engine/train/loop/precision.py)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return tuple(line.split(":", 1)[1].split())
    except OSError:
        pass
    return ()


def native_bfloat16(flags: Sequence[str] | None = None) -> bool:
    """Whether this CPU multiplies bfloat16 matrices in hardware (x86 AVX512-BF16 or AMX, Arm BF16). Without, every
    bfloat16 product is converted to float32 and back around an AVX2 kernel: on a 2-core AMD EPYC (AVX2 only) plain
    decoding of the bundled target ran 55.6 tok/s in bfloat16 against 80.4 in float32 (compiled, off-suite prompts),
    where a Xeon with AMX ran bfloat16 about twice as fast as float32."""
    flags = cpu_flags() if flags is None else flags
    return any(f in flags for f in (*MATRIX_FLAGS, "bf16"))


def cpu_features() -> str:
    """What a benchmark's header names beside the CPU: its bfloat16 matrix instructions and last-level cache, e.g.
    "avx512_bf16 amx_bf16, L3 480 MiB", from Linux's /proc and /sys; "" where those do not exist."""
    parts = []
    found = [f for f in MATRIX_FLAGS if f in cpu_flags()]
    if found:
        parts.append(" ".join(found))
    try:
        size = Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text().strip()  # e.g. "491520K"
        if size.endswith("K") and size[:-1].isdigit():
            parts.append(f"L3 {int(size[:-1]) // 1024} MiB")
    except OSError:
        pass
    return ", ".join(parts)
