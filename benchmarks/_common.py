"""Helpers shared by the benchmark scripts: versions, tables, memory probes, policies.

Kept dependency-light (no pandas): tables are lists of dicts written as CSV and Markdown.
"""

from __future__ import annotations

import csv
import importlib.metadata
import json
import math
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]

__all__ = [
    "REPO",
    "PeakMemory",
    "wilson",
    "versions",
    "write_csv",
    "markdown_table",
    "write_json",
    "rss_bytes",
    "max_rss_bytes",
    "untrained_policy",
    "checkpoint_policy",
    "fmt",
    "summary_stats",
]


def wilson(p: float, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """95% Wilson score interval for a proportion ``p`` observed over ``n`` units.

    ``p`` may be a mean of per-unit averages (avg@k over n problems): the variance of
    such a mean is at most p(1-p)/n, so the interval is conservative there.
    """
    if n <= 0 or not math.isfinite(p):
        return (0.0, 1.0)
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(max(p * (1 - p), 0.0) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if p <= 0 else max(0.0, centre - half)
    hi = 1.0 if p >= 1 else min(1.0, centre + half)
    return (lo, hi)


def _pkg(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def versions() -> dict[str, str]:
    """Versions of everything a number depends on (python, torch, ..., marft git commit)."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "marft_algos", "marft_envs", "benchmarks"], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
        if dirty:
            commit += "+uncommitted"
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu x{os.cpu_count()} ({torch.get_num_threads()} torch threads)"
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": _pkg("transformers"),
        "peft": _pkg("peft"),
        "trl": _pkg("trl"),
        "marft": commit,
        "device": dev,
    }


def fmt(v: Any, digits: int = 3) -> str:
    if isinstance(v, float):
        if not math.isfinite(v):
            return "-"
        return f"{v:.{digits}f}"
    return str(v)


def write_csv(path: str | os.PathLike[str], rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    cols = list(columns) if columns is not None else list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in cols})
    return path


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str], headers: Sequence[str] | None = None, digits: int = 3) -> str:
    heads = list(headers) if headers is not None else list(columns)
    lines = ["| " + " | ".join(heads) + " |", "|" + "|".join("---" for _ in heads) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(fmt(r.get(c, ""), digits) for c in columns) + " |")
    return "\n".join(lines)


def write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, default=str))
    return path


def summary_stats(xs: Sequence[float]) -> dict[str, float]:
    """min / median / max of repeated measurements (no mean: outliers from a shared CPU)."""
    if not xs:
        return {"min": float("nan"), "median": float("nan"), "max": float("nan")}
    s = sorted(xs)
    mid = len(s) // 2
    med = s[mid] if len(s) % 2 else 0.5 * (s[mid - 1] + s[mid])
    return {"min": s[0], "median": med, "max": s[-1]}


# --------------------------------------------------------------------------------------
# memory
# --------------------------------------------------------------------------------------


def rss_bytes() -> int:
    """Current resident set size of this process."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux
        import psutil

        return int(psutil.Process().memory_info().rss)


def max_rss_bytes() -> int:
    """Peak RSS of this process since it started (``ru_maxrss``)."""
    import resource

    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(kb if sys.platform == "darwin" else kb * 1024)


class PeakMemory:
    """Peak memory while a block runs: CUDA allocator peak, or sampled CPU RSS.

    On CPU a thread samples RSS every ``interval`` s; ``peak`` is the highest RSS seen and
    ``delta`` the rise over the RSS at entry (the block's working set; freed memory that
    the allocator keeps makes later deltas of one process read low, say so in reports).
    """

    def __init__(self, interval: float = 0.005) -> None:
        self.interval = interval
        self.start = self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.cuda = torch.cuda.is_available()

    def __enter__(self) -> PeakMemory:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start = self.peak = torch.cuda.memory_allocated()
            return self
        self.start = self.peak = rss_bytes()
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            time.sleep(self.interval)

    def __exit__(self, *exc: object) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated()
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.peak = max(self.peak, rss_bytes())

    @property
    def delta(self) -> int:
        return max(0, self.peak - self.start)


@contextmanager
def timer() -> Iterator[dict[str, float]]:
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    try:
        yield out
    finally:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        out["s"] = time.perf_counter() - t0


# --------------------------------------------------------------------------------------
# policies
# --------------------------------------------------------------------------------------


def untrained_policy(roles: Sequence[str], model: str) -> Any:
    """A plain base model serving every role (no adapters: exactly the untrained team).

    Untrained LoRA adapters are zero (B = 0), so the base alone gives the same outputs
    without the adapter overhead; ``full`` mode without a reference copy does that.
    """
    from marft_algos.models import TeamPolicy

    return TeamPolicy(list(roles), base=model, mode="full", full_reference=False)


def checkpoint_policy(checkpoint: str | os.PathLike[str], env_id: str | None = None) -> tuple[Any, Any, str]:
    """The trained policy stored in a run dir / checkpoint: ``(policy, config, checkpoint dir)``."""
    import marft_envs
    from marft_algos.checkpoint import find_checkpoint
    from marft_algos.config import config_from_dict
    from marft_algos.models import LoraSettings, TeamPolicy
    from marft_algos.trainer import get_algorithm

    ckpt = find_checkpoint(checkpoint)
    data = json.loads((Path(ckpt) / "config.json").read_text())
    spec = get_algorithm(data.get("algo", "grpo"))
    config = config_from_dict(spec.config_cls, data)
    agents = list(marft_envs.make(env_id or config.env_id, **({} if env_id else config.env_kwargs)).possible_agents)
    # As marft_algos.trainer.make_policy, but with a seed != the training one: TeamPolicy.load
    # rejects a state equal to the freshly initialised adapter ("matched no parameter"),
    # which an adapter that never moved (all-zero advantages) would trigger.
    base: Any = {a: config.model_per_agent.get(a, config.model) for a in agents} if config.model_per_agent else config.model
    kwargs: dict[str, Any] = {"base": base, "mode": config.mode, "seed": 987_654_321,
                              "lora": LoraSettings(r=config.lora_r, alpha=config.lora_alpha, dropout=config.lora_dropout)}
    if config.device != "auto":
        kwargs["device"] = config.device
    if config.dtype is not None:
        kwargs["dtype"] = config.dtype
    policy = TeamPolicy(list(agents), **kwargs)
    policy.load(Path(ckpt) / "policy")
    return policy, config, str(ckpt)
