"""Per-step performance metrics: peak resident memory and CPU threads, as a loop callback.

``perf/peak_rss_mb`` is the step's peak resident set size. On Linux the kernel's high-water
mark (``VmHWM``) is reset at the start of each step (writing ``5`` to
``/proc/self/clear_refs``), so the figure is this step's own peak; where that is not
possible it is the process's peak so far (``resource.getrusage``), which only rises.
``perf/threads`` is torch's intra-op thread count at the end of the step, and
``perf/threads_collect`` / ``perf/threads_update`` the counts those phases ran with under
:func:`marft_algos.threads.phase_threads`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from marft_algos.callbacks import Callback
from marft_algos.threads import LAST_PHASE_THREADS

__all__ = ["PerfStats", "peak_rss_mb", "reset_peak_rss"]

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def reset_peak_rss() -> bool:
    """Reset this process's peak-RSS mark (Linux only); False where it cannot be reset."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MB since the last :func:`reset_peak_rss`
    (``VmHWM``), or since start-up where ``/proc`` is missing (``ru_maxrss``)."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    # deferred: Unix only (the /proc read above comes first)
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB elsewhere


class PerfStats(Callback):
    """Adds ``perf/peak_rss_mb`` (this step's peak RSS) and ``perf/threads`` to each step's metrics."""

    def __init__(self) -> None:
        self.per_step = False

    def on_collect_start(self, trainer: Any) -> None:
        """Start the step's memory window."""
        self.per_step = reset_peak_rss()

    def on_step_end(self, trainer: Any, metrics: dict[str, float], batch: Any) -> None:
        """Record the step's peak memory and thread count."""
        metrics["perf/peak_rss_mb"] = round(peak_rss_mb(), 1)
        metrics["perf/threads"] = float(torch.get_num_threads())

        for phase, n in LAST_PHASE_THREADS.items():  # once the trainer runs phases under phase_threads
            metrics[f"perf/threads_{phase}"] = float(n)
