"""Leaderboard plot: accuracy with its 95% interval, one panel per suite."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["plot_leaderboard"]


def plot_leaderboard(rows: list[dict[str, Any]], path: Path) -> None:
    """Bar chart of accuracy with 95% CI, one panel per suite."""
    # deferred: optional plotting dependency, heavy to import
    import matplotlib

    matplotlib.use("Agg")
    # deferred: optional plotting dependency, heavy to import
    import matplotlib.pyplot as plt

    suites = list(dict.fromkeys(r["suite"] for r in rows))
    fig, axes = plt.subplots(1, max(1, len(suites)), figsize=(4.5 * max(1, len(suites)), 3.6), squeeze=False)
    for ax, suite in zip(axes[0], suites, strict=False):
        rs = [r for r in rows if r["suite"] == suite]
        xs = range(len(rs))
        acc = [r["accuracy"] for r in rs]
        err = [[max(0.0, r["accuracy"] - r["ci_low"]) for r in rs], [max(0.0, r["ci_high"] - r["accuracy"]) for r in rs]]
        ax.bar(xs, acc, yerr=err, capsize=3, color=["#4c72b0" if "untrained" in r["system"] else "#dd8452" if "trained" in r["system"] else "#8c8c8c" for r in rs])
        ax.set_xticks(list(xs))
        ax.set_xticklabels([r["system"] for r in rs], rotation=35, ha="right", fontsize=8)
        ax.set_title(suite)
        ax.set_ylabel("accuracy (avg@k), 95% CI")
        ax.set_ylim(0, 1)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
