"""Helpers shared by the benchmark scripts: versions, tables, memory probes, policies.

Kept dependency-light (no pandas): tables are lists of dicts written as CSV and Markdown.
The report and policy helpers live in :mod:`marft_algos.evaluation` (installed with
marft, so ``marft leaderboard`` has them) and are re-exported here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from marft_algos.config import apply_overrides, config_from_dict
from marft_algos.evaluation import (
    checkpoint_policy,
    fmt,
    markdown_table,
    untrained_policy,
    versions,
    wilson,
    write_csv,
    write_json,
)
from marft_algos.registry import get_algorithm

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
    "timer",
    "child_row",
    "StagedReport",
    "json_option",
    "set_values",
    "algo_config",
    "train_within",
    "load_average",
    "load_text",
]


def load_average() -> list[float] | None:
    """The 1/5/15-minute load averages (None where the OS has none): recorded beside timings."""
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def load_text() -> str:
    """:func:`load_average` as text for a report ("-" where unknown)."""
    load = load_average()
    return ", ".join(f"{x:.2f}" for x in load) if load is not None else "-"


def json_option(flag: str, text: str, example: str) -> Any:
    """``text``, the value of the JSON option ``flag``, parsed; a :class:`SystemExit` that
    shows ``example`` where it is not JSON."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise SystemExit(f"{flag} is not JSON ({e}); e.g. {flag} '{example}'") from None


def set_values(items: Sequence[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` items as a dict, each value parsed as JSON where it parses (else
    kept as text); an item without ``=`` is a :class:`SystemExit` that says so."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set takes KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def algo_config(algo: str, settings: dict[str, Any], sets: Sequence[str] = (), *, skip_unknown_sets: bool = False) -> tuple[Any, Any]:
    """The registered ``algo``'s spec and config: ``settings`` restricted to the fields its
    config class has (a setting shared by every system, such as GRPO's ``group_size``,
    reaches only the algorithms that have it), then the ``--set`` items ``sets`` applied
    (``marft train --set`` syntax). With ``skip_unknown_sets`` an item whose field the config
    lacks is skipped; without, it is a ``ConfigError`` that says so."""
    spec = get_algorithm(algo)
    names = {f.name for f in dataclasses.fields(spec.config_cls)}
    data = {k: v for k, v in settings.items() if k in names}
    if skip_unknown_sets:
        sets = [s for s in sets if s.split("=", 1)[0].split(".", 1)[0] in names]
    return spec, config_from_dict(spec.config_cls, apply_overrides(spec.config_cls, data, list(sets)))


def train_within(trainer: Any, steps: int, minutes: float) -> tuple[int, float]:
    """``trainer.train_step()`` until it has done ``steps`` steps or ``minutes`` have passed;
    returns (steps done, seconds)."""
    t0 = time.perf_counter()
    while trainer.global_step < steps and time.perf_counter() - t0 < 60 * minutes:
        trainer.train_step()
    return trainer.global_step, time.perf_counter() - t0


class StagedReport:
    """A benchmark's outputs, rewritten after every stage (a long run leaves its partial result).

    ``csvs`` maps a table key to (CSV file name, columns); ``tables`` holds each key's rows.
    :meth:`stage` writes one CSV per table, ``<name>.json`` (args, tables, wall time since
    construction, load average, versions) and ``<name>.md``: ``header(wall_s)``, then the
    tables in ``csvs`` order.
    """

    def __init__(self, out: Path, name: str, args: Any, csvs: dict[str, tuple[str, Sequence[str]]],
                 header: Callable[[float], str]) -> None:
        self.out, self.name, self.args, self.csvs, self.header = out, name, args, csvs, header
        self.tables: dict[str, list[dict[str, Any]]] = {key: [] for key in csvs}
        self.t0 = time.time()

    def markdown(self, wall_s: float | None = None) -> str:
        """The Markdown report (``wall_s`` default: the time since construction)."""
        wall_s = time.time() - self.t0 if wall_s is None else wall_s
        parts = [self.header(wall_s), *(markdown_table(self.tables[key], list(columns)) for key, (_, columns) in self.csvs.items())]
        return "\n\n".join(parts) + "\n"

    def stage(self, what: str) -> None:
        """Write every output with the rows so far and print ``[<name>] <what> done at <s> s``."""
        wall_s = time.time() - self.t0
        for key, (fname, columns) in self.csvs.items():
            write_csv(self.out / fname, self.tables[key], list(columns))
        write_json(self.out / f"{self.name}.json",
                   {"args": vars(self.args), **self.tables, "wall_s": wall_s, "loadavg": load_average(), "versions": versions()})
        (self.out / f"{self.name}.md").write_text(self.markdown(wall_s))
        print(f"[{self.name}] {what} done at {wall_s:.0f} s", flush=True)


def summary_stats(xs: Sequence[float]) -> dict[str, float]:
    """min / median / max of repeated measurements (no mean: outliers from a shared CPU).

    >>> summary_stats([3.0, 1.0, 2.0, 10.0])
    {'min': 1.0, 'median': 2.5, 'max': 10.0}
    """
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
    """Peak RSS of this process's own image (``VmHWM``; ``ru_maxrss`` where there is no /proc).

    Linux carries ``ru_maxrss`` across ``execve``: a child started by ``subprocess`` from a
    big parent reports the parent's RSS at fork time, so every probe would read the same.
    ``VmHWM`` belongs to the address space, which exec replaces.
    """
    import resource

    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
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
        """Bytes of the peak above the level at entry (never negative)."""
        return max(0, self.peak - self.start)


@contextmanager
def timer() -> Iterator[dict[str, float]]:
    """``with timer() as t: ...`` sets ``t["s"]`` to the block's seconds (CUDA synchronised)."""
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    try:
        yield out
    finally:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        out["s"] = time.perf_counter() - t0




def child_row(script: str, argv: Sequence[str] | None, flag: str, value: str, *, env: dict[str, str] | None = None) -> dict:
    """Run ``script`` again in a fresh process with ``argv`` (default: this process's own
    arguments) plus ``flag value``; the child's last stdout line is a JSON row, returned.

    A fresh process per measurement keeps peaks and thread pools from leaking between
    configurations. A failed child raises :class:`subprocess.CalledProcessError` (its
    ``stderr`` says why).
    """
    child = [sys.executable, script, *(argv if argv is not None else sys.argv[1:]), flag, value]
    out = subprocess.run(child, capture_output=True, text=True, check=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])
