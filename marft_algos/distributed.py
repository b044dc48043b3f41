"""Data-parallel and sharded training with ``torch.distributed``: process group, rank helpers, reductions.

Launch any training command under ``torchrun`` (or ``accelerate launch --multi_gpu``, which
runs torchrun): :func:`init_distributed` reads the launcher's environment (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``) and joins the process
group (gloo on CPU, nccl on CUDA). Without a launcher (``WORLD_SIZE`` unset or 1) it returns
a :class:`Distributed` of world size 1 whose methods are no-ops: the single-process run is
unchanged, with no process group and no overhead.

Data parallelism, and why gradients are all-reduced by hand instead of wrapping the policy
in ``DistributedDataParallel``: the trainers step one optimizer per role (and a critic or a
value head per agent), often one role at a time (agent-by-agent). DDP over a multi-adapter
model needs every adapter trainable before wrapping and ``find_unused_parameters=True``,
and flipping ``requires_grad`` afterwards (peft ``set_adapter``) desynchronises ranks
silently. :meth:`Distributed.all_reduce_grads` instead averages the gradients of exactly
the parameters an optimizer is about to step, after ``backward`` and before clipping, in
one flat buffer per optimizer: every rank then clips, checks and steps the same gradients,
so weights and optimizer states stay identical without DDP's bookkeeping.

The average is weighted by each rank's share of the loss's units (tokens for a token-mean
loss, actions otherwise; see :func:`minibatch_weight`), so N ranks with B/N episodes each
produce the gradient one rank computes on all B episodes. Everything a decision depends on
is reduced the same way: metrics (:meth:`Distributed.mean_metrics`), advantage
normalisation statistics (:meth:`Distributed.moments`), non-finite flags
(:meth:`Distributed.any`), minibatch counts (:meth:`Distributed.min_int`).
"""

from __future__ import annotations

import atexit
import datetime
import hashlib
import logging
import os
import sys
import traceback
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

__all__ = [
    "Distributed",
    "init_distributed",
    "env_rank",
    "env_world_size",
    "minibatch_weight",
    "rank_seed",
    "shard_full_model",
    "full_state_dict",
    "abort_rank",
]

log = logging.getLogger("marft")

#: the launcher variables that name this process's place in the job (torchrun / accelerate)
_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


