"""Facts about the machine, for logs, model cards and benchmark reports."""

from __future__ import annotations

import platform
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


def cpu_features() -> str:
    """What a benchmark's header names beside the CPU: its bfloat16 matrix instructions and last-level cache, e.g.
    "avx512_bf16 amx_bf16, L3 480 MiB", from Linux's /proc and /sys; "" where those do not exist."""
    parts = []
    try:
        flags = next(
            (line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
             if line.startswith("flags")),
            [],
        )  # fmt: skip
        found = [f for f in MATRIX_FLAGS if f in flags]
        if found:
            parts.append(" ".join(found))
    except OSError:
        pass
    try:
        size = Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text().strip()  # e.g. "491520K"
        if size.endswith("K") and size[:-1].isdigit():
            parts.append(f"L3 {int(size[:-1]) // 1024} MiB")
    except OSError:
        pass
    return ", ".join(parts)
