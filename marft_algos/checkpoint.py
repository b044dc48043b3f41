"""Atomic checkpoints that resume a run exactly.

Layout under a checkpoints root (``<out_dir>/checkpoints``)::

    step-00000010/
        policy/        every adapter (or full weights), via ``policy.save``
        trainer.pt     ``trainer.state_dict()``: optimizers, schedulers, RNG states,
                       collector (problem stream) state, counters, value heads, ...
        config.json    the run's config (with its algorithm name)
        MANIFEST.json  written last: step, and size + sha256 of every file
    latest             the name of the newest complete checkpoint (updated last)

Atomicity: a checkpoint is written into a hidden temp dir, every file is fsynced,
the manifest is written, then the dir is renamed into place and only then the
``latest`` pointer is replaced (``os.replace`` of a fsynced temp file). A crash at any
point leaves either the previous checkpoint as ``latest`` or the new one complete;
a dir without a valid manifest is never loaded.

Loading in parts: :func:`load_checkpoint` restores any subset of :data:`CHECKPOINT_PARTS`
(``parts=("weights", "optimizers", "schedulers")`` is what collapse recovery rolls back;
the default, everything, resumes a run exactly). A part left out is left as it is, the
global RNG streams included: loading consumes no randomness.

Saving the same step twice swaps the new dir in: the old one is renamed to
``.old-step-N-<pid>-<ns>``, the new one into place, then the old one is removed. A save
(or a resume, :func:`clean_stale`) first restores an ``.old-*`` dir whose step dir is
missing (a kill between the two renames) and removes leftovers of dead processes; temp
dirs of live processes are left alone.

Verification: the manifest must be an object whose ``files`` name every file of the
dir (``trainer.pt``, ``config.json`` and the policy files among them) with an integer
size and a SHA-256 hex digest; a file that is missing, unlisted, of another size or
another hash makes the checkpoint unusable. :func:`find_checkpoint` then falls back to
the newest older one that verifies, with a warning that says why; when none does, its
error lists each checkpoint's problem.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from marft_algos.rundir import ENV_RECORD_KEY, env_record
from marft_algos.seeding import rng_state, set_rng_state

from .fsutil import fsync_dir, write_text_atomic

__all__ = [
    "CHECKPOINT_PARTS",
    "CheckpointError",
    "save_checkpoint",
    "load_checkpoint",
    "find_checkpoint",
    "verify_checkpoint",
    "read_checkpoint_config",
    "run_config",
    "list_checkpoints",
    "clean_stale",
]

#: what a checkpoint holds, in parts that load independently:
#: weights (policy adapters or full weights, critic / value heads), optimizers (their states,
#: step counts, the fp16 loss scaler), schedulers (their states, the rollback lr scale), rng
#: (global RNG states, the minibatch-order generator), data (the problem stream of the
#: collector), progress (step counter, counters, metrics history, collapse detector)
CHECKPOINT_PARTS = ("weights", "optimizers", "schedulers", "rng", "data", "progress")
log = logging.getLogger("marft")

MANIFEST = "MANIFEST.json"
LATEST = "latest"
#: files every checkpoint has (besides ``policy/...``)
REQUIRED_FILES = ("trainer.pt", "config.json")
#: a temp / swapped-out dir older than this is stale even when its pid is alive (pid reuse)
STALE_AFTER_S = 6 * 3600
_LEFTOVER = re.compile(r"^\.(tmp|old)-(step-\d+)-(\d+)(?:-(\d+))?$")


class CheckpointError(RuntimeError):
    """No usable checkpoint, or a checkpoint that fails verification."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def _no_fault(point: str, step: int) -> None:
    """No fault injected."""


def _step_name(step: int) -> str:
    return f"step-{step:08d}"


def run_config(config: Any) -> dict[str, Any]:
    """A run's config.json: the settings (with ``algo``) and the env as it was resolved
    (:func:`marft_algos.rundir.env_record`), which a resume compares."""
    data = config.to_dict()
    record = env_record(config.env_id, config.env_kwargs) if getattr(config, "env_id", None) else None
    if record is not None:
        data[ENV_RECORD_KEY] = record
    return data


