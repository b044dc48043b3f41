"""The program each rank runs in tests/algos/test_distributed.py (``torchrun ... this_file SCENARIO OUT``).

Not a test module of its own (no tests here): pytest imports it and finds nothing to run.
Every scenario writes what the test compares under OUT (a ``.pt`` per rank).
"""

from __future__ import annotations

import copy
import json
import os
import pickle
import sys
from pathlib import Path
from typing import Any

import torch

ALGOS = {"grpo": ("marft_algos.algos.grpo", "GRPOConfig", "GRPOTrainer"), "marft": ("marft_algos.algos.marft_action", "MARFTActionConfig", "MARFTActionTrainer"),
         "ippo-turn": ("marft_algos.algos.ippo", "IPPOConfig", "IPPOTrainer")}


def make_trainer(algo: str, **kw: Any) -> Any:
    """A trainer of ``algo`` on the echo duo with the tiny letter model (as the trainer tests);
    ``mode="full"`` builds the policy for full fine-tuning."""
    import importlib

    from helpers.tiny_echo import ENV_KWARGS, MICRO_BATCH_TOKENS, SAMPLING, letter_policy

    mod, cfg_name, tr_name = ALGOS[algo]
    m = importlib.import_module(mod)
    base: dict[str, Any] = dict(env_id="echo-duo-v0", env_kwargs=ENV_KWARGS, model="tiny-random", num_envs=8, steps=1,
                                progress=False, tensorboard=False, plot=False, sampling_overrides=SAMPLING, lr=1e-2,
                                distributed={"timeout_s": 60})
    if algo == "grpo":
        base["group_size"] = 2
    else:
        base.update(critic_lr=1e-2, normalize_advantages="batch")
    if algo == "ippo-turn":  # MARS turn-level advantages, normalised per agent over every rank's batch
        base.update(advantage_estimator="turn", normalize_advantages="agent")
    base.update(kw)
    if base["distributed"].get("strategy") != "fsdp":  # FSDP runs no micro-batches
        base.setdefault("micro_batch_tokens", MICRO_BATCH_TOKENS)
    return getattr(m, tr_name)(getattr(m, cfg_name)(**base), policy=letter_policy(mode=base.get("mode", "lora")))


#: FSDP2 sharding under a launcher (world size 1: a plain single process)
FSDP = {"timeout_s": 60, "strategy": "fsdp"}
#: Adam's eps in the FSDP equivalence tests. In full mode both agents step the one shared
#: model: Adam's second step m / (sqrt(v) + eps) divides the rounding of a near-cancelling
#: moment by eps, and at the default 1e-8 a 1e-7 difference of m moved a weight by 6% of a
#: step. A larger eps bounds that amplification; the moments are compared exactly anyway.
FSDP_ADAM_EPS = 1e-3


def full_trainer_state(t: Any) -> dict[str, Any]:
    """:func:`trainer_state` with the FSDP shards gathered (every rank must call it)."""
    with t.unsharded_state():  # copies: the optimizer's state dicts go back to shards afterwards
        return copy.deepcopy(trainer_state(t))


def trainer_state(t: Any) -> dict[str, Any]:
    """Policy adapters, critic / value heads and optimizer states, as CPU tensors."""
    out: dict[str, Any] = {"adapters": {a: t.policy.adapter_state_dict(a) for a in t.agents}}
    if hasattr(t.algorithm, "critic"):
        out["critic"] = t.algorithm.critic.state_dict()
    out["optimizers"] = {k: o.state_dict() for k, o in t.optimizers.items()}
    out["global_step"] = t.global_step
    out["collector"] = t.collector.state_dict()
    return out


def local_slice(batch: Any, rank: int, world: int) -> Any:
    """This rank's contiguous share of a pickled batch (whole groups, as the collector splits)."""
    from marft_algos.records import RolloutBatch

    n = len(batch.episodes) // world
    return RolloutBatch(episodes=batch.episodes[rank * n : (rank + 1) * n], metrics=dict(batch.metrics))