def env_world_size() -> int:
    """``WORLD_SIZE`` set by torchrun / accelerate (1 without a launcher)."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def env_rank() -> int:
    """``RANK`` set by torchrun / accelerate (0 without a launcher): known before the process
    group exists, so start-up work on the run dir (lock, config.json) is done by rank 0 alone."""
    try:
        return max(0, int(os.environ.get("RANK", "0")))
    except ValueError:
        return 0


def rank_seed(seed: int, step: int, rank: int) -> int:
    """A 63-bit seed for ``(seed, step, rank)``: each rank samples its own stream, the same
    stream whatever world size the run was resumed on (a hash, not ``seed + rank``, so that
    neighbouring seeds and steps never share streams)."""
    digest = hashlib.sha256(f"marft-rank-seed/{seed}/{step}/{rank}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


class Distributed:
    """This process's place in a data-parallel job, and the collectives the trainers use.

    ``world_size == 1`` (no launcher): every method returns its input, no collective runs.

    Attributes:
        rank / local_rank / world_size: from the launcher.
        backend: the process group's backend (``None`` for world size 1).
        device: the device collectives run on (CPU for gloo, the local GPU for nccl).
    """

    def __init__(self, rank: int = 0, world_size: int = 1, local_rank: int = 0, backend: str | None = None) -> None:
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.local_rank = int(local_rank)
        self.backend = backend
        self.device = torch.device("cuda", self.local_rank) if backend == "nccl" else torch.device("cpu")

    # ---- rank helpers -------------------------------------------------------------
    @property
    def active(self) -> bool:
        """More than one process: collectives run."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that prints, logs and writes checkpoints."""
        return self.rank == 0

    def barrier(self) -> None:
        """Wait for every rank (no-op for world size 1)."""
        if self.active:
            torch.distributed.barrier()

    # ---- work split ---------------------------------------------------------------
    def shard_bounds(self, n: int, unit: int = 1) -> tuple[int, int]:
        """``[lo, hi)`` of this rank's share of ``n`` items taken in blocks of ``unit``
        (a GRPO group is one block: never split across ranks)."""
        if n % unit:
            raise ValueError(f"{n} items are not whole blocks of {unit}")
        blocks = n // unit
        if blocks % self.world_size:
            raise ValueError(
                f"{blocks} groups of episodes do not split evenly over {self.world_size} ranks: make "
                f"num_envs / group_size a multiple of the world size"
            )
        per = blocks // self.world_size
        return self.rank * per * unit, (self.rank + 1) * per * unit

    def collect(self, collector: Any, num_groups: int) -> Any:
        """Collect this rank's share of ``num_groups`` groups with ``collector``.

        Every rank draws the same global reset list (the problem stream of a single process
        with the full batch), plays its slice, and leaves the collector's counters as a
        single process would: episode ids stay globally unique and the collector's state
        is identical on every rank (so a checkpoint resumes on any world size).
        """
        if not self.active:
            return collector.collect(num_groups)
        resets = collector.draw_resets(num_groups)
        lo, hi = self.shard_bounds(len(resets), collector.group_size)
        first_id, collected = collector.next_episode_id, collector.episodes_collected
        collector.next_episode_id = first_id + lo
        batch = collector.run(resets[lo:hi])
        collector.next_episode_id = first_id + len(resets)
        collector.episodes_collected = collected + len(resets)
        return batch

    # ---- reductions -----------------------------------------------------------------
    def _all_reduce(self, values: Sequence[float], op: Any = None) -> list[float]:
        t = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t, op=op or torch.distributed.ReduceOp.SUM)
        return t.cpu().tolist()

    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum over ranks."""
        return list(values) if not self.active else self._all_reduce(values)

    def max(self, values: Sequence[float]) -> list[float]:
        """Element-wise max over ranks."""
        return list(values) if not self.active else self._all_reduce(values, torch.distributed.ReduceOp.MAX)

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is True on any rank."""
        return bool(flag) if not self.active else self.max([float(bool(flag))])[0] > 0

    def min_int(self, n: int) -> int:
        """The smallest ``n`` over ranks."""
        return int(n) if not self.active else int(-self.max([-float(n)])[0])

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world_size
        torch.distributed.all_gather_object(out, obj)
        return out

    def moments(self, x: np.ndarray | Sequence[float]) -> tuple[float, float, int]:
        """Global ``(mean, population std, count)`` of the values held across ranks
        (advantage whitening uses the batch's statistics, not one rank's)."""
        a = np.asarray(x, dtype=np.float64).reshape(-1)
        if not self.active:  # numpy's own reductions: a single process computes as it always did
            return (float(a.mean()), float(a.std()), int(a.size)) if a.size else (0.0, 0.0, 0)
        n, s, s2 = self.sum([float(a.size), float(a.sum()), float((a * a).sum())])
        if n == 0:
            return 0.0, 0.0, 0
        mu = s / n
        # shift-free formula in float64: fine for advantages (|A| << 1e8)
        return mu, float(np.sqrt(max(s2 / n - mu * mu, 0.0))), int(n)

    def mean_metrics(self, metrics: Mapping[str, float], weight: float = 1.0, *, sums: Iterable[str] = ()) -> dict[str, float]:
        """Metrics as one process with every rank's data would report them.

        Keys are ``weight``-averaged over the ranks that have them; keys in ``sums`` and
        every counter-like key (``rollout/*`` counts, ``perf/*_s`` rollout times are kept as
        the slowest rank's) are handled as documented in :data:`SUMMED`. Ranks may hold
        different key sets (an agent with no actions on one rank).
        """
        out = dict(metrics)
        if not self.active:
            return out
        gathered = self.all_gather_object((dict(metrics), float(weight)))
        summed = set(sums)
        keys = sorted({k for m, _ in gathered for k in m})
        for k in keys:
            vals = [(float(m[k]), w) for m, w in gathered if k in m]
            if k in summed or _is_count(k):
                out[k] = float(sum(v for v, _ in vals))
            elif k.startswith("perf/") and k.endswith("_s"):
                out[k] = float(max(v for v, _ in vals))  # wall time: the slowest rank
            else:
                wsum = sum(w for _, w in vals)
                out[k] = float(sum(v * w for v, w in vals) / wsum) if wsum > 0 else float(np.mean([v for v, _ in vals]))
        return out

    def all_reduce_grads(self, params: Sequence[torch.Tensor], weight: float) -> None:
        """Replace each parameter's gradient by the ``weight``-weighted mean over ranks.

        ``weight`` is this rank's share of the loss's units (its loss is a mean over them):
        ``sum_r w_r g_r / sum_r w_r`` is then the gradient of the mean over all ranks' units.
        A parameter without a gradient counts as a zero gradient (the same parameter list on
        every rank, so one flat buffer and one collective).
        """
        if not self.active or not params:
            return
        flat = [p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel(), dtype=p.dtype, device=p.device) for p in params]
        buf = torch.cat([f.to(torch.float32) for f in flat] + [torch.ones(1, device=flat[0].device)]) * float(weight)
        dev = buf.device
        buf = buf.to(self.device)
        torch.distributed.all_reduce(buf)
        total = float(buf[-1])
        buf = (buf[:-1] / total if total > 0 else buf[:-1] * 0.0).to(dev)
        pos = 0
        for p in params:
            n = p.numel()
            g = buf[pos : pos + n].view_as(p).to(p.dtype)
            if p.grad is None:
                p.grad = g.clone()
            else:
                p.grad.copy_(g)
            pos += n

    def broadcast_parameters(self, params: Iterable[torch.Tensor]) -> None:
        """Copy rank 0's values into ``params`` on every rank (start from identical weights).
        FSDP-sharded parameters (``DTensor``) are skipped: they were broadcast whole, before
        they were split."""
        if not self.active:
            return
        # deferred: torch.distributed's FSDP stack loads only for sharded runs
        from torch.distributed.tensor import DTensor

        with torch.no_grad():
            for p in params:
                if isinstance(p, DTensor):
                    continue
                t = p.detach().to(self.device)
                torch.distributed.broadcast(t, src=0)
                if t.data_ptr() != p.data_ptr():
                    p.copy_(t.to(p.device))

    # ---- teardown -----------------------------------------------------------------
    def close(self) -> None:
        """Leave the process group (registered with ``atexit`` by :func:`init_distributed`)."""
        if self.active and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


