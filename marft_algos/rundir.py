"""Run directories: one run at a time, fresh runs into empty dirs, resumes that keep their settings.

- :class:`RunDirLock`: an ``fcntl.flock`` on ``<out_dir>/.marft.lock`` held for the run's
  life (re-entrant within a process); a second run on the same directory stops with the
  holder's pid. The lock file is removed when the lock is released.
- :func:`check_new_run_dir`: a run without ``--resume`` goes into a missing or empty dir.
- :func:`resume_changes`: compares a checkpoint's config with the config of the resuming
  run. Settings that fix what the saved state means (env, algorithm, model, team, LoRA
  shape, the data layout, the seed) cannot change: :class:`ResumeConfigError` names each
  one (old -> new). Every other change is applied, and reported; the optimizer settings
  that the saved optimizer states carry (``lr``, ``lr_per_agent``, ``critic_lr``,
  ``weight_decay``, ``adam_eps``) are written into them by
  :func:`apply_optimizer_settings`.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import hashlib
import importlib.util
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import marft_envs
from marft_algos.config import ConfigError, config_from_dict
from marft_algos.optim import INTERNAL_KEY_PREFIX

try:
    import fcntl
except ImportError:  # pragma: no cover  (Windows: no advisory locks; runs are not protected)
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "LOCK_NAME",
    "FIXED_ON_RESUME",
    "OPTIMIZER_SETTINGS",
    "RunDirError",
    "ResumeConfigError",
    "RunDirLock",
    "ResumeChanges",
    "check_new_run_dir",
    "has_checkpoint",
    "unsaved_run_outputs",
    "remove_unsaved_run",
    "RUN_OUTPUTS",
    "resume_changes",
    "apply_optimizer_settings",
    "ENV_RECORD_KEY",
    "env_record",
]

LOCK_NAME = ".marft.lock"

#: settings that fix what a checkpoint's state means: a resume must keep them
FIXED_ON_RESUME = (
    "algo", "env_id", "env_kwargs", "model", "model_per_agent", "mode", "lora_r", "lora_alpha", "lora_dropout",
    "num_envs", "group_size", "seed", "critic_per_agent", "critic_lora",
)
#: settings held in the saved optimizer states: a resume writes the new values into them
OPTIMIZER_SETTINGS = ("lr", "lr_per_agent", "critic_lr", "weight_decay", "adam_eps")


class RunDirError(RuntimeError):
    """A run directory that is in use, already holds a run, or is not a directory."""


class ResumeConfigError(ConfigError):
    """A resume whose settings differ from the checkpoint's where they cannot change."""


# --------------------------------------------------------------------------------------
# the lock
# --------------------------------------------------------------------------------------

_HELD: dict[str, list[int]] = {}  # resolved dir -> [fd, count] (re-entrant within a process)


class RunDirLock:
    """An exclusive lock on a run directory (created if missing); use as a context manager."""

    def __init__(self, out_dir: str | Path) -> None:
        self.dir = Path(out_dir)
        self.path = self.dir / LOCK_NAME
        self._key: str | None = None

    def acquire(self) -> RunDirLock:
        """Take the lock, or raise :class:`RunDirError` naming the holder's pid."""
        if self._key is not None:
            return self
        if self.dir.exists() and not self.dir.is_dir():
            raise RunDirError(f"run directory {self.dir} is a file, not a directory; choose another --out")
        self.dir.mkdir(parents=True, exist_ok=True)
        key = str(self.dir.resolve())
        if key in _HELD:
            _HELD[key][1] += 1
            self._key = key
            return self
        if fcntl is None:  # pragma: no cover
            _HELD[key] = [-1, 1]
            self._key = key
            return self
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                holder = _read_pid(fd)
                os.close(fd)
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                raise RunDirError(
                    f"run directory {self.dir} is in use by another run (pid {holder or '?'}); "
                    "wait for it to end, stop it, or choose another --out"
                ) from None
            try:  # the holder we waited for may have removed the file: lock the current one
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        _HELD[key] = [fd, 1]
        self._key = key
        return self

    def release(self) -> None:
        """Release the lock (the outermost release removes the lock file)."""
        key, self._key = self._key, None
        if key is None or key not in _HELD:
            return
        _HELD[key][1] -= 1
        if _HELD[key][1] > 0:
            return
        fd = _HELD.pop(key)[0]
        if fd < 0:  # pragma: no cover
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # while still held: a waiter re-checks the inode
        os.close(fd)

    def __enter__(self) -> RunDirLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _read_pid(fd: int) -> str:
    try:
        return os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        return ""


#: what a training run writes into its directory (a dir holding only these, and no
#: checkpoint, is a run that stopped before its first save: it can start again in place)
RUN_OUTPUTS = frozenset({
    "config.json", "metrics.jsonl", "transcripts.jsonl", "learning_curve.png", "tb", "checkpoints",
    "recovery", "recovery.jsonl", "results.json", "results.txt",
})