def main() -> None:
    scenario, out = sys.argv[1], Path(sys.argv[2])
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if scenario == "tree-grpo":  # branching: each rank collects whole trees, then updates on its trees of a fixed batch
        t = make_trainer("grpo", branching=2)
        own = t.collect()
        leaves = {g: len(eps) for g, eps in own.groups().items()}
        batch = local_slice(pickle.loads((out / "batch.pkl").read_bytes()), rank, world)
        t.estimate(batch)
        t.update(batch)
        state = trainer_state(t)
        state.update(leaves=leaves, advantages=[tr.advantage for tr in batch.transitions])
        torch.save(state, out / f"rank{rank}.pt")
    elif scenario.startswith("equiv-"):  # one update on this rank's slice of a fixed batch
        algo = scenario.split("-", 1)[1]
        t = make_trainer(algo)
        batch = local_slice(pickle.loads((out / "batch.pkl").read_bytes()), rank, world)
        t.estimate(batch)
        t.update(batch)
        torch.save(trainer_state(t), out / f"rank{rank}.pt")
    elif scenario == "steps":  # several full steps, agent by agent
        t = make_trainer("marft", agent_by_agent=True, steps=3)
        t.train()
        torch.save(trainer_state(t), out / f"rank{rank}.pt")
    elif scenario.startswith("resume-"):  # train to `steps`, resuming from OUT/run when it holds a checkpoint
        steps = int(scenario.split("-")[1])
        t = make_trainer("grpo", steps=steps, out_dir=str(out / "run"))
        if (out / "run" / "checkpoints").is_dir():
            t.load_checkpoint(out / "run")
        t.train()
        seeds = t.dist.all_gather_object([(ep.episode_id, ep.seed) for ep in t.last_batch.episodes])
        state = trainer_state(t)
        state["last_episodes"] = sorted(x for part in seeds for x in part)
        torch.save(state, out / f"rank{rank}-step{steps}-world{world}.pt")
    elif scenario == "crash":  # rank 1 fails at its second step while rank 0 waits in a collective
        t = make_trainer("grpo", steps=3, distributed={"timeout_s": 20})
        t.train_step()
        if rank == 1:
            raise RuntimeError("boom from rank 1")
        t.train_step()
    elif scenario == "fsdp":
        fsdp_step(out, rank, world)
    elif scenario.startswith("fsdp-equiv-"):  # one sharded update on this rank's slice of a fixed batch
        _, _, algo, mode = scenario.split("-")
        t = make_trainer(algo, mode=mode, distributed=FSDP, adam_eps=FSDP_ADAM_EPS)
        batch = local_slice(pickle.loads((out / "batch.pkl").read_bytes()), rank, world)
        t.estimate(batch)
        t.update(batch)
        state = full_trainer_state(t)
        if rank == 0:
            torch.save(state, out / "fsdp-rank0.pt")
    elif scenario.startswith("fsdp-resume-"):  # full fine-tuning to `steps`, resuming from OUT/run
        steps = int(scenario.rsplit("-", 1)[1])
        t = make_trainer("grpo", mode="full", steps=steps, out_dir=str(out / "run"), distributed=FSDP)
        if (out / "run" / "checkpoints").is_dir():
            t.load_checkpoint(out / "run")
            state = full_trainer_state(t)  # what this world size holds right after the load
            if rank == 0:
                torch.save(state, out / f"loaded-world{world}.pt")
        t.train()
        state = full_trainer_state(t)
        if rank == 0:
            torch.save(state, out / f"final-step{steps}-world{world}.pt")
    elif scenario == "fsdp-ragged":  # rank r decodes 1 + 3r tokens per action: different forward counts
        overrides = {"speaker": {"max_new_tokens": 1 + 3 * rank}, "listener": {"max_new_tokens": 1}}
        t = make_trainer("grpo", mode="full", distributed=FSDP, sampling_overrides=overrides)
        t.train_step()
        lengths = t.dist.all_gather_object(max(len(tr.response_ids) for tr in t.last_batch.transitions))
        state = full_trainer_state(t)
        if rank == 0:
            torch.save({"lengths": lengths, **state}, out / "ragged.pt")
    elif scenario == "fsdp-marft-steps":  # MARFT trained sharded: agent by agent, critic, recovery checkpoints
        t = make_trainer("marft", agent_by_agent=True, steps=3, distributed=FSDP)
        t.train()
        torch.save(full_trainer_state(t), out / f"rank{rank}.pt")
    elif scenario == "fsdp-crash":  # as "crash", sharded
        t = make_trainer("grpo", mode="full", steps=3, distributed={**FSDP, "timeout_s": 20})
        t.train_step()
        if rank == 1:
            raise RuntimeError("boom from rank 1")
        t.train_step()
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    (out / f"done{rank}.json").write_text(json.dumps({"rank": rank, "world": world}))


def fsdp_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed batch of 4 token rows and its attention mask."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 200, (4, 12), generator=g)
    return ids, torch.ones_like(ids)


def lm_loss(model: Any, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (every row the same length: a mean of row means)."""
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def fsdp_step(out: Path, rank: int, world: int) -> None:
    """One full fine-tuning AdamW step, sharded with FSDP2: each rank the rows of its half."""
    from marft_algos.distributed import full_state_dict, init_distributed, shard_full_model
    from marft_algos.models import build_tiny_model

    dist = init_distributed("gloo", 60)
    model, _ = build_tiny_model(seed=0)
    model.train()
    shard_full_model(model, dist)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids, mask = fsdp_inputs()
    n = ids.shape[0] // world
    loss = lm_loss(model, ids[rank * n : (rank + 1) * n], mask[rank * n : (rank + 1) * n])
    loss.backward()  # FSDP2 reduce-scatters the gradients, averaged over the ranks
    opt.step()
    sd = full_state_dict(model, dist)
    if rank == 0:
        torch.save(sd, out / "fsdp.pt")
    # leave the group together, before the function returns: once in a clean-clone CI run rank 1
    # aborted at exit ("terminate called without an active exception") with only the atexit
    # close; the cause was not pinned down. Not in close() itself: a barrier there would hang
    # the ranks that outlive a crashed one (the "crash" scenario).
    dist.barrier()
    dist.close()


if __name__ == "__main__":
    main()
