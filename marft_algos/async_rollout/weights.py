"""Trainer -> worker weight sync through shared memory, tagged with a policy version.

The trainer owns one shared-memory CPU buffer per trained parameter (each parameter once,
in team order: roles naming one adapter share it). At the start of every step (after the
previous update) it copies its weights in under a lock and bumps ``(epoch, version)``; a worker copies them out under the
same lock before it starts a batch, so it never reads a half-written update. ``version``
is the trainer's ``global_step`` when the weights were published (the number of updates
they carry); ``epoch`` changes when the trainer drops its in-flight batches (a resume, a
rollback), so a worker abandons the tasks issued before. Only trained parameters travel
(LoRA adapters: a few MB; full fine-tuning: the whole model, still one memcpy).
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Iterable, Sequence
from typing import Any

import torch

__all__ = ["SharedWeights", "synced_parameters"]


def synced_parameters(policy: Any, roles: Iterable[str]) -> list[torch.nn.Parameter]:
    """The trained parameters of ``roles``, each once, in order (the order both sides agree on)."""
    out: list[torch.nn.Parameter] = []
    seen: set[int] = set()
    for role in roles:
        for p in policy.trainable_parameters(role):
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


class SharedWeights:
    """Shared-memory copies of parameters plus the ``(epoch, version)`` they carry.

    Built by the trainer from its parameters; pickled to spawned workers (torch moves the
    buffers to shared memory and the workers map the same pages).
    """

    def __init__(self, params: Sequence[torch.Tensor], ctx: Any = None) -> None:
        ctx = ctx or mp.get_context("spawn")
        self.buffers = [p.detach().to("cpu", copy=True).contiguous().share_memory_() for p in params]
        self.lock = ctx.Lock()
        self._epoch = ctx.Value("q", 0, lock=False)
        self._version = ctx.Value("q", -1, lock=False)  # -1: nothing published yet

    def stamp(self) -> tuple[int, int]:
        """The ``(epoch, version)`` of the published weights (version -1: none yet)."""
        with self.lock:
            return int(self._epoch.value), int(self._version.value)

    def publish(self, params: Sequence[torch.Tensor], epoch: int, version: int) -> None:
        """Copy ``params`` in (same order and shapes as at construction) and stamp them."""
        if len(params) != len(self.buffers):
            raise ValueError(f"publishing {len(params)} tensors into {len(self.buffers)} shared buffers")
        with self.lock, torch.no_grad():
            for buf, p in zip(self.buffers, params, strict=True):
                buf.copy_(p.detach())
            self._epoch.value, self._version.value = int(epoch), int(version)

    def read_into(self, params: Sequence[torch.Tensor]) -> tuple[int, int]:
        """Copy the published weights into ``params``; returns their ``(epoch, version)``."""
        if len(params) != len(self.buffers) or any(p.shape != b.shape for p, b in zip(params, self.buffers, strict=True)):
            raise ValueError(
                "the worker's policy does not match the trainer's (trained parameter count or shapes differ): "
                "workers build their policy from the config (model, mode, lora_r, ...); pass no custom policy= "
                "to the trainer with rollout_workers > 0, or one built exactly like make_policy(config)"
            )
        with self.lock, torch.no_grad():
            for buf, p in zip(self.buffers, params, strict=True):
                p.copy_(buf)
            return int(self._epoch.value), int(self._version.value)
