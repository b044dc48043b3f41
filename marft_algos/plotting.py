"""Learning-curve plots (matplotlib, Agg backend: works headless).

One panel per quantity, so that quantities of different scales never share an axis (a
KL of 1e-4 next to an entropy of 2 would be a flat line): the team reward (raw and
smoothed) with the training accuracy, held-out accuracy with its 95% interval when the
metrics hold evaluations (``eval/accuracy``, ``eval/ci_low``, ``eval/ci_high`` rows),
the cost (tokens per episode), then each per-agent diagnostic (``agent/<a>/kl``,
``agent/<a>/entropy``, ...) with one line per agent. Steps are integers on every axis.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["plot_learning_curve", "curve_panels"]


def _smooth(values: list[float], window: int) -> list[float]:
    out, acc = [], []
    for v in values:
        acc.append(v)
        if len(acc) > window:
            acc.pop(0)
        out.append(sum(acc) / len(acc))
    return out


def curve_panels(
    rows: Sequence[dict[str, Any]],
    keys: Sequence[str] = ("team/reward", "team/accuracy"),
    agent_keys: Sequence[str] = ("kl", "entropy"),
    cost_keys: Sequence[str] = ("team/tokens_per_episode",),
) -> list[tuple[str, list[str]]]:
    """The panels a metrics log gives: ``[(title, metric keys), ...]``, empty ones left out."""
    present = {k for r in rows for k, v in r.items() if v is not None}
    panels: list[tuple[str, list[str]]] = []
    team = [k for k in keys if k in present]
    if team:
        panels.append(("team reward", team))
    if "eval/accuracy" in present:
        panels.append(("held-out accuracy (95% interval)", ["eval/accuracy"]))
    cost = [k for k in cost_keys if k in present]
    if cost:
        panels.append(("cost", cost))
    for q in agent_keys:
        series = sorted(k for k in present if k.startswith("agent/") and k.count("/") == 2 and k.rsplit("/", 1)[-1] == q)
        if series:
            panels.append((f"per-agent {q}", series))
    return panels


def plot_learning_curve(
    metrics_path: str | Path,
    out_png: str | Path,
    *,
    keys: Sequence[str] = ("team/reward", "team/accuracy"),
    agent_keys: Sequence[str] = ("kl", "entropy"),
    cost_keys: Sequence[str] = ("team/tokens_per_episode",),
    smooth: int = 5,
    title: str | None = None,
) -> Path | None:
    """Plot the panels of :func:`curve_panels` from a metrics.jsonl, one per quantity.

    Returns the PNG path, or None when there is nothing to plot.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from marft_algos.logging import read_metrics

    rows = read_metrics(metrics_path)
    panels = curve_panels(rows, keys, agent_keys, cost_keys)
    if not rows or not panels:
        return None
    cols = min(3, len(panels))
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.6 * nrows), squeeze=False)
    flat = [ax for row in axes for ax in row]

    def series(key: str) -> tuple[list[float], list[float]]:
        pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
        return [p[0] for p in pts], [p[1] for p in pts]

    for ax, (name, pkeys) in zip(flat, panels, strict=False):
        for key in pkeys:
            xs, ys = series(key)
            if name == "team reward" and len(xs) > smooth:
                line = ax.plot(xs, ys, alpha=0.35, label=key)[0]
                ax.plot(xs, _smooth(ys, smooth), color=line.get_color(), label=f"{key} (mean of {smooth})")
            elif key == "eval/accuracy":
                lo, hi = series("eval/ci_low")[1], series("eval/ci_high")[1]
                if len(lo) == len(ys) == len(hi):
                    ax.errorbar(xs, ys, yerr=[[y - a for y, a in zip(ys, lo, strict=True)], [b - y for y, b in zip(ys, hi, strict=True)]],
                                fmt="o-", capsize=3, label="held-out accuracy")
                else:
                    ax.plot(xs, ys, "o-", label="held-out accuracy")
                ax.set_ylim(-0.02, 1.02)
            else:
                ax.plot(xs, ys, marker="." if len(xs) < 20 else None, label=key)
        ax.set_title(title if (title and name == "team reward") else name)
        ax.set_xlabel("training step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in flat[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return out_png