def save_checkpoint(trainer: Any, root: str | Path, *, keep: int = 2) -> Path:
    """Write ``trainer``'s full state atomically under ``root``; returns the checkpoint dir.

    ``trainer.fault(point, step)``, when the trainer has one, is called at the named points of
    the write (``save:policy`` ... ``save:latest``): the crash tests kill the process there."""
    fault = getattr(trainer, "fault", None) or _no_fault

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    clean_stale(root)
    step = trainer.global_step
    name = _step_name(step)
    final = root / name
    tmp = root / f".tmp-{name}-{os.getpid()}-{time.time_ns()}"
    tmp.mkdir()
    # FSDP: full tensors in the single-process format (every rank gathers; re-entrant)
    unsharded = getattr(trainer, "unsharded_state", contextlib.nullcontext)
    try:
        with unsharded():
            trainer.policy.save(tmp / "policy")
            fault("save:policy", step)
            torch.save(trainer.state_dict(), tmp / "trainer.pt")
        fault("save:trainer", step)
        (tmp / "config.json").write_text(json.dumps(run_config(trainer.config), indent=2, sort_keys=True))
        files = {}
        for p in sorted(tmp.rglob("*")):
            if p.is_file():
                _fsync_file(p)
                files[p.relative_to(tmp).as_posix()] = {"size": p.stat().st_size, "sha256": _sha256(p)}
        manifest = {"step": step, "algo": trainer.config.algo, "agents": list(getattr(trainer, "agents", [])),
                    "files": files, "time": time.time()}
        with open(tmp / MANIFEST, "w", encoding="utf-8") as fh:
            json.dump(manifest, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        fsync_dir(tmp)
        fault("save:manifest", step)
        if final.exists():  # the same step saved twice (e.g. save_every and the final save)
            trash = root / f".old-{name}-{os.getpid()}-{time.time_ns()}"
            os.rename(final, trash)
            fault("save:swap", step)  # a kill here leaves trash (restored by clean_stale)
            os.rename(tmp, final)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.rename(tmp, final)
        fsync_dir(root)
        fault("save:latest", step)
        write_text_atomic(root / LATEST, name + "\n")
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if e.filename is None:  # a write() error names no file: name the checkpoint
            raise OSError(e.errno, e.strerror, str(final)) from e
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _prune(root, keep=keep, protect=name)
    return final


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    except OSError:
        return False
    return True


def _stale(p: Path) -> bool:
    """A temp / swapped-out dir of this process, of a dead process, or older than STALE_AFTER_S."""
    m = _LEFTOVER.match(p.name)
    if m is None:
        return False
    if m.group(4) is None:  # an old-style name without a pid
        return True
    pid = int(m.group(3))
    try:
        age = time.time() - p.stat().st_mtime
    except FileNotFoundError:
        return False
    return pid == os.getpid() or not _pid_alive(pid) or age > STALE_AFTER_S


def clean_stale(root: str | Path) -> None:
    """Finish or undo what a killed save left under ``root`` (call with the run dir locked).

    An ``.old-step-N-*`` dir whose ``step-N`` is missing is put back (a kill between the two
    renames of a swap); other ``.old-*`` and ``.tmp-*`` dirs of this process, of dead
    processes, or older than :data:`STALE_AFTER_S` are removed.
    """
    root = Path(root)
    if not root.is_dir():
        return
    for p in sorted(root.glob(".old-step-*")):
        m = _LEFTOVER.match(p.name)
        if m is None or not _stale(p):
            continue
        final = root / m.group(2)
        if not final.exists():
            try:
                verify_checkpoint(p, hashes=False)
            except CheckpointError:
                shutil.rmtree(p, ignore_errors=True)
                continue
            os.rename(p, final)
            log.warning("%s: restored %s, left by a save that was interrupted", final, p.name)
        else:
            shutil.rmtree(p, ignore_errors=True)
    for p in root.glob(".tmp-step-*"):
        if p.is_dir() and _stale(p):
            shutil.rmtree(p, ignore_errors=True)


def _prune(root: Path, *, keep: int, protect: str) -> None:
    if keep > 0:
        ckpts = list_checkpoints(root)
        for p in ckpts[:-keep]:
            if p.name != protect:
                shutil.rmtree(p, ignore_errors=True)
    for p in root.glob(".tmp-*"):  # leftovers of crashed saves (never a live process's save)
        if p.is_dir() and _stale(p):
            shutil.rmtree(p, ignore_errors=True)


def _is_sha256(v: Any) -> bool:
    return isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v)


def _read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of ``path``, checked for shape (not against the files)."""
    mpath = path / MANIFEST
    if not mpath.is_file():
        raise CheckpointError(f"{path} is not a complete checkpoint (no {MANIFEST})")
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{mpath} is corrupt: {e}") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise CheckpointError(f"{mpath} is not a valid manifest (expected an object with a 'files' object)")
    step = manifest.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointError(f"{mpath} is not a valid manifest ('step' must be an integer >= 0, got {step!r})")
    files = manifest["files"]
    for rel, meta in files.items():
        parts = Path(rel).parts
        if Path(rel).is_absolute() or ".." in parts or not parts:
            raise CheckpointError(f"{mpath}: file entry {rel!r} points outside the checkpoint")
        size = meta.get("size") if isinstance(meta, dict) else None
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or not _is_sha256(meta.get("sha256")):
            raise CheckpointError(f"{mpath}: entry {rel!r} is malformed (expected {{\"size\": int, \"sha256\": hex digest}}, got {meta!r})")
    missing = [f for f in REQUIRED_FILES if f not in files]
    if not any(rel.startswith("policy/") for rel in files):
        missing.append("policy/...")
    if missing:
        raise CheckpointError(f"{mpath} does not list {', '.join(missing)}: not a complete checkpoint")
    return manifest


def verify_checkpoint(path: str | Path, *, hashes: bool = True) -> dict[str, Any]:
    """Check the manifest against the files; returns the manifest or raises CheckpointError.

    Every file of the dir must be listed, with its size and (``hashes=True``) SHA-256.
    """
    path = Path(path)
    manifest = _read_manifest(path)
    files = manifest["files"]
    on_disk = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()} - {MANIFEST}
    unlisted = sorted(on_disk - set(files))
    if unlisted:
        raise CheckpointError(f"{path}: file {unlisted[0]} is not listed in its {MANIFEST} (unverifiable)")
    for rel, meta in files.items():
        f = path / rel
        if not f.is_file():
            raise CheckpointError(f"{path}: file {rel} is missing")
        if f.stat().st_size != meta["size"]:
            raise CheckpointError(f"{path}: file {rel} has the wrong size ({f.stat().st_size} bytes, manifest: {meta['size']})")
        if hashes and _sha256(f) != meta["sha256"]:
            raise CheckpointError(f"{path}: file {rel} fails its checksum")
    return manifest


def list_checkpoints(root: str | Path) -> list[Path]:
    """Complete-looking checkpoint dirs under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step-*") if p.is_dir() and (p / MANIFEST).is_file())


