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
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "CHECKPOINT_PARTS",
    "CheckpointError",
    "save_checkpoint",
    "load_checkpoint",
    "find_checkpoint",
    "verify_checkpoint",
    "read_checkpoint_config",
    "list_checkpoints",
]

#: what a checkpoint holds, in parts that load independently:
#: weights (policy adapters or full weights, critic / value heads), optimizers (their states,
#: step counts, the fp16 loss scaler), schedulers (their states, the rollback lr scale), rng
#: (global RNG states, the minibatch-order generator), data (the problem stream of the
#: collector), progress (step counter, counters, metrics history, collapse detector)
CHECKPOINT_PARTS = ("weights", "optimizers", "schedulers", "rng", "data", "progress")

MANIFEST = "MANIFEST.json"
LATEST = "latest"


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


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # some filesystems refuse to open dirs; rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_atomic_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _step_name(step: int) -> str:
    return f"step-{step:08d}"


def save_checkpoint(trainer: Any, root: str | Path, *, keep: int = 2) -> Path:
    """Write ``trainer``'s full state atomically under ``root``; returns the checkpoint dir."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    name = _step_name(trainer.global_step)
    final = root / name
    tmp = root / f".tmp-{name}-{os.getpid()}-{time.time_ns()}"
    tmp.mkdir()
    try:
        trainer.policy.save(tmp / "policy")
        torch.save(trainer.state_dict(), tmp / "trainer.pt")
        (tmp / "config.json").write_text(json.dumps(trainer.config.to_dict(), indent=2, sort_keys=True))
        files = {}
        for p in sorted(tmp.rglob("*")):
            if p.is_file():
                _fsync_file(p)
                files[str(p.relative_to(tmp))] = {"size": p.stat().st_size, "sha256": _sha256(p)}
        manifest = {"step": trainer.global_step, "algo": trainer.config.algo, "files": files, "time": time.time()}
        with open(tmp / MANIFEST, "w", encoding="utf-8") as fh:
            json.dump(manifest, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        _fsync_dir(tmp)
        if final.exists():  # the same step saved twice (e.g. save_every and the final save)
            trash = root / f".old-{name}-{time.time_ns()}"
            os.rename(final, trash)
            os.rename(tmp, final)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.rename(tmp, final)
        _fsync_dir(root)
        _write_atomic_text(root / LATEST, name + "\n")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _prune(root, keep=keep, protect=name)
    return final


def _prune(root: Path, *, keep: int, protect: str) -> None:
    if keep <= 0:
        return
    ckpts = list_checkpoints(root)
    for p in ckpts[:-keep]:
        if p.name != protect:
            shutil.rmtree(p, ignore_errors=True)
    for p in root.glob(".tmp-*"):  # leftovers of crashed saves by dead processes
        if p.is_dir() and f"-{os.getpid()}-" not in p.name:
            shutil.rmtree(p, ignore_errors=True)


def verify_checkpoint(path: str | Path, *, hashes: bool = True) -> dict[str, Any]:
    """Check the manifest against the files; returns the manifest or raises CheckpointError."""
    path = Path(path)
    mpath = path / MANIFEST
    if not mpath.is_file():
        raise CheckpointError(f"{path} is not a complete checkpoint (no {MANIFEST})")
    try:
        manifest = json.loads(mpath.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{mpath} is corrupt: {e}") from None
    for rel, meta in manifest.get("files", {}).items():
        f = path / rel
        if not f.is_file() or f.stat().st_size != meta["size"]:
            raise CheckpointError(f"{path}: file {rel} is missing or has the wrong size")
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
    verified one. Raises :class:`CheckpointError` when there is none.
    """
    path = Path(path)
    if (path / MANIFEST).is_file():
        verify_checkpoint(path)
        return path
    for root in (path, path / "checkpoints"):
        if not root.is_dir():
            continue
        latest = root / LATEST
        if latest.is_file():
            cand = root / latest.read_text().strip()
            try:
                verify_checkpoint(cand)
                return cand
            except CheckpointError:
                pass
        for cand in reversed(list_checkpoints(root)):
            try:
                verify_checkpoint(cand)
                return cand
            except CheckpointError:
                continue
    raise CheckpointError(f"no complete checkpoint found under {path}")


def read_checkpoint_config(path: str | Path) -> dict[str, Any]:
    """The config dict (with ``"algo"``) stored in the checkpoint that ``path`` resolves to."""
    return json.loads((find_checkpoint(path) / "config.json").read_text())


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
    from marft_algos.seeding import rng_state, set_rng_state

    chosen = check_parts(parts)
    ckpt = find_checkpoint(path)
    outside = None if "rng" in chosen else rng_state()  # loading must not move the caller's RNG
    if "weights" in chosen:
        trainer.policy.load(ckpt / "policy")
    if chosen & {"weights", "optimizers", "schedulers"}:
        # Rebuild optimizers on the (possibly re-created) parameters, then load their states.
        trainer.optimizers = trainer.build_optimizers()
        trainer.schedulers = trainer.build_schedulers()
    state = torch.load(ckpt / "trainer.pt", map_location="cpu", weights_only=False)
    trainer.load_state_dict(state, parts=chosen)
    if outside is not None:
        set_rng_state(outside)
    logger = getattr(trainer, "logger", None)
    if "progress" in chosen and logger is not None and hasattr(logger, "truncate_after"):
        logger.truncate_after(trainer.global_step)
    return ckpt
