"""Learning-curve plots (matplotlib, Agg backend: works headless).

One panel per quantity, so that quantities of different scales never share an axis (a
KL of 1e-4 next to an entropy of 2 would be a flat line): the team reward (raw and
smoothed) with the training accuracy, held-out accuracy with its 95% interval when the
metrics hold evaluations (``eval/accuracy``, ``eval/ci_low``, ``eval/ci_high`` rows),
the tokens per episode, the cost components of the reward (``team/reward/<c>`` of every
component that is a cost, :mod:`marft_algos.costs`: a negative weight, ``cost`` in its
name, or named in ``cost_components``; drawn as positive numbers), the share of GRPO
groups without signal (``train/frac_reward_zero_std``), then each per-agent diagnostic
(``agent/<a>/kl``, ``agent/<a>/entropy``, ``agent/<a>/grad_norm``) with one line per agent.
A panel is drawn only when its metrics hold a finite value. Steps are integers on every
axis: every step is a tick on a short run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from marft_algos.costs import cost_components as _cost_components
from marft_algos.logging import read_metrics

__all__ = ["plot_learning_curve", "curve_panels", "learning_curve_figure", "COST_PANEL", "ZERO_SIGNAL_PANEL"]

#: Panel titles (also the names :func:`curve_panels` returns).
COST_PANEL = "cost in the reward (as positive)"
ZERO_SIGNAL_PANEL = "groups without signal (reward std 0)"
TOKENS_PANEL = "cost: tokens per episode"
#: A run of at most this many steps gets every step as a tick.
_ALL_TICKS = 12


def _smooth(values: list[float], window: int) -> list[float]:
    out, acc = [], []
    for v in values:
        acc.append(v)
        if len(acc) > window:
            acc.pop(0)
        out.append(sum(acc) / len(acc))
    return out


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def curve_panels(
    rows: Sequence[dict[str, Any]],
    keys: Sequence[str] = ("team/reward", "team/accuracy"),
    agent_keys: Sequence[str] = ("update_kl", "rollout_ref_kl", "entropy", "grad_norm"),
    cost_keys: Sequence[str] = ("team/tokens_per_episode",),
    cost_components: Sequence[str] = (),
) -> list[tuple[str, list[str]]]:
    """The panels a metrics log gives: ``[(title, metric keys), ...]``; a panel whose metrics
    hold no finite value is left out. ``cost_components``: reward component names to count
    as costs besides those :mod:`marft_algos.costs` finds (negative values, ``cost`` in the name)."""
    values: dict[str, list[float]] = {}
    for r in rows:
        for k, v in r.items():
            if _finite(v):
                values.setdefault(k, []).append(float(v))
    present = set(values)
    panels: list[tuple[str, list[str]]] = []
    team = [k for k in keys if k in present]
    if team:
        panels.append(("team reward", team))
    if "eval/accuracy" in present:
        panels.append(("held-out accuracy (95% interval)", ["eval/accuracy"]))
    tokens = [k for k in cost_keys if k in present]
    if tokens:
        panels.append((TOKENS_PANEL, tokens))
    comps = {k[len("team/reward/"):]: v for k, v in values.items() if k.startswith("team/reward/") and k.count("/") == 2}
    costs = _cost_components(comps, cost_components)
    if costs:
        panels.append((COST_PANEL, [f"team/reward/{c}" for c in costs]))
    if "train/frac_reward_zero_std" in present:
        panels.append((ZERO_SIGNAL_PANEL, ["train/frac_reward_zero_std"]))
    for q in agent_keys:
        series = sorted(k for k in present if k.startswith("agent/") and k.count("/") == 2 and k.rsplit("/", 1)[-1] == q)
        if series:
            panels.append((f"per-agent {q}", series))
    return panels


def _integer_steps(ax: Any, steps: list[int]) -> None:
    """Integer step ticks: every step on a short run (one step included), else a few integers."""
    # deferred: matplotlib is heavy and only needed to draw
    from matplotlib.ticker import MaxNLocator

    lo, hi = min(steps), max(steps)
    if hi - lo <= _ALL_TICKS:
        ax.set_xticks(list(range(lo, hi + 1)))
        ax.set_xlim(lo - 0.5, hi + 0.5)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def learning_curve_figure(
    rows: Sequence[dict[str, Any]], *, smooth: int = 5, title: str | None = None, **panel_options: Any
) -> Any:
    """The matplotlib ``Figure`` of :func:`curve_panels` for metric ``rows`` (one axis per
    panel, no empty axis), or None when there is nothing to plot. The caller closes it.

    ``smooth``: window of the team reward's running mean; ``title``: replaces the team
    reward panel's title; ``panel_options``: the keyword arguments of :func:`curve_panels`
    (``keys``, ``agent_keys``, ``cost_keys``, ``cost_components``)."""
    # deferred: matplotlib is heavy and only needed to draw
    import matplotlib

    matplotlib.use("Agg")
    # deferred: matplotlib is heavy and only needed to draw
    import matplotlib.pyplot as plt

    panels = curve_panels(rows, **panel_options)
    if not rows or not panels:
        return None
    cols = min(3, len(panels))
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.6 * nrows), squeeze=False)
    flat = [ax for row in axes for ax in row]

    def series(key: str) -> tuple[list[int], list[float]]:
        pts = [(int(r["step"]), float(r[key])) for r in rows if _finite(r.get(key)) and "step" in r]
        return [p[0] for p in pts], [p[1] for p in pts]

    for ax, (name, pkeys) in zip(flat, panels, strict=False):
        steps: list[int] = []
        for key in pkeys:
            xs, ys = series(key)
            steps += xs
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
            elif name == COST_PANEL:
                ax.plot(xs, [-y + 0.0 for y in ys], marker="." if len(xs) < 20 else None, label=key.rsplit("/", 1)[-1])
            else:
                ax.plot(xs, ys, marker="." if len(xs) < 20 else None, label=key)
        if name == ZERO_SIGNAL_PANEL:
            ax.set_ylim(-0.02, 1.02)
        ax.set_title(title if (title and name == "team reward") else name)
        ax.set_xlabel("training step")
        if steps:
            _integer_steps(ax, steps)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in flat[len(panels):]:
        fig.delaxes(ax)  # no empty panel in the grid's last row
    fig.tight_layout()
    return fig


def plot_learning_curve(metrics_path: str | Path, out_png: str | Path, **options: Any) -> Path | None:
    """Plot the panels of :func:`curve_panels` from a metrics.jsonl, one per quantity
    (:func:`learning_curve_figure`, which takes ``options``: ``smooth``, ``title`` and the
    panel keys). Returns the PNG path, or None when there is nothing to plot.
    """
    # deferred: matplotlib is heavy and only needed to draw
    import matplotlib.pyplot as plt

    fig = learning_curve_figure(read_metrics(metrics_path), **options)
    if fig is None:
        return None
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return out_png