def has_checkpoint(out_dir: str | Path) -> bool:
    """Whether ``<out_dir>/checkpoints`` holds any ``step-N`` checkpoint (verified or not)."""
    root = Path(out_dir) / "checkpoints"
    return root.is_dir() and any(p.name.startswith("step-") for p in root.iterdir())


def unsaved_run_outputs(out_dir: str | Path) -> list[Path]:
    """The outputs of a run that stopped before its first checkpoint (Ctrl-C, a crash), or ``[]``.

    Non-empty only when the dir holds a run's ``config.json``, no checkpoint, and nothing
    but what a run writes (:data:`RUN_OUTPUTS`): nothing there can be resumed, and a new
    run may replace it (:func:`remove_unsaved_run`).
    """
    p = Path(out_dir)
    if not p.is_dir() or not (p / "config.json").is_file() or has_checkpoint(p):
        return []
    entries = [e for e in p.iterdir() if e.name != LOCK_NAME]
    if any(e.name not in RUN_OUTPUTS for e in entries):
        return []
    return sorted(entries)


def remove_unsaved_run(out_dir: str | Path) -> list[str]:
    """Remove the outputs of a run that never saved a checkpoint; returns their names."""
    removed = []
    for e in unsaved_run_outputs(out_dir):
        if e.is_dir() and not e.is_symlink():
            shutil.rmtree(e)
        else:
            e.unlink()
        removed.append(e.name)
    return removed


def check_new_run_dir(out_dir: str | Path) -> None:
    """A new run (no ``--resume``) needs a missing or empty directory, or one that holds only
    a run that stopped before its first checkpoint (see :func:`unsaved_run_outputs`)."""
    p = Path(out_dir)
    if p.exists() and not p.is_dir():
        raise RunDirError(f"--out {p} is a file, not a directory; choose another --out")
    if p.is_dir():
        entries = sorted(e.name for e in p.iterdir() if e.name != LOCK_NAME)
        if entries and not unsaved_run_outputs(p):
            shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
            if has_checkpoint(p):
                what = "continue that run with --resume, or choose another --out"
            else:
                what = (f"it holds no checkpoint, but also files that a run does not write; move them out "
                        f"(or delete {p}) to start a run there, or choose another --out")
            raise RunDirError(f"run directory {p} is not empty ({shown}); {what}")


# --------------------------------------------------------------------------------------
# resume: compare settings
# --------------------------------------------------------------------------------------

_MISSING = object()


@dataclass
class ResumeChanges:
    """Settings that differ between a checkpoint and the resuming run: ``"name: old -> new"`` lines."""

    refused: list[str] = field(default_factory=list)
    applied: list[str] = field(default_factory=list)


def _show(v: Any) -> str:
    return "(unset)" if v is _MISSING else json.dumps(v, sort_keys=True, default=str)


def _normalised(saved: dict[str, Any], config: Any) -> dict[str, Any]:
    """The saved settings as the current config class writes them (defaults filled)."""
    if saved.get("algo") != config.algo:
        return dict(saved)
    try:
        return config_from_dict(type(config), {k: v for k, v in saved.items() if k != "algo"}).to_dict()
    except (ConfigError, TypeError):
        return dict(saved)


def resume_changes(saved: dict[str, Any], config: Any, *, saved_agents: list[str] | None = None,
                   agents: list[str] | None = None, where: str | Path = "the checkpoint") -> ResumeChanges:
    """Compare a checkpoint's config dict (``saved``) with the resuming ``config``.

    Raises :class:`ResumeConfigError` with one line per setting that cannot change (see
    :data:`FIXED_ON_RESUME`; also the team, when both agent lists are given); returns the
    other changes (applied by the resumed run). ``out_dir`` is not compared.
    """
    env_lines = env_changes(saved.get(ENV_RECORD_KEY), env_record(config.env_id, config.env_kwargs)) \
        if ENV_RECORD_KEY in saved else []
    saved = {k: v for k, v in saved.items() if k != ENV_RECORD_KEY}
    old, new = _normalised(saved, config), config.to_dict()
    same_algo = old.get("algo") == new.get("algo")
    out = ResumeChanges()
    for key in sorted(set(old) | set(new)):
        if key == "out_dir":
            continue
        a, b = old.get(key, _MISSING), new.get(key, _MISSING)
        if a == b:
            continue
        line = f"{key}: {_show(a)} -> {_show(b)}"
        if key in FIXED_ON_RESUME:
            out.refused.append(line)
        elif same_algo:
            out.applied.append(line)
    if saved_agents is not None and agents is not None and list(saved_agents) != list(agents):
        out.refused.append(f"team (agents): {_show(list(saved_agents))} -> {_show(list(agents))}")
    if env_lines and not out.refused:
        lines = "\n".join("  " + x for x in env_lines)
        raise ResumeConfigError(
            f"cannot resume from {where}: the environment changed since the checkpoint was saved (its state was "
            f"trained on the old one, and the problem stream would change mid-run):\n{lines}\n"
            "restore the env as it was (its registration, kwargs and program), or start a new run with another --out"
        )
    out.refused += env_lines
    if out.refused:
        lines = "\n".join("  " + x for x in out.refused)
        raise ResumeConfigError(
            f"cannot resume from {where}: these settings differ from the checkpoint's and cannot change on resume:\n{lines}\n"
            "resume with the run's settings (its config.json), or start a new run with another --out"
        )
    return out