#: metric keys reduced as sums over ranks (counts of things, not rates or means)
SUMMED = (
    "rollout/actions", "rollout/tokens", "rollout/episodes", "rollout/problems", "rollout/overlong", "rollout/context_capped",
    "rollout/length_stops", "rollout/dead_steps", "rollout/verifier_timeouts", "rollout/shared_prefill_rows",
    "rollout/groups_dropped", "rollout/groups_kept", "perf/rollout_tokens_per_s",
)


def _is_count(key: str) -> bool:
    return key in SUMMED or key.endswith("/verifier_timeouts")


def minibatch_weight(trainer: Any, mb: Sequence[Any]) -> float:
    """This rank's share of a minibatch loss's units: response tokens when the policy loss
    is a mean over tokens (``loss_agg="token"`` and a per-token ratio), else actions."""
    units = getattr(trainer, "loss_units", None)
    if units is None:
        units = "tokens" if getattr(trainer.config, "loss_agg", "sequence") == "token" else "actions"
    if units == "tokens":
        return float(sum(max(len(t.response_ids), 0) for t in mb))
    return float(len(mb))


_CURRENT: Distributed | None = None


def abort_rank(exc: BaseException) -> typing.NoReturn:
    """End this rank of a multi-process job at once, naming the rank and the reason.

    A rank that stops must end the job, never leave the others waiting in a collective
    (they would report "Connection closed by peer" and the log would blame rank 0): print
    the error with the rank, then exit at once (no atexit, whose clean teardown would wait
    for the ranks that are still running). torchrun sees the non-zero exit and stops every
    other worker. ``SystemExit`` never reaches ``sys.excepthook``: the ``marft`` entry point
    calls this for it; its code is kept when non-zero (0 / None become 1: a rank that leaves
    a running job has failed it).
    """
    rank = os.environ.get("RANK", "?")
    if isinstance(exc, SystemExit):
        code = exc.code
        reason = f"exit status {code}" if isinstance(code, int) or code is None else str(code)
        sys.stderr.write(f"[marft rank {rank}] failed: SystemExit ({reason})\n")
        status = code if isinstance(code, int) and code != 0 else 1
    else:
        sys.stderr.write(f"[marft rank {rank}] failed: {type(exc).__name__}: {exc}\n")
        status = 130 if isinstance(exc, KeyboardInterrupt) else 1
    sys.stderr.write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(status)


