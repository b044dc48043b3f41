"""Metrics and transcript logging with pluggable writers (JSONL, TensorBoard).

Keys are namespaced like tianshou/CleanRL: ``team/reward``, ``agent/<role>/kl``,
``agent/<role>/entropy``, ``rollout/verifier_timeouts``, ``train/nonfinite_skips``,
``perf/step_s``. A run directory holds::

    metrics.jsonl       one JSON object per logged step: {"step": 3, "team/reward": 0.4, ...}
    transcripts.jsonl   sample episodes every N steps: {"step": 10, "episode": {...}}
    tb/                 TensorBoard events (same keys)

Files are created at the first write, so a run that fails before its first step leaves
no log files behind. A line cut short by a crash or a full disk (the last line, without
its newline) is skipped with a warning when the file is read or appended to; a damaged
line elsewhere is an error naming the file and the line. Rewrites (:meth:`MetricsLogger.truncate_after`)
are atomic: a temp file, fsynced, then ``os.replace``.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from .fsutil import write_text_atomic

__all__ = [
    "MetricsWriter",
    "JSONLWriter",
    "TensorBoardWriter",
    "MetricsLogger",
    "read_metrics",
    "read_jsonl",
    "agent_metric",
    "LogFileError",
]

log = logging.getLogger("marft")


class LogFileError(ValueError):
    """A metrics or transcripts file with a damaged line before its last one."""


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a JSONL log (missing file -> []).

    A torn last line (a crash or a full disk mid-write) is skipped with a warning; a
    damaged line before it raises :class:`LogFileError` naming the file and the line.
    """
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_bytes().split(b"\n")
    rows: list[dict[str, Any]] = []
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError("not a JSON object")
        except (ValueError, UnicodeDecodeError) as e:
            if i == last:
                log.warning("%s: skipped its last line %d (cut short: %d bytes, %s)", path, i + 1, len(line), e)
                continue
            raise LogFileError(
                f"{path}, line {i + 1}: not a valid JSON row ({e}); remove or repair that line (only a torn last line is skipped)"
            ) from None
        rows.append(row)
    return rows


def _write_lines_atomic(path: Path, rows: Iterable[dict[str, Any]], *, sort_keys: bool) -> None:
    """Replace ``path`` by ``rows`` (one JSON line each) atomically: temp file, fsync, os.replace."""
    write_text_atomic(path, "".join(json.dumps(row, sort_keys=sort_keys) + "\n" for row in rows))


def _drop_torn_tail(path: Path) -> None:
    """Cut a last line without its newline (a write that never finished) before appending."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return
    if size == 0:
        return
    with open(path, "rb+") as fh:
        fh.seek(-1, os.SEEK_END)
        if fh.read(1) == b"\n":
            return
        data = path.read_bytes()
        keep = data.rfind(b"\n") + 1
        log.warning("%s: dropped a last line cut short (%d bytes) before appending", path, len(data) - keep)
        fh.truncate(keep)


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
        self._fh: Any = None  # opened at the first write (and again after close)

    def _open(self) -> Any:
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _drop_torn_tail(self.path)
            self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115  (kept open for the run)
        return self._fh

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Append one JSON line (NaN/inf become null)."""
        row = {"step": int(step), **{k: _clean(v) for k, v in metrics.items()}}
        fh = self._open()
        fh.write(json.dumps(row, sort_keys=True) + "\n")
        fh.flush()

    def flush(self) -> None:
        """Flush the file."""
        if self._fh is not None:
            self._fh.flush()
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        """Close the file (a later write opens it again)."""
        if self._fh is not None:
            self.flush()
            self._fh.close()
            self._fh = None


class TensorBoardWriter:
    """``torch.utils.tensorboard.SummaryWriter`` with the same namespaced keys."""

    def __init__(self, log_dir: str | Path) -> None:
        # deferred: tensorboard is optional and heavy
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
        self.metrics_path = self.out_dir / "metrics.jsonl"
        self.transcripts_path = self.out_dir / "transcripts.jsonl"
        self._jsonl = JSONLWriter(self.metrics_path)
        self.writers: list[MetricsWriter] = [self._jsonl]
        self._tensorboard = tensorboard  # its writer is made at the first log: no event file before
        self.writers.extend(writers)

    def _start_tensorboard(self) -> None:
        if not self._tensorboard:
            return
        self._tensorboard = False
        try:
            self.writers.insert(1, TensorBoardWriter(self.out_dir / "tb"))
        except ImportError:  # tensorboard missing: JSONL still has everything
            pass

    def truncate_after(self, step: int) -> None:
        """Drop JSONL rows logged after ``step`` (a resumed run re-logs them); atomic rewrite.

        A torn last line is dropped with a warning; a damaged line before it raises
        :class:`LogFileError` (and the file stays as it was).
        """
        self._jsonl.close()  # the rewrite replaces the file: reopen it at the next write
        paths = [p for p in (self.metrics_path, self.transcripts_path) if p.exists()]
        rows = {p: read_jsonl(p) for p in paths}  # both read (and checked) before either is rewritten
        for path in paths:
            keep = [r for r in rows[path] if r.get("step", 0) <= step]
            _write_lines_atomic(path, keep, sort_keys=path == self.metrics_path)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Write ``metrics`` at ``step`` to every writer."""
        self._start_tensorboard()
        for w in self.writers:
            w.write(step, metrics)

    def log_transcripts(self, step: int, episodes: Iterable[Any]) -> None:
        """Append the episodes' transcripts (one JSON line each) to ``transcripts.jsonl``."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        _drop_torn_tail(self.transcripts_path)
        with open(self.transcripts_path, "a", encoding="utf-8") as fh:
            for ep in episodes:
                data = ep.transcript() if hasattr(ep, "transcript") else ep
                if isinstance(data, dict):
                    _add_call_traces(data, ep, step)
                fh.write(json.dumps({"step": int(step), "episode": data}) + "\n")

    def flush(self) -> None:
        """Flush every writer."""
        for w in self.writers:
            w.flush()

    def close(self) -> None:
        """Close every writer."""
        for w in self.writers:
            w.close()


def _add_call_traces(data: dict[str, Any], ep: Any, step: int) -> None:
    """A program env's actions get ``"call"``: its role, episode, step, tokens and latency.

    The trace is what the collector kept of the answered call (``info["trace"]``): the
    call's index and role, the program's episode id (the one in its ``base_url``) and the
    seconds from the request's arrival to its answer.
    """
    transitions = getattr(ep, "transitions", None) or []
    actions = data.get("actions") or []
    for action, t in zip(actions, transitions, strict=False):
        trace = t.info.get("trace") if isinstance(getattr(t, "info", None), dict) else None
        if not isinstance(trace, dict):
            continue
        action["call"] = {
            "index": trace.get("call"),
            "role": trace.get("role"),
            "episode": getattr(ep, "episode_id", None),
            "program_episode": trace.get("program_episode"),
            "step": int(step),
            "episode_step": t.index,
            "prompt_tokens": len(t.prompt_ids),
            "completion_tokens": len(t.response_ids),
            "latency_s": trace.get("latency_s"),
        }


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a metrics.jsonl file (missing file -> []; see :func:`read_jsonl` for damaged lines)."""
    return read_jsonl(path)
