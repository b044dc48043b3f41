"""Publishing a policy's LoRA adapters to an engine that loads adapters from disk (vLLM).

vLLM loads LoRA adapters only from a folder in peft format, and caches them by integer
id: re-registering an id keeps serving the OLD weights, and ``load_inplace`` has known
stale-buffer bugs. So every update of an adapter is published as a new version:

1. :func:`export_adapter` writes the adapter (``adapter_model.safetensors`` +
   ``adapter_config.json``) to ``<root>/<adapter>/v<version>``;
2. :class:`AdapterVersions` registers it under a NEW, strictly increasing integer id and
   a versioned name ``<adapter>@v<version>``, removes the previous id, deletes the
   previous folder and resets the prefix cache (cached prefixes hold the old weights).

Ids are never reused, also across adapters. The calls go to a *backend* with
``request(name, id, path)``, ``add(request)``, ``remove(id)`` and
``reset_prefix_cache()`` (for vLLM: :class:`marft_algos.engines._vllm_compat.VLLMLoraBackend`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from marft_algos.models.policy import LoadedBase, TeamPolicy

__all__ = ["AdapterVersions", "LoraBackend", "PublishedAdapter", "adapter_fingerprint", "default_adapter_root", "export_adapter"]


class LoraBackend(Protocol):
    """What :class:`AdapterVersions` needs from an engine."""

    def request(self, name: str, lora_id: int, path: str) -> Any:
        """The engine's handle of one adapter version (vLLM: a ``LoRARequest``)."""

    def add(self, request: Any) -> None:
        """Load an adapter version."""

    def remove(self, lora_id: int) -> None:
        """Unload an adapter version."""

    def reset_prefix_cache(self) -> None:
        """Forget cached prefixes."""


@dataclass(frozen=True)
class PublishedAdapter:
    """One registered adapter version."""

    adapter: str
    version: int
    lora_id: int
    name: str
    path: Path
    request: Any


def default_adapter_root(run: str | None = None) -> Path:
    """``/dev/shm/marft-<run>`` (memory-backed) when ``/dev/shm`` is writable, else a
    folder in the system temp dir; ``run`` defaults to a fresh unique name."""
    run = run or f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    return base / f"marft-{run}"


def export_adapter(policy: TeamPolicy, b: LoadedBase, adapter: str, directory: str | os.PathLike[str]) -> Path:
    """Write ``adapter`` of base ``b`` in peft format (what ``PeftModel.from_pretrained``
    and vLLM load): ``adapter_model.safetensors`` and ``adapter_config.json``."""
    # deferred: peft (heavy) and safetensors load only when adapters are synced
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    sd = get_peft_model_state_dict(b.model, adapter_name=adapter)
    save_file({k: v.detach().to("cpu", torch.float32).contiguous() for k, v in sd.items()}, str(out / "adapter_model.safetensors"))
    b.model.peft_config[adapter].save_pretrained(str(out))
    return out


def adapter_fingerprint(params: list[torch.nn.Parameter]) -> tuple[int, ...]:
    """Changes whenever a parameter is written in place (optimizer steps, ``copy_``,
    ``load_state_dict``): torch bumps a tensor's version counter on every in-place op."""
    return tuple(p._version for p in params)


class AdapterVersions:
    """The id/version bookkeeping of published adapters (see the module docstring).

    Args:
        backend: where adapters are registered.
        root: the folder that holds ``<adapter>/v<version>`` exports.
    """

    def __init__(self, backend: LoraBackend, root: str | os.PathLike[str]) -> None:
        self.backend = backend
        self.root = Path(root)
        self.current: dict[str, PublishedAdapter] = {}
        self._next_id = 1
        self._versions: dict[str, int] = {}

    def folder(self, adapter: str) -> Path:
        """Where the next version of ``adapter`` is to be exported."""
        return self.root / adapter / f"v{self._versions.get(adapter, 0) + 1}"

    def publish(self, adapter: str, path: str | os.PathLike[str]) -> PublishedAdapter:
        """Register the export at ``path`` as ``adapter``'s next version; retire the old one."""
        version = self._versions.get(adapter, 0) + 1
        lora_id = self._next_id
        name = f"{adapter}@v{version}"
        request = self.backend.request(name, lora_id, str(path))
        self.backend.add(request)
        self._next_id += 1
        self._versions[adapter] = version
        old = self.current.get(adapter)
        self.current[adapter] = PublishedAdapter(adapter, version, lora_id, name, Path(path), request)
        if old is not None:
            self.backend.remove(old.lora_id)
            shutil.rmtree(old.path, ignore_errors=True)
        self.backend.reset_prefix_cache()
        return self.current[adapter]

    def request(self, adapter: str) -> Any:
        """The backend handle of ``adapter``'s current version."""
        return self.current[adapter].request

    def close(self) -> None:
        """Delete every export (the engine is going away)."""
        shutil.rmtree(self.root, ignore_errors=True)
        self.current.clear()
