"""Data-parallel training on 2 CPU processes (gloo, torchrun): equivalence, sync, resume, failure, FSDP2.

Each test launches ``python -m torch.distributed.run --nproc_per_node N`` on
``tests/algos/test_distributed_worker.py`` (one thread per process) and compares what the ranks
wrote with a single process computing the same thing in this test process.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("marft_algos.models")
import test_distributed_worker as worker  # noqa: E402

from marft_algos.distributed import Distributed, init_distributed, minibatch_weight, rank_seed  # noqa: E402

HERE = Path(__file__).resolve().parent
WORKER = HERE / "test_distributed_worker.py"


def launch(scenario: str, out: Path, nproc: int = 2, timeout: float = 120) -> subprocess.CompletedProcess:
    """torchrun ``nproc`` ranks of the worker on ``scenario`` (a free port, 1 thread each)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parents[1]), str(HERE.parent), str(HERE), env.get("PYTHONPATH", "")])
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port", "0",
           "--rdzv_backend", "c10d", "--rdzv_endpoint", "localhost:0", str(WORKER), scenario, str(out)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


def assert_tree_close(a: Any, b: Any, atol: float = 1e-5, path: str = "") -> None:
    """Nested dicts/lists of tensors and numbers are equal within ``atol``."""
    if isinstance(a, dict):
        assert set(a) == set(b), (path, set(a) ^ set(b))
        for k in a:
            assert_tree_close(a[k], b[k], atol, f"{path}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_tree_close(x, y, atol, f"{path}[{i}]")
    elif torch.is_tensor(a):
        assert torch.allclose(a.float(), b.float(), atol=atol, rtol=0), (path, (a.float() - b.float()).abs().max())
    else:
        assert a == pytest.approx(b, abs=atol), path


def moved(before: dict[str, Any], after: dict[str, Any]) -> bool:
    return any(not torch.equal(before[k], after[k]) for k in before)


# ---- in-process: world size 1 is today's single process ----------------------------------


def test_world_size_one_has_no_process_group():
    d = init_distributed()
    assert not d.active and d.is_main and d.world_size == 1
    assert not torch.distributed.is_initialized()
    x = [1.0, 2.0, 4.0]
    assert d.sum(x) == x and d.max(x) == x and d.any(True) and not d.any(False)
    assert d.moments(np.array(x)) == (float(np.mean(x)), float(np.std(x)), 3)


def test_shard_bounds_keep_groups_whole():
    d0, d1 = Distributed(0, 2), Distributed(1, 2)
    assert d0.shard_bounds(8, unit=2) == (0, 4) and d1.shard_bounds(8, unit=2) == (4, 8)
    with pytest.raises(ValueError, match="multiple of the world size"):
        d0.shard_bounds(6, unit=2)  # 3 groups over 2 ranks would split a group or unbalance ranks


def test_rank_seed_differs_by_rank_and_step():
    seeds = {rank_seed(0, s, r) for s in range(3) for r in range(3)}
    assert len(seeds) == 9 and all(0 <= s < 2**63 for s in seeds)


def test_minibatch_weight_counts_the_loss_units():
    from marft_algos.records import Transition

    mb = [Transition(0, 0, 0, 0, "a", [1], [2, 3, 4], [0.0] * 3), Transition(1, 1, 0, 0, "a", [1], [5], [0.0])]

    class T:
        def __init__(self, agg: str, units: str | None = None) -> None:
            self.config = type("C", (), {"loss_agg": agg})()
            if units:
                self.loss_units = units

    assert minibatch_weight(T("token"), mb) == 4.0  # a token-mean loss: tokens
    assert minibatch_weight(T("sequence"), mb) == 2.0
    assert minibatch_weight(T("token", "actions"), mb) == 2.0  # action-level MARFT


# ---- 2 ranks ------------------------------------------------------------------------------


@pytest.mark.parametrize("algo", ["grpo", "marft", "ippo-turn"])
def test_two_ranks_half_batch_equal_one_rank_full_batch(algo, tmp_path):
    t = worker.make_trainer(algo)
    before = {a: t.policy.adapter_state_dict(a) for a in t.agents}
    batch = t.collect()
    for i, ep in enumerate(batch.episodes):  # a reward signal whatever the untrained team said
        if i % 4 in (0, 3):
            ep.team_return = 1.0
            ep.transitions[-1].reward = 1.0
            for tr in ep.transitions:  # as the collector credits a graded turn's team reward to all its actions
                tr.team_reward = 1.0
    (tmp_path / "batch.pkl").write_bytes(pickle.dumps(batch))
    t.estimate(batch)
    t.update(batch)
    ref = worker.trainer_state(t)
    assert all(moved(before[a], ref["adapters"][a]) for a in t.agents)  # the step did something
    ok(launch(f"equiv-{algo}", tmp_path))
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    assert_tree_close(r0["adapters"], ref["adapters"])
    assert_tree_close(r1["adapters"], ref["adapters"])
    if algo == "marft":  # the critic too (advantage whitening used the global statistics)
        assert_tree_close(r0["critic"], ref["critic"])
    for k, opt in ref["optimizers"].items():  # optimizer moments as one process with B episodes
        assert_tree_close(r0["optimizers"][k]["state"], opt["state"], path=k)


def test_ranks_stay_identical_over_steps_agent_by_agent(tmp_path):
    ok(launch("steps", tmp_path))
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    assert r0["global_step"] == r1["global_step"] == 3
    assert_tree_close(r0["adapters"], r1["adapters"], atol=0.0)  # bit-identical, not just close
    assert_tree_close(r0["critic"], r1["critic"], atol=0.0)
    assert_tree_close(r0["optimizers"], r1["optimizers"], atol=0.0)
    assert r0["collector"] == r1["collector"] and r0["collector"]["next_episode_id"] == 3 * 8
    # agent by agent: step 0 trained the speaker, step 1 the listener, step 2 the speaker
    steps = {k: r0["optimizers"][k]["state"][0]["step"] for k in ("speaker", "listener")}
    assert float(steps["speaker"]) == 2 and float(steps["listener"]) == 1


@pytest.mark.parametrize("first,second", [(2, 1), (1, 2)])
def test_resume_across_world_sizes(first, second, tmp_path):
    ok(launch("resume-2", tmp_path, nproc=first))
    ok(launch("resume-3", tmp_path, nproc=second))
    resumed = torch.load(tmp_path / f"rank0-step3-world{second}.pt", weights_only=False)
    assert resumed["global_step"] == 3
    # the problem stream continued where the checkpoint left it: step 3 played episodes 16..23
    assert [e for e, _ in resumed["last_episodes"]] == list(range(16, 24))
    ref = worker.make_trainer("grpo")
    ref.collector.collect(4)
    ref.collector.collect(4)
    step3 = ref.collector.collect(4)  # the same draws in one process, uninterrupted
    assert resumed["last_episodes"] == [(ep.episode_id, ep.seed) for ep in step3.episodes]
    assert resumed["collector"] == ref.collector.state_dict()


@pytest.mark.parametrize("scenario", ["crash", "fsdp-crash"], ids=["ddp", "fsdp"])
def test_a_failing_rank_ends_the_job_with_its_error(scenario, tmp_path):
    proc = launch(scenario, tmp_path, timeout=300)  # a hang raises TimeoutExpired
    assert proc.returncode != 0
    assert "boom from rank 1" in proc.stdout + proc.stderr
    assert not (tmp_path / "done0.json").exists()


def test_fsdp2_full_fine_tuning_step_matches_unsharded(tmp_path):
    from marft_algos.models import build_tiny_model

    model, _ = build_tiny_model(seed=0)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids, mask = worker.fsdp_inputs()
    worker.lm_loss(model, ids, mask).backward()
    opt.step()
    ref = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ok(launch("fsdp", tmp_path))
    sharded = torch.load(tmp_path / "fsdp.pt", weights_only=False)
    assert set(sharded) == set(ref)
    assert_tree_close(sharded, ref, atol=1e-5)


# ---- distributed.strategy="fsdp": the trainers on FSDP2-sharded weights -------------------


def letter_batch(t: Any) -> Any:
    """One collected batch with a reward signal whatever the untrained team said."""
    batch = t.collect()
    for i, ep in enumerate(batch.episodes):
        if i % 4 in (0, 3):
            ep.team_return = 1.0
            ep.transitions[-1].reward = 1.0
            for tr in ep.transitions:  # as the collector credits a graded turn's team reward to all its actions
                tr.team_reward = 1.0
    return batch


@pytest.mark.parametrize("algo,mode", [("grpo", "full"), ("grpo", "lora"), ("marft", "full"), ("marft", "lora")])
def test_fsdp_two_ranks_half_batch_equal_one_rank_full_batch(algo, mode, tmp_path):
    t = worker.make_trainer(algo, mode=mode, distributed=worker.FSDP, adam_eps=worker.FSDP_ADAM_EPS)  # world size 1: not sharded
    before = {a: t.policy.adapter_state_dict(a) for a in t.agents}
    batch = letter_batch(t)
    (tmp_path / "batch.pkl").write_bytes(pickle.dumps(batch))
    t.estimate(batch)
    t.update(batch)
    ref = worker.trainer_state(t)
    assert all(moved(before[a], ref["adapters"][a]) for a in t.agents)
    ok(launch(f"fsdp-equiv-{algo}-{mode}", tmp_path))
    sharded = torch.load(tmp_path / "fsdp-rank0.pt", weights_only=False)
    for k, opt in ref["optimizers"].items():  # AdamW moments (the gradients), gathered from the shards
        assert_tree_close(sharded["optimizers"][k]["state"], opt["state"], path=k)
    assert_tree_close(sharded["adapters"], ref["adapters"])  # the gathered weights: one process's step
    if algo == "marft":  # the critic's head, replicated (its features came from the gathered base)
        assert_tree_close(sharded["critic"], ref["critic"])


@pytest.mark.parametrize("first,second", [(2, 1), (1, 2)])
def test_fsdp_resume_across_world_sizes(first, second, tmp_path):
    ok(launch("fsdp-resume-2", tmp_path, nproc=first))
    ok(launch("fsdp-resume-3", tmp_path, nproc=second))
    saved = torch.load(tmp_path / f"final-step2-world{first}.pt", weights_only=False)
    loaded = torch.load(tmp_path / f"loaded-world{second}.pt", weights_only=False)
    # what the first run held after step 2 is what the second one holds after loading its checkpoint
    assert loaded["global_step"] == saved["global_step"] == 2
    assert_tree_close(loaded["adapters"], saved["adapters"], atol=0.0)
    assert_tree_close(loaded["optimizers"], saved["optimizers"], atol=0.0)
    resumed = torch.load(tmp_path / f"final-step3-world{second}.pt", weights_only=False)
    assert resumed["global_step"] == 3 and moved(saved["adapters"]["speaker"], resumed["adapters"]["speaker"])
    ref = worker.make_trainer("grpo", mode="full")
    for _ in range(3):
        ref.collector.collect(4)
    assert resumed["collector"] == ref.collector.state_dict()  # the problem stream went on


def test_fsdp_marft_trains_agent_by_agent_with_its_critic(tmp_path):
    ok(launch("fsdp-marft-steps", tmp_path))  # the collapse detector's checkpoints are saved sharded too
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    assert r0["global_step"] == r1["global_step"] == 3
    assert_tree_close(r0["critic"], r1["critic"], atol=0.0)  # the replicated head, bit-identical
    assert_tree_close(r0["adapters"], r1["adapters"], atol=0.0)
    assert r0["collector"]["next_episode_id"] == 3 * 8
    steps = {k: r0["optimizers"][k]["state"][0]["step"] for k in ("speaker", "listener")}
    assert float(steps["speaker"]) == 2 and float(steps["listener"]) == 1


def test_fsdp_rollouts_of_different_lengths_per_rank(tmp_path):
    # rank 1 decodes 4 tokens per speaker action, rank 0 one: sharded forwards would pair
    # all-gathers of different decode steps and hang; the gathered rollout does not
    ok(launch("fsdp-ragged", tmp_path))
    r = torch.load(tmp_path / "ragged.pt", weights_only=False)
    assert r["lengths"] == [1, 4] and r["global_step"] == 1


@pytest.mark.parametrize(
    "settings,match",
    [
        ({"model_per_agent": {"speaker": "tiny-random"}}, "heterogeneous team"),
        ({"engine": "vllm"}, "engine='vllm'"),
        ({"dtype": "fp16"}, "fp16 loss scaling"),
    ],
)
def test_fsdp_refuses_what_it_does_not_support(settings, match):
    from marft_algos.algos.grpo import GRPOConfig
    from marft_algos.config import ConfigError

    with pytest.raises(ConfigError, match=match):
        GRPOConfig(env_id="echo-duo-v0", model="tiny-random", distributed={"strategy": "fsdp"}, **settings)


def test_fsdp_refuses_a_critic_lora():
    from marft_algos.algos.marft_action import MARFTActionConfig
    from marft_algos.config import ConfigError

    with pytest.raises(ConfigError, match="critic_lora=True is not supported"):
        MARFTActionConfig(env_id="echo-duo-v0", model="tiny-random", critic_lora=True, distributed={"strategy": "fsdp"})
    MARFTActionConfig(env_id="echo-duo-v0", model="tiny-random", critic_lora=True)  # fine with ddp


SYSTEM_EXIT_SCRIPT = '''
import sys
from marft_algos import cli
from marft_algos.distributed import init_distributed

def list_algos():
    d = init_distributed()
    if d.rank == 1:
        sys.exit("a user program called sys.exit on rank 1")
    d.barrier()  # rank 0 waits here for a rank that has left
    return 0

cli.cmd_list_algos = list_algos
sys.exit(cli.main(["list-algos"]))
'''


def test_a_rank_ending_with_system_exit_is_named_with_its_reason(tmp_path):
    """issue 28 item 13: SystemExit skips sys.excepthook: the rank printed nothing and rank 0
    was blamed ("Connection closed by peer")."""
    script = tmp_path / "exits.py"
    script.write_text(SYSTEM_EXIT_SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parents[1]), env.get("PYTHONPATH", "")])
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "0",
           "--rdzv_backend", "c10d", "--rdzv_endpoint", "localhost:0", str(script)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "[marft rank 1] failed: SystemExit (a user program called sys.exit on rank 1)" in proc.stderr, proc.stderr[-3000:]
