"""Learning-curve plots (matplotlib, Agg backend: works headless)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

__all__ = ["plot_learning_curve"]


def _smooth(values: list[float], window: int) -> list[float]:
    out, acc = [], []
    for v in values:
        acc.append(v)
        if len(acc) > window:
            acc.pop(0)
        out.append(sum(acc) / len(acc))
    return out


def plot_learning_curve(
    metrics_path: str | Path,
    out_png: str | Path,
    *,
    keys: Sequence[str] = ("team/reward",),
    agent_keys: Sequence[str] = ("kl", "entropy"),
    smooth: int = 5,
    title: str | None = None,
) -> Path | None:
    """Plot ``keys`` (raw and smoothed) and per-agent ``agent_keys`` from a metrics.jsonl.

    Returns the PNG path, or None when there is nothing to plot.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from marft_algos.logging import read_metrics

    rows = read_metrics(metrics_path)
    if not rows:
        return None
    agent_series = sorted(
        {k for r in rows for k in r if k.startswith("agent/") and k.rsplit("/", 1)[-1] in agent_keys}
    )
    n_panels = 1 + (1 if agent_series else 0)
    fig, axes = plt.subplots(1, n_panels, figsize=(6 * n_panels, 4), squeeze=False)
    ax = axes[0][0]
    for key in keys:
        pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
        if not pts:
            continue
        xs, ys = zip(*pts, strict=True)
        ax.plot(xs, ys, alpha=0.35, label=f"{key}")
        ax.plot(xs, _smooth(list(ys), smooth), label=f"{key} (mean of {smooth})")
    ax.set_xlabel("training step")
    ax.set_ylabel("reward")
    ax.set_title(title or "team reward")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if agent_series:
        ax2 = axes[0][1]
        for key in agent_series:
            pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax2.plot(xs, ys, label=key)
        ax2.set_xlabel("training step")
        ax2.set_title("per-agent diagnostics")
        ax2.grid(alpha=0.3)
        ax2.legend(fontsize=7)
    fig.tight_layout()
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return out_png
