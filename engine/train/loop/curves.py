"""`python main.py train curve HEAD_FOLDER`: plot a head's training curve (held-out top-1 per draft depth against the
tokens trained on, from the curve.jsonl training writes) as curve.png beside it, for its model card."""

from __future__ import annotations

import json
from pathlib import Path

from engine.errors import GlanceError


def read_curve(folder: Path) -> list[dict]:
    path = Path(folder) / "curve.jsonl"
    try:
        points = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as exc:
        raise GlanceError(f"cannot read the training curve {path}: {exc}") from None
    if not points:
        raise GlanceError(f"{path} holds no points yet: training writes one every few hundred steps")
    return points


def shown_depths(depths: int, most: int = 5) -> list[int]:
    """The depths a curve plots: all of a few; of a DFlash block's 15, the first three, the middle and the last."""
    if depths <= most:
        return list(range(depths))
    return sorted({0, 1, 2, depths // 2, depths - 1})


def plot_curve(folder: Path, title: str | None = None) -> Path:
    """Write curve.png: one line per draft depth, top-1 against millions of tokens trained on."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = read_curve(folder)
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=110)
    tokens = [p["tokens"] / 1e6 for p in points]
    for d in shown_depths(len(points[-1]["top1"])):
        ax.plot(
            tokens, [p["top1"][d] if d < len(p["top1"]) else None for p in points], marker="o", label=f"depth {d + 1}"
        )
    ax.set_xlabel("tokens trained on (millions)")
    ax.set_ylabel("held-out top-1")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(title or Path(folder).name)
    fig.tight_layout()
    out = Path(folder) / "curve.png"
    fig.savefig(out)
    plt.close(fig)
    return out
