"""The demo corpus: the running interpreter's standard library source, split train/held-out by a stable path hash."""

from __future__ import annotations

import hashlib
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

HELDOUT_PERCENT = 2  # about 98/2 train / held-out


@dataclass(frozen=True)
class Corpus:
    """File lists of the split, plus what identifies it (Python version and a digest of the file list)."""

    root: Path
    train: list[Path]
    heldout: list[Path]
    python_version: str
    digest: str

    def describe(self) -> dict:
        return {
            "source": "CPython standard library (.py files, site-packages excluded)",
            "python_version": self.python_version,
            "files_train": len(self.train),
            "files_heldout": len(self.heldout),
            "file_list_sha256": self.digest,
            "split_rule": f"sha256(relative path) % 100 < {HELDOUT_PERCENT} -> held-out",
        }


def is_heldout(relative_path: str) -> bool:
    """Stable split: the first 8 bytes of sha256 of the POSIX relative path, modulo 100."""
    h = int.from_bytes(hashlib.sha256(relative_path.encode()).digest()[:8], "big")
    return h % 100 < HELDOUT_PERCENT


def stdlib_corpus(root: Path | None = None) -> Corpus:
    """Collect the standard library's .py files (sorted, so the digest and the order are reproducible)."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and "dist-packages" not in p.parts)
    rel = [p.relative_to(root).as_posix() for p in files]
    digest = hashlib.sha256("\n".join(rel).encode()).hexdigest()
    train = [p for p, r in zip(files, rel) if not is_heldout(r)]
    heldout = [p for p, r in zip(files, rel) if is_heldout(r)]
    version = ".".join(map(str, sys.version_info[:3]))
    return Corpus(root, train, heldout, version, digest)


def read_text(path: Path) -> str:
    """File text; undecodable bytes are replaced so a stray Latin-1 file cannot stop training."""
    return path.read_text(encoding="utf-8", errors="replace")