def _abort_on_exception(prev: Any) -> Any:
    def hook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        abort_rank(exc.with_traceback(tb))

    return hook


def init_distributed(backend: str = "auto", timeout_s: float = 1800.0) -> Distributed:
    """Join the launcher's process group, or return a world-size-1 :class:`Distributed`.

    Idempotent: the second call returns the first call's object (several trainers in one
    process share the group). ``backend="auto"`` picks nccl on a CUDA machine and gloo
    otherwise; every collective fails after ``timeout_s`` seconds instead of hanging.
    Installs an exception hook that ends this process with a non-zero exit and the error
    (so the launcher ends the job), and destroys the process group at a normal exit.
    """
    global _CURRENT
    if _CURRENT is not None:
        return _CURRENT
    world = env_world_size()
    if world == 1:
        _CURRENT = Distributed()
        return _CURRENT
    missing = [k for k in _ENV + ("MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise RuntimeError(f"WORLD_SIZE={world} but {missing} are unset: launch with torchrun or accelerate launch")
    local = int(os.environ["LOCAL_RANK"])
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"distributed backend must be 'auto', 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl":
        torch.cuda.set_device(local)  # "cuda" means this rank's GPU from here on
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=float(timeout_s)))
    d = Distributed(torch.distributed.get_rank(), torch.distributed.get_world_size(), local, backend)
    sys.excepthook = _abort_on_exception(sys.excepthook)
    atexit.register(d.close)
    _CURRENT = d
    return d


# ---- sharded full fine-tuning (FSDP2) -----------------------------------------------------


def shard_full_model(model: torch.nn.Module, dist: Distributed, *, layer_types: tuple[type, ...] | None = None) -> torch.nn.Module:
    """Shard ``model`` with FSDP2 ``fully_shard``: each decoder layer, then the root.

    Parameters become ``DTensor`` shards (1/N of the weights per rank); each forward
    all-gathers a layer's weights, each backward reduce-scatters its gradients (averaged
    over ranks). LoRA adapters inside the layers shard with them. ``layer_types``: the
    module classes to shard one by one (default: transformers' decoder layers).
    """
    # deferred: torch.distributed's FSDP stack loads only for sharded runs
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if not dist.active:
        return model
    mesh = init_device_mesh(dist.device.type, (dist.world_size,))
    if layer_types is None:
        # deferred: transformers loads with the model stack, not with the trainer
        from transformers.modeling_layers import GradientCheckpointingLayer

        layer_types = (GradientCheckpointingLayer,)
    for m in list(model.modules()):
        if isinstance(m, layer_types):
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def full_state_dict(model: torch.nn.Module, dist: Distributed) -> dict[str, torch.Tensor]:
    """The full (unsharded) weights of a possibly FSDP2-sharded ``model`` on CPU, on rank 0
    (other ranks get an empty dict; every rank must call it): a checkpoint of them loads on
    any world size."""
    if not dist.active:
        return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    # deferred: torch.distributed's FSDP stack loads only for sharded runs
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
