"""Benchmark suites: data (a name -> {team: env id} + split + env kwargs + size limit).

Third parties add one without touching this package: ``--env ID`` (any registered id, also
``module:Id-v0``), ``--suite-file suites.json`` or :func:`register_suite`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marft_algos.evaluation.errors import LeaderboardError

__all__ = ["Suite", "SUITES", "BUILTIN_TEAMS", "register_suite", "load_suite_file"]

#: The teams of the built-in suites (``--teams`` selects among a suite's teams).
BUILTIN_TEAMS = ("solo", "duo", "trio")


@dataclass
class Suite:
    """A benchmark suite: the env id of each team on one task, its split, kwargs and size."""

    name: str
    envs: dict[str, str]
    split: str = "test"
    kwargs: dict[str, Any] = field(default_factory=dict)
    limit: int = 200

    @classmethod
    def for_task(cls, name: str, task: str, split: str = "test", limit: int = 200, **kwargs: Any) -> Suite:
        """The built-in ``{task}-{solo,duo,trio}-v0`` ids."""
        return cls(name, {t: f"{task}-{t}-v0" for t in BUILTIN_TEAMS}, split, dict(kwargs), limit)


SUITES: dict[str, Suite] = {
    "arith": Suite.for_task("arith", "arith", "test", 200),  # of ~5,000 test problems
    "gsm8k": Suite.for_task("gsm8k", "gsm8k", "test", 1319),
    "math500": Suite.for_task("math500", "math", "test500", 500),
    "humaneval": Suite.for_task("humaneval", "code", "test", 164),
}


def register_suite(suite: Suite, *, overwrite: bool = False) -> Suite:
    """Add a suite (e.g. from a third-party package) under ``suite.name``."""
    if suite.name in SUITES and not overwrite:
        raise ValueError(f"suite {suite.name!r} exists; pass overwrite=True to replace it")
    SUITES[suite.name] = suite
    return suite


def load_suite_file(path: str | Path) -> list[Suite]:
    """``{"name": {"envs": {team: id}, "split": ..., "kwargs": {...}, "limit": N}}``; registered and returned."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise LeaderboardError(f"--suite-file {path}: {e}") from None
    if not isinstance(data, dict):
        raise LeaderboardError(f"--suite-file {path}: expected a JSON object {{name: {{envs: {{team: id}}, ...}}}}")
    out = []
    for name, d in data.items():
        if not isinstance(d, dict) or not isinstance(d.get("envs"), dict) or not d["envs"]:
            raise LeaderboardError(f"--suite-file {path}: suite {name!r} needs a non-empty 'envs' object {{team: env id}}")
        suite = Suite(name, dict(d["envs"]), d.get("split", "test"), dict(d.get("kwargs", {})), int(d.get("limit", 200)))
        out.append(register_suite(suite, overwrite=True))
    return out