def find_checkpoint(path: str | Path) -> Path:
    """Resolve a checkpoint dir from a checkpoint dir, a checkpoints root or a run dir.

    Follows ``latest`` when it points to a verified checkpoint, else takes the newest
    verified one, with a warning naming what was skipped and why. Raises
    :class:`CheckpointError` when there is none (listing each checkpoint's problem).
    """
    path = Path(path)
    if (path / MANIFEST).is_file() or (path.name.startswith("step-") and path.is_dir()):
        verify_checkpoint(path)
        return path
    problems: list[str] = []
    for root in (path, path / "checkpoints"):
        if not root.is_dir():
            continue
        order: list[Path] = []
        latest = root / LATEST
        if latest.is_file():
            named = latest.read_text(encoding="utf-8", errors="replace").strip()
            cand = root / named
            if re.fullmatch(r"step-\d+", named) and cand.is_dir():
                order.append(cand)
            else:
                problems.append(f"{latest} names {named!r}, which is not a checkpoint dir here")
        order += [p for p in sorted(root.glob("step-*"), reverse=True) if p.is_dir() and p not in order]
        for cand in order:
            try:
                verify_checkpoint(cand)
            except CheckpointError as e:
                problems.append(str(e))
                continue
            if problems:
                log.warning("using the older checkpoint %s: %s", cand, "; ".join(problems))
            return cand
    if problems:
        raise CheckpointError(f"no usable checkpoint under {path}: " + "; ".join(problems))
    raise CheckpointError(f"no complete checkpoint found under {path}")


def read_checkpoint_config(path: str | Path) -> dict[str, Any]:
    """The config dict (with ``"algo"``) stored in the checkpoint that ``path`` resolves to."""
    cpath = find_checkpoint(path) / "config.json"
    try:
        data = json.loads(cpath.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{cpath} is corrupt: {e}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{cpath} is not a config (expected a JSON object)")
    return data


def check_parts(parts: Any) -> frozenset[str]:
    """``parts`` (None = all) as a set, checked against :data:`CHECKPOINT_PARTS`."""
    if parts is None:
        return frozenset(CHECKPOINT_PARTS)
    chosen = frozenset([parts] if isinstance(parts, str) else parts)
    unknown = sorted(chosen - set(CHECKPOINT_PARTS))
    if unknown:
        raise ValueError(f"unknown checkpoint parts {unknown}; choose from {list(CHECKPOINT_PARTS)}")
    return chosen


def load_checkpoint(trainer: Any, path: str | Path, *, parts: Any = None) -> Path:
    """Restore ``trainer`` from the checkpoint ``path`` resolves to; returns its dir.

    ``parts``: a subset of :data:`CHECKPOINT_PARTS` (default: all, an exact resume). The
    optimizers are rebuilt when the weights are loaded (the policy may re-create its
    parameters); without the ``optimizers`` part they then start fresh. The metrics log
    is cut back to the checkpoint's step only when ``progress`` is loaded.
    """
    chosen = check_parts(parts)
    ckpt = find_checkpoint(path)
    outside = None if "rng" in chosen else rng_state()  # loading must not move the caller's RNG
    if "weights" in chosen:
        with getattr(trainer, "loading_weights", contextlib.nullcontext)():  # FSDP: full weights into the shards
            trainer.policy.load(ckpt / "policy")
    if chosen & {"weights", "optimizers", "schedulers"}:
        # Rebuild optimizers on the (possibly re-created) parameters, then load their states.
        trainer.optim = trainer.build_optimizers()
    state = torch.load(ckpt / "trainer.pt", map_location="cpu", weights_only=False)
    trainer.load_state_dict(state, parts=chosen)
    if outside is not None:
        set_rng_state(outside)
    logger = getattr(trainer, "logger", None)
    if "progress" in chosen and logger is not None and hasattr(logger, "truncate_after"):
        logger.truncate_after(trainer.global_step)
    return ckpt
