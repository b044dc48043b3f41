"""Metrics and transcript logging with pluggable writers (JSONL, TensorBoard).

Keys are namespaced like tianshou/CleanRL: ``team/reward``, ``agent/<role>/kl``,
``agent/<role>/entropy``, ``rollout/verifier_timeouts``, ``train/nonfinite_skips``,
``perf/step_s``. A run directory holds::

    metrics.jsonl       one JSON object per logged step: {"step": 3, "team/reward": 0.4, ...}
    transcripts.jsonl   sample episodes every N steps: {"step": 10, "episode": {...}}
    tb/                 TensorBoard events (same keys)
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "MetricsWriter",
    "JSONLWriter",
    "TensorBoardWriter",
    "MetricsLogger",
    "read_metrics",
    "agent_metric",
]


def agent_metric(agent: str, name: str) -> str:
    """The namespaced key of a per-agent metric: ``agent/<agent>/<name>``."""
    return f"agent/{agent}/{name}"


class MetricsWriter(Protocol):
    """What a metrics sink implements (JSONL, TensorBoard, or your own)."""

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record ``metrics`` at ``step``."""

    def flush(self) -> None:
        """Push buffered records to storage."""

    def close(self) -> None:
        """Flush and release the sink."""


def _clean(v: Any) -> Any:
    """JSON has no NaN/inf: write them as null (a missing point, never a crash)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class JSONLWriter:
    """Appends one JSON line per step; flushed each write so a crash loses nothing."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115  (kept open for the run)

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Append one JSON line (NaN/inf become null)."""
        row = {"step": int(step), **{k: _clean(v) for k, v in metrics.items()}}
        self._fh.write(json.dumps(row, sort_keys=True) + "\n")
        self._fh.flush()

    def flush(self) -> None:
        """Flush the file."""
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        """Close the file."""
        if not self._fh.closed:
            self.flush()
            self._fh.close()


class TensorBoardWriter:
    """``torch.utils.tensorboard.SummaryWriter`` with the same namespaced keys."""

    def __init__(self, log_dir: str | Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._w = SummaryWriter(log_dir=str(log_dir))

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Add every finite scalar at ``step``."""
        for k, v in metrics.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v)):
                self._w.add_scalar(k, float(v), global_step=int(step))

    def flush(self) -> None:
        """Flush the event file."""
        self._w.flush()

    def close(self) -> None:
        """Close the event file."""
        self._w.close()


class MetricsLogger:
    """Fans metrics out to writers and keeps transcripts.

    Args:
        out_dir: run directory.
        tensorboard: also write TensorBoard events under ``out_dir/tb``.
        writers: extra writers (anything with ``write(step, metrics)``, ``flush``, ``close``).
    """

    def __init__(self, out_dir: str | Path, *, tensorboard: bool = True, writers: Iterable[MetricsWriter] = ()) -> None:
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.out_dir / "metrics.jsonl"
        self.transcripts_path = self.out_dir / "transcripts.jsonl"
        self.writers: list[MetricsWriter] = [JSONLWriter(self.metrics_path)]
        if tensorboard:
            try:
                self.writers.append(TensorBoardWriter(self.out_dir / "tb"))
            except ImportError:  # tensorboard missing: JSONL still has everything
                pass
        self.writers.extend(writers)

    def truncate_after(self, step: int) -> None:
        """Drop JSONL rows logged after ``step`` (a resumed run re-logs them)."""
        for path in (self.metrics_path, self.transcripts_path):
            if not path.exists():
                continue
            keep = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line).get("step", 0) <= step]
            path.write_text("".join(line + "\n" for line in keep))

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Write ``metrics`` at ``step`` to every writer."""
        for w in self.writers:
            w.write(step, metrics)

    def log_transcripts(self, step: int, episodes: Iterable[Any]) -> None:
        """Append the episodes' transcripts (one JSON line each) to ``transcripts.jsonl``."""
        with open(self.transcripts_path, "a", encoding="utf-8") as fh:
            for ep in episodes:
                data = ep.transcript() if hasattr(ep, "transcript") else ep
                fh.write(json.dumps({"step": int(step), "episode": data}) + "\n")

    def flush(self) -> None:
        """Flush every writer."""
        for w in self.writers:
            w.flush()

    def close(self) -> None:
        """Close every writer."""
        for w in self.writers:
            w.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a metrics.jsonl file (missing file -> [])."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
