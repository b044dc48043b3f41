"""Golden runs: fixed-seed training runs whose metrics and final weights must not change.

Recorded before the training loop was restructured (issue 26) and kept as a regression
check: each case trains a few steps on the in-process ``tiny-random`` model and saves the
per-step metrics (timings excluded) and every trained tensor (adapters, critic, value
heads). ``python tests/golden/runs.py`` re-records them (only when a change of the
numbers is intended; say why in the commit).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent

ONE_TOKEN = {"speaker": {"max_new_tokens": 1}, "listener": {"max_new_tokens": 1}}
SHAPED = {"vocabulary": ["a", "b", "c", "d"], "reward": {"outcome": 1.0, "format": 0.5}}
ECHO = dict(env_id="echo-duo-v0", env_kwargs=SHAPED, sampling_overrides=ONE_TOKEN)
SHORT = {"max_new_tokens": 6}

#: name -> (algorithm, config settings); every case runs on the tiny random model
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "grpo": ("grpo", dict(ECHO, group_size=2)),
    "grpo-agentwise-micro": ("grpo", dict(ECHO, group_size=2, normalize_advantages="agent", micro_batch_tokens=1, num_minibatches=2, ppo_epochs=2)),
    "ippo": ("ippo", dict(ECHO)),
    "ippo-micro": ("ippo", dict(ECHO, micro_batch_tokens=1, num_minibatches=2)),
    "marft-action": ("marft-action", dict(ECHO, beta=0.05, ent_coef=0.01)),
    "marft-action-abya": ("marft-action", dict(ECHO, agent_by_agent=True, critic_warmup_steps=1, steps=3)),
    "marft-action-micro": ("marft-action", dict(ECHO, micro_batch_tokens=1, num_minibatches=2, normalize_advantages="agent")),
    "marft-token": ("marft-token", dict(ECHO, ent_coef=0.01)),
    "marft-action-routed": ("marft-action", dict(env_id="arith-routed-v0", env_kwargs={}, sampling_overrides={a: SHORT for a in ("orchestrator", "algebra", "number_theory", "geometry")}, num_envs=2)),
    "grpo-tools": ("grpo", dict(env_id="arith-calc-duo-v0", env_kwargs={}, sampling_overrides={a: SHORT for a in ("reasoner", "actor")}, group_size=2, num_envs=4, importance_ratio="turn")),
}


def run_case(name: str) -> tuple[list[dict[str, float]], dict[str, torch.Tensor]]:
    """Train case ``name`` from scratch; returns (per-step metrics, trained tensors by name)."""
    from marft_algos.registry import get_algorithm

    algo, settings = CASES[name]
    spec = get_algorithm(algo)
    # micro_batch_tokens=0: the default before issue 28 item 24 capped it (the recorded numbers ran unsplit)
    # recorded with torch's default threads in every phase: two on a 2-core machine, one per rank under torchrun
    threads = 0 if os.environ.get("WORLD_SIZE") else 2
    kw: dict[str, Any] = dict(model="tiny-random", num_envs=4, distributed={"timeout_s": 120}, collect_threads=threads, update_threads=threads, steps=2, seed=3, lr=0.01, progress=False, micro_batch_tokens=0,
                              tensorboard=False, plot=False)
    if "marft" in algo:
        kw.update(critic_lr=0.01, recovery=False)
    kw.update(settings)
    torch.manual_seed(0)
    trainer = spec.trainer_cls(spec.config_cls(**kw))
    history = trainer.train()
    return [stable_metrics(m) for m in history], trained_tensors(trainer)


def stable_metrics(m: dict[str, float]) -> dict[str, float]:
    """The metrics that do not depend on wall-clock time or memory."""
    return {k: float(v) for k, v in m.items() if not k.startswith("perf/") and not k.endswith("_s") and math.isfinite(v)}


def trained_tensors(trainer: Any) -> dict[str, torch.Tensor]:
    """Every parameter the run trained (policy adapters per role; critic / value heads)."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for agent in trainer.agents:
        for i, p in enumerate(trainer.policy.trainable_parameters(agent)):
            if id(p) not in seen:
                seen.add(id(p))
                out[f"policy/{agent}/{i}"] = p.detach().float().clone()
    for key, opt in sorted(trainer.optimizers.items()):
        for i, p in enumerate(q for g in opt.param_groups for q in g["params"]):
            if id(p) not in seen:
                seen.add(id(p))
                out[f"{key}/{i}"] = p.detach().float().clone()
    return out


def path_of(name: str) -> Path:
    """Where case ``name`` is recorded."""
    return HERE / f"{name}.pt"


#: cases also recorded on 2 ranks (torchrun, gloo): the same global batch split over the ranks
DDP_CASES = ["grpo", "marft-action"]


def launch_ddp(name: str, out: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run case ``name`` under ``torchrun --nproc_per_node 2`` (one thread per rank); rank 0
    saves the result to ``out``."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parents[1]), env.get("PYTHONPATH", "")])
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--rdzv_backend", "c10d",
           "--rdzv_endpoint", "localhost:0", str(Path(__file__).resolve()), "--rank-run", name, str(out)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def save(history: list[dict[str, float]], tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Write one recorded run."""
    torch.save({"history": history, "tensors": tensors}, path)


def main(argv: list[str]) -> int:
    """Record the named cases (default: all, and the 2-rank ones as ``ddp-<case>``)."""
    if argv[:1] == ["--rank-run"]:  # inside torchrun: every rank trains, rank 0 writes
        history, tensors = run_case(argv[1])
        if os.environ.get("RANK", "0") == "0":
            save(history, tensors, Path(argv[2]))
        return 0
    for name in argv or list(CASES) + [f"ddp-{c}" for c in DDP_CASES]:
        if name.startswith("ddp-"):
            proc = launch_ddp(name[len("ddp-"):], path_of(name))
            if proc.returncode:
                print(proc.stdout[-3000:], proc.stderr[-6000:])
                return proc.returncode
        else:
            save(*run_case(name), path_of(name))
        print(f"recorded {name}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parents[1]))
    sys.exit(main(sys.argv[1:]))
