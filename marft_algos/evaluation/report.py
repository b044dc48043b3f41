"""Report helpers shared by evaluation, the leaderboard and the benchmark scripts.

The one Wilson score interval of the library, table cells, Markdown tables, CSV and JSON
writers, and the versions every reported number depends on. Standard library only at
import time (``marft --help`` imports this package).
"""

from __future__ import annotations

import csv
import importlib.metadata
import json
import math
import os
import platform
import random
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["wilson", "wilson_interval", "bootstrap_mean", "fmt", "markdown_table", "write_csv", "write_json", "versions"]

#: z of a two-sided 95% interval.
Z95 = 1.959963984540054


def wilson(p: float, n: int, z: float = Z95) -> tuple[float, float]:
    """95% Wilson score interval for a proportion ``p`` observed over ``n`` units.

    It stays inside [0, 1] and is sensible for small n and p near 0 or 1. ``p`` may be a
    mean of per-unit averages (avg@k over n problems): the variance of such a mean is at
    most p(1-p)/n, so the interval is conservative there.

    >>> wilson(0.0, 10)[0], wilson(1.0, 10)[1]
    (0.0, 1.0)
    >>> lo, hi = wilson(0.5, 100); round(lo, 3), round(hi, 3)
    (0.404, 0.596)
    """
    if n <= 0 or not math.isfinite(p):
        return (0.0, 1.0)
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(max(p * (1 - p), 0.0) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if p <= 0 else max(0.0, centre - half)  # exact ends (no 1e-17 rounding residue)
    hi = 1.0 if p >= 1 else min(1.0, centre + half)
    return (lo, hi)


def wilson_interval(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for ``k`` successes out of ``n`` (95% by default): :func:`wilson` of k/n.

    >>> wilson_interval(0, 0)
    (0.0, 1.0)
    """
    return wilson(k / n if n > 0 else float("nan"), n, z)


def bootstrap_mean(xs: Sequence[float], level: float = 0.95, resamples: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """``(mean, low, high)``: the mean of ``xs`` and its percentile bootstrap interval.

    For scores with no closed-form interval (answer F1 in [0, 1], mostly 0 or 1): the
    interval stays inside the range of the data, where a normal interval can leave it.
    Seeded: the same ``xs`` give the same interval. Empty ``xs``: all NaN.

    >>> bootstrap_mean([0.5, 0.5, 0.5])
    (0.5, 0.5, 0.5)
    >>> m, lo, hi = bootstrap_mean([0.0] * 50 + [1.0] * 50); m, round(lo, 2), round(hi, 2)
    (0.5, 0.4, 0.6)
    """
    vals = [float(x) for x in xs]
    if not vals:
        nan = float("nan")
        return (nan, nan, nan)
    if not 0 < level < 1 or resamples < 1:
        raise ValueError(f"level must be in (0, 1) and resamples >= 1, got {level}, {resamples}")
    rng = random.Random(seed)
    n = len(vals)
    means = sorted(sum(rng.choices(vals, k=n)) / n for _ in range(resamples))
    tail = (1 - level) / 2
    lo = means[min(resamples - 1, int(math.floor(tail * resamples)))]
    hi = means[min(resamples - 1, int(math.ceil((1 - tail) * resamples)) - 1)]
    return (sum(vals) / n, lo, hi)


def fmt(v: Any, digits: int = 3) -> str:
    """A table cell: floats with ``digits`` decimals, non-finite floats as ``-``.

    >>> fmt(0.12345), fmt(float("nan")), fmt(7)
    ('0.123', '-', '7')
    """
    if isinstance(v, float):
        if not math.isfinite(v):
            return "-"
        return f"{v:.{digits}f}"
    return str(v)


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str], headers: Sequence[str] | None = None, digits: int = 3) -> str:
    """A Markdown table of ``rows`` (one per dict) with the given columns and headers.

    >>> print(markdown_table([{"a": 1, "b": 0.5}], ["a", "b"]))
    | a | b |
    |---|---|
    | 1 | 0.500 |
    """
    heads = list(headers) if headers is not None else list(columns)
    lines = ["| " + " | ".join(heads) + " |", "|" + "|".join("---" for _ in heads) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(fmt(r.get(c, ""), digits) for c in columns) + " |")
    return "\n".join(lines)


def write_csv(path: str | os.PathLike[str], rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> Path:
    """Write ``rows`` as CSV with ``columns`` (default: every key seen, in order); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    cols = list(columns) if columns is not None else list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in cols})
    return path


def write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """Write ``obj`` as indented JSON (non-JSON values as ``str``); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, default=str))
    return path


def _pkg(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _source_commit() -> str:
    """The git commit of the marft checkout (``+uncommitted`` if its code differs), when
    marft runs from a checkout; else the installed package version."""
    root = Path(__file__).resolve().parents[2]  # marft_algos/evaluation/report.py -> the checkout
    if not ((root / "pyproject.toml").is_file() and (root / "marft_algos" / "__init__.py").is_file()):
        return f"marft {_pkg('marft')} (installed, no git checkout)"
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "marft_algos", "marft_envs", "benchmarks"], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if not commit:
        return "unknown"
    return commit + ("+uncommitted" if dirty else "")


def versions() -> dict[str, str]:
    """Versions of everything a number depends on (python, torch, ..., marft git commit, device)."""
    # deferred: this module is standard-library-only at import (docstring)
    import torch

    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu x{os.cpu_count()} ({torch.get_num_threads()} torch threads)"
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": _pkg("transformers"),
        "peft": _pkg("peft"),
        "trl": _pkg("trl"),
        "marft": _source_commit(),
        "device": dev,
    }