#: the key of config.json (a run's and a checkpoint's) that records the env as it was resolved
ENV_RECORD_KEY = "env_record"


def _source_sha256(module_name: str) -> str | None:
    """sha256 of a module's source file as it is on disk now (None when it has none)."""
    try:
        found = importlib.util.find_spec(module_name)
        origin = found.origin if found is not None else None
        return hashlib.sha256(Path(origin).read_bytes()).hexdigest() if origin and origin.endswith(".py") else None
    except (ImportError, ValueError, OSError):
        return None


def env_record(env_id: str, env_kwargs: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a checkpoint's state was trained on, beyond ``env_id`` and the user's ``env_kwargs``.

    ``kwargs``: the registered kwargs merged with ``env_kwargs`` (what ``make`` passes on, so
    an id re-registered with other kwargs is seen); ``sources``: the sha256 of the source
    of the env's entry-point module and, for workflow / program envs, of the user program's
    module (``program="module:function"``). marft's own modules are left out: an upgrade of
    the library does not block a resume. None when the env id cannot be resolved.
    """
    try:
        spec = marft_envs.spec(env_id)
    except Exception:  # noqa: BLE001  (an env that does not resolve is reported elsewhere)
        return None
    resolved = {**copy.deepcopy(spec.kwargs), **(env_kwargs or {})}
    modules = []
    entry = spec.entry_point
    modules.append(entry.split(":")[0] if isinstance(entry, str) else getattr(entry, "__module__", None))
    program = resolved.get("program")
    if isinstance(program, str) and ":" in program:
        modules.append(program.split(":")[0])
    sources = {m: _source_sha256(m) for m in modules if m and m.split(".")[0] not in ("marft_envs", "marft_algos")}
    return json.loads(json.dumps({"kwargs": resolved, "sources": sources}, sort_keys=True, default=repr))


def env_changes(saved: dict[str, Any] | None, now: dict[str, Any] | None) -> list[str]:
    """Lines naming what changed in the env between a checkpoint and the resuming run."""
    if not isinstance(saved, dict) or now is None:  # a checkpoint from before the record
        return []
    out = []
    if saved.get("kwargs") != now.get("kwargs"):
        out.append(f"env kwargs (registered kwargs merged with env_kwargs): {_show(saved.get('kwargs'))} -> {_show(now.get('kwargs'))}")
    old_src, new_src = saved.get("sources") or {}, now.get("sources") or {}
    for m in sorted(set(old_src) | set(new_src)):
        a, b = old_src.get(m), new_src.get(m)
        if a != b:
            out.append(f"env source of module {m} (sha256): {(a or '(none)')[:12]} -> {(b or '(none)')[:12]} (the env's or program's code changed)")
    return out


def _saved_lr(saved: dict[str, Any], key: str, agents: list[str]) -> float | None:
    if key in agents:
        return float((saved.get("lr_per_agent") or {}).get(key, saved.get("lr")))
    if key.startswith(INTERNAL_KEY_PREFIX):  # the critic's, a value head's
        v = saved.get("critic_lr")
        return None if v is None else float(v)
    return None


def apply_optimizer_settings(trainer: Any, saved: dict[str, Any]) -> None:
    """Write the resuming config's lr / weight decay / eps into the restored optimizer states.

    Learning rates are scaled by new / saved (so a schedule's position and a collapse
    rollback's lr scale are kept); schedulers' base rates follow.
    """
    c = trainer.config
    agents = list(trainer.agents)
    done: set[int] = set()
    for key, opt in trainer.optimizers.items():
        if id(opt) in done:
            continue
        done.add(id(opt))
        old = _saved_lr(saved, key, agents)
        if key in agents:
            new: float | None = c.agent_lr(key)
        elif key.startswith(INTERNAL_KEY_PREFIX):  # the critic's, a value head's
            new = getattr(c, "critic_lr", None)
        else:
            new = None
        if old and new is not None and new != old:
            factor = new / old
            for g in opt.param_groups:
                g["lr"] *= factor
                if "initial_lr" in g:
                    g["initial_lr"] *= factor
            sched = trainer.schedulers.get(key)
            if sched is not None:
                sched.base_lrs = [lr * factor for lr in sched.base_lrs]
        for g in opt.param_groups:
            if key in agents and saved.get("weight_decay", c.weight_decay) != c.weight_decay:
                g["weight_decay"] = c.weight_decay
            if saved.get("adam_eps", c.adam_eps) != c.adam_eps:
                g["eps"] = c.adam_eps
