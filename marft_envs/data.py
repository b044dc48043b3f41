"""Dataset loading for the math tasks: local JSONL first, Hugging Face Hub otherwise.

Resolution order for :func:`load_split`:

1. an explicit ``data_dir=`` argument,
2. the ``MARFT_DATA_DIR`` environment variable,
3. the Hugging Face Hub through ``datasets.load_dataset``.

Local layout (as in ``../shared/data``)::

    <dir>/gsm8k/{train,test}.jsonl          question, answer ("... #### 42")
    <dir>/math/{train,test}.jsonl           problem, solution, level, type
    <dir>/math/test500.jsonl                problem, solution, answer, subject, level, unique_id

Hub ids: ``openai/gsm8k`` (config ``main``), ``EleutherAI/hendrycks_math`` (one
config per subject, concatenated in a fixed order), ``HuggingFaceH4/MATH-500``.
Loaded splits are cached per process (rows are shared: treat them read-only).
Nothing is ever copied into the repository.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

__all__ = [
    "DATA_DIR_ENV",
    "SPLITS",
    "DataNotFoundError",
    "clear_cache",
    "load_split",
    "resolve_data_dir",
]

logger = logging.getLogger(__name__)

#: Environment variable naming a local data directory.
DATA_DIR_ENV = "MARFT_DATA_DIR"

#: Known data sets and their splits.
SPLITS: dict[str, tuple[str, ...]] = {
    "gsm8k": ("train", "test"),
    "math": ("train", "test", "test500"),
}

_MATH_SUBJECTS = (
    "algebra",
    "counting_and_probability",
    "geometry",
    "intermediate_algebra",
    "number_theory",
    "prealgebra",
    "precalculus",
)
_HUB_IDS = {
    ("gsm8k", "train"): "openai/gsm8k",
    ("gsm8k", "test"): "openai/gsm8k",
    ("math", "train"): "EleutherAI/hendrycks_math",
    ("math", "test"): "EleutherAI/hendrycks_math",
    ("math", "test500"): "HuggingFaceH4/MATH-500",
}
#: Seconds to wait for the Hub to answer before declaring it unreachable.
HUB_PROBE_TIMEOUT = 3.0

_CACHE: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
_LOCK = threading.Lock()


class DataNotFoundError(FileNotFoundError):
    """Neither a local copy nor the Hugging Face Hub could provide a split."""


def resolve_data_dir(data_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The local data directory in force: ``data_dir``, else ``$MARFT_DATA_DIR``, else None."""
    if data_dir is not None and str(data_dir) != "":
        return Path(data_dir).expanduser()
    env = os.environ.get(DATA_DIR_ENV)
    return Path(env).expanduser() if env else None


def clear_cache() -> None:
    """Forget the splits loaded by this process."""
    with _LOCK:
        _CACHE.clear()


def _check(name: str, split: str) -> None:
    if name not in SPLITS:
        raise ValueError(f"unknown data set {name!r}; known: {sorted(SPLITS)}")
    if split not in SPLITS[name]:
        raise ValueError(f"unknown split {split!r} of {name!r}; known: {list(SPLITS[name])}")


def _local_path(root: Path, name: str, split: str) -> Path:
    return root / name / f"{split}.jsonl"


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({exc})") from exc
    return rows


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in (
        "1",
        "true",
        "yes",
        "on",
    ) or os.environ.get("HF_DATASETS_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def _hub_reachable(timeout: float = HUB_PROBE_TIMEOUT) -> bool:
    """A TCP connect to the Hub endpoint: fails in seconds offline, where
    ``load_dataset`` would retry for half a minute or more."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    url = urlparse(endpoint)
    host = url.hostname or "huggingface.co"
    port = url.port or (443 if url.scheme != "http" else 80)
    if os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy"):
        return True  # behind a proxy a direct probe proves nothing: let datasets try
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _missing_error(name: str, split: str, root: Path | None, reason: str) -> DataNotFoundError:
    hub_id = _HUB_IDS[(name, split)]
    where = (
        f"no file {_local_path(root, name, split)}"
        if root is not None
        else f"no local data directory (data_dir=None and ${DATA_DIR_ENV} unset)"
    )
    return DataNotFoundError(
        f"cannot load {name}/{split}: {where}, and the Hugging Face Hub failed ({reason}).\n"
        f"Fix it either way:\n"
        f"  1. local files: pass data_dir=<dir> or set {DATA_DIR_ENV}=<dir>, with "
        f"<dir>/{name}/{split}.jsonl (layout: see marft_envs/data.py);\n"
        f"  2. the Hub: give this machine internet access to the dataset {hub_id!r} "
        f"(or a populated Hugging Face cache with HF_HUB_OFFLINE=1)."
    )


def _load_hub(name: str, split: str) -> list[dict[str, Any]]:
    from datasets import concatenate_datasets, load_dataset

    if name == "gsm8k":
        ds = load_dataset("openai/gsm8k", "main", split=split)
    elif split == "test500":
        ds = load_dataset("HuggingFaceH4/MATH-500", split="test")
    else:
        parts = [load_dataset("EleutherAI/hendrycks_math", s, split=split) for s in _MATH_SUBJECTS]
        ds = concatenate_datasets(parts)
    return [dict(row) for row in ds]


def _load_hub_or_explain(name: str, split: str, root: Path | None) -> list[dict[str, Any]]:
    """The Hub copy, failing fast (seconds, not minutes) with advice when offline."""
    if _hub_offline():
        import datasets.config

        if not datasets.config.HF_HUB_OFFLINE:
            # datasets was imported before HF_HUB_OFFLINE was set and would go
            # online anyway (retrying for ~30 s): honour the variable instead.
            raise _missing_error(name, split, root, "HF_HUB_OFFLINE is set; no download tried")
    elif not _hub_reachable():
        raise _missing_error(name, split, root, "the Hub is unreachable from this machine")
    try:
        return _load_hub(name, split)
    except Exception as exc:  # noqa: BLE001 - any Hub failure gets the same advice
        raise _missing_error(name, split, root, f"{type(exc).__name__}: {exc}") from exc


def load_split(
    name: str, split: str, data_dir: str | os.PathLike[str] | None = None
) -> list[dict[str, Any]]:
    """Rows of data set ``name`` (``"gsm8k"`` or ``"math"``), split ``split``, as dicts.

    ``gsm8k``: ``train``/``test`` with ``question``, ``answer``. ``math``:
    ``train``/``test`` with ``problem``, ``solution``, ``level``, ``type``, and
    ``test500`` (MATH-500) with ``answer``, ``subject``, ``unique_id`` as well.
    Raises :class:`DataNotFoundError` naming both fixes when no source works.
    The returned list is cached and shared: do not mutate it.
    """
    _check(name, split)
    root = resolve_data_dir(data_dir)
    key = (name, split, str(root.resolve()) if root is not None else "<hub>")
    with _LOCK:
        cached = _CACHE.get(key)
    if cached is not None:
        return cached
    path = _local_path(root, name, split) if root is not None else None
    if path is not None and path.is_file():
        rows = _read_jsonl(path)
    else:
        if path is not None:
            logger.warning("no local file %s; trying the Hugging Face Hub", path)
        rows = _load_hub_or_explain(name, split, root)
    with _LOCK:
        _CACHE.setdefault(key, rows)
        return _CACHE[key]
