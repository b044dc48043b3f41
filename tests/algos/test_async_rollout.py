"""Asynchronous rollout workers (``rollout_workers``, ``max_staleness``; docs/async.md).

Each test spawns real worker processes on the tiny model (CPU): the staleness-0 run equals
the synchronous one bit for bit (GRPO and action-level MARFT), a stale batch is trained
with the decoupled objective against the recorded behaviour log-probs (checked by hand),
and faults end with a clear error within a timeout (or a restart), Ctrl-C stops the
workers, a resume drops and counts the batches in flight.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

pytest.importorskip("marft_algos.models")
from helpers.marft_echo import SHAPED, echo_kwargs, letter_policy  # noqa: E402

import marft_envs  # noqa: E402
from marft_algos.algos.grpo import GRPOConfig, GRPOTrainer  # noqa: E402
from marft_algos.algos.marft_action import MARFTActionConfig, MARFTActionTrainer  # noqa: E402
from marft_algos.async_rollout import AsyncRollout, RolloutWorkerError  # noqa: E402
from marft_algos.buffer import AgentBuffer  # noqa: E402
from marft_algos.callbacks import Callback  # noqa: E402
from marft_algos.config import ConfigError  # noqa: E402

# one thread per phase in both runs (float sums then agree bit for bit); letter_policy:
# the tiny model prefers the echo env's letters, so every batch carries reward signal
COMMON = dict(seed=3, steps=3, collect_threads=1, update_threads=1, micro_batch_tokens=0, rollout_timeout_s=120)
ALGOS = {
    "grpo": (GRPOTrainer, GRPOConfig, dict(group_size=2)),
    "marft-action": (MARFTActionTrainer, MARFTActionConfig, dict()),
}


def config(algo: str, **kw):
    _, config_cls, extra = ALGOS[algo]
    settings = echo_kwargs(**{**COMMON, **extra, **kw})
    if algo == "grpo":
        settings.pop("critic_lr"), settings.pop("recovery")
    return config_cls(**settings)


def make(algo: str, env_fn=None, **kw):
    return ALGOS[algo][0](config(algo, **kw), policy=letter_policy(), env_fn=env_fn)


def trained(trainer) -> dict[str, torch.Tensor]:
    out = {}
    for key, opt in sorted(trainer.optimizers.items()):
        for i, p in enumerate(q for g in opt.param_groups for q in g["params"]):
            out[f"{key}/{i}"] = p.detach().clone()
    return out


def alive(trainer) -> list:
    return [p for p in trainer.rollout.procs if p is not None and p.is_alive()]


@pytest.mark.parametrize("algo,extra", [(a, {}) for a in ALGOS] + [("grpo", {"branching": 2, "group_size": 1})],
                         ids=[*ALGOS, "grpo-branching"])
def test_staleness_zero_equals_synchronous_run(algo, extra):
    """A worker at staleness 0 gives the synchronous run's weights bit for bit (with branching:
    the worker plays the same trees as the trainer's collector)."""
    sync = make(algo, **extra)
    before = trained(sync)
    hist_sync = sync.train()
    if extra.get("branching"):
        assert hist_sync[0]["rollout/tree_leaves"] > 0
    asyn = make(algo, rollout_workers=1, max_staleness=0, **extra)
    hist_async = asyn.train()
    assert not alive(asyn)  # the run's end stops its workers
    assert_equal_runs(before, sync, asyn, hist_sync, hist_async)
    for y in hist_async:
        assert 0.0 <= y["perf/worker_idle_frac"] <= 1.0 and 0.0 <= y["perf/trainer_idle_frac"] <= 1.0
    assert hist_async[-1].get("rollout/dropped_batches", 0.0) == 0.0


def assert_equal_runs(before: dict, sync: Any, asyn: Any, hist_sync: list[dict], hist_async: list[dict]) -> None:
    """The synchronous and the one-worker staleness-0 run trained the same weights bit for
    bit (weights that moved from ``before``) and agree step by step."""
    a, b = trained(sync), trained(asyn)
    assert any(not torch.equal(before[k], a[k]) for k in a)  # the weights moved: the comparison means something
    diff = {k: float((a[k] - b[k]).abs().max()) for k in a if not torch.equal(a[k], b[k])}
    assert not diff, diff
    for step, (x, y) in enumerate(zip(hist_sync, hist_async, strict=True)):
        assert y["rollout/staleness"] == 0.0 and y["rollout/policy_version"] == step
        assert x["team/reward"] == y["team/reward"] and x["rollout/tokens"] == y["rollout/tokens"]


class WaitForNextBatch(Callback):
    """Before the first update, wait until the worker has generated the next batch, so that
    batch surely comes from the weights before that update (staleness 1)."""

    def on_batch(self, trainer, batch):
        if trainer.global_step == 0:
            deadline = time.monotonic() + 60
            while 1 not in trainer.rollout.buffer:
                msg = trainer.rollout._get(1 % trainer.rollout.n, deadline, "to deliver batch 2")
                if msg is not None and msg[0] == "batch":
                    trainer.rollout.buffer[msg[2]] = msg


def test_stale_batch_ratio_and_tis_use_recorded_behaviour_logprobs():
    t = make("grpo", rollout_workers=1, max_staleness=1, tis_cap=1.05)
    t.callbacks.append(WaitForNextBatch())
    try:
        t.train_step()  # step 1: a fresh batch; its update moves the weights
        batch = t.collect()  # step 2's batch: generated before that update
        assert batch.metrics["rollout/staleness"] == 1.0 and batch.metrics["rollout/policy_version"] == 0.0
        assert t.behaviour.stale
        t.estimate(batch)
        t.behaviour.fill(batch, t.agents, reference=False)
        agent = "listener"
        trs = batch.agent_transitions(agent)
        mb = AgentBuffer.from_transitions(agent, trs, batch.estimates).minibatch(list(range(len(trs))))
        est = batch.estimates
        behav = [list(tr.sampler_logprobs) for tr in mb]  # recorded by the worker
        with torch.no_grad():
            t.policy.set_train_role(agent)
            prox = t.policy.sequence_logprobs(agent, [tr.prompt_ids for tr in mb], [tr.response_ids for tr in mb])
        for tr, lp, m, b in zip(mb, prox.logprobs, prox.mask, behav, strict=True):
            assert est[tr].old_logp == pytest.approx(lp[m.bool()].tolist(), abs=1e-6)  # old = proximal (current) policy
            assert est[tr].old_logp != pytest.approx(b, abs=1e-4)  # ... not the behaviour policy
        with torch.no_grad():  # move the policy so that the ratio is not 1
            for p in t.policy.trainable_parameters(agent):
                p.add_(0.05 * torch.randn_like(p))
        t.policy.set_train_role(agent)
        stats = t.policy.sequence_logprobs(agent, [tr.prompt_ids for tr in mb], [tr.response_ids for tr in mb])
        loss, m = t.algorithm.policy_loss(agent, mb, stats)
        # by hand: r = pi/pi_prox clipped at 0.8..1.2, weighted by w = min(pi_prox/pi_behav, cap), token mean
        num, den, gaps, cut = 0.0, 0, [], 0
        for k, tr in enumerate(mb):
            A = float(tr.advantage)
            n = len(tr.response_ids)
            for j in range(n):
                new, old, beh = float(stats.logprobs[k][j].detach()), est[tr].old_logp[j], behav[k][j]
                r = torch.exp(torch.tensor(new - old)).item()
                w = min(torch.exp(torch.tensor(old - beh)).item(), 1.05)
                cut += torch.exp(torch.tensor(old - beh)).item() > 1.05
                num += -min(r * A * w, min(max(r, 0.8), 1.2) * A * w)
                den += 1
                gaps.append(abs(old - beh))
        assert float(loss.detach()) == pytest.approx(num / den, rel=1e-4, abs=1e-6)
        assert m[f"agent/{agent}/engine_logp_gap"] == pytest.approx(sum(gaps) / len(gaps), rel=1e-4)
        assert m[f"agent/{agent}/tis_clipped_frac"] == pytest.approx(cut / den)
        assert sum(gaps) > 0
    finally:
        t.rollout.stop()


def test_fresh_batch_takes_the_synchronous_road():
    """staleness 0: the sampler's log-probs are the old ones, no importance weight."""
    t = make("grpo", rollout_workers=1, max_staleness=0, steps=1)
    try:
        m = t.train_step()
        assert not t.behaviour.stale and "agent/listener/engine_logp_gap" not in m
        batch = t.last_batch
        tr = batch.agent_transitions("listener")[0]
        assert batch.estimates[tr].old_logp == [float(x) for x in tr.sampler_logprobs]
    finally:
        t.rollout.stop()


@contextmanager
def worker_killed_after_one_step(**settings) -> Iterator[tuple[GRPOTrainer, Any]]:
    """A one-worker GRPO run after its first step, its worker just killed by SIGKILL."""
    t = make("grpo", rollout_workers=1, **settings)
    try:
        t.train_step()
        (proc,) = alive(t)
        os.kill(proc.pid, signal.SIGKILL)
        yield t, proc
    finally:
        t.rollout.stop()


def test_killed_worker_ends_the_run_with_a_clear_error():
    with worker_killed_after_one_step(max_staleness=0, rollout_timeout_s=60) as (t, _):
        t0 = time.monotonic()
        with pytest.raises(RolloutWorkerError, match=r"rollout worker 0 \(pid \d+\) died: killed by SIGKILL.*rollout_restarts"):
            t.train_step()
        assert time.monotonic() - t0 < 30
        assert not alive(t) and not t.rollout.started


def test_killed_worker_is_restarted_and_its_batch_generated_again():
    with worker_killed_after_one_step(max_staleness=1, rollout_restarts=1) as (t, proc):
        t.train_step()  # step 2's batch may have been delivered before the kill
        m = t.train_step()  # step 3's was not: the worker is found dead and restarted
        assert m["rollout/worker_restarts"] == 1.0
        assert len(t.last_batch) == 4 and alive(t) and alive(t)[0].pid != proc.pid


def test_stuck_worker_ends_the_run_after_the_timeout():
    t = make("grpo", rollout_workers=1, max_staleness=0)
    try:
        t.train_step()
        (proc,) = alive(t)
        t.rollout.timeout = 3.0  # the start-up above needed the long default
        os.kill(proc.pid, signal.SIGSTOP)  # alive, but it never delivers
        t0 = time.monotonic()
        with pytest.raises(RolloutWorkerError, match=r"rollout worker 0 \(pid \d+\) is alive but took more than rollout_timeout_s=3 s"):
            t.train_step()
        assert time.monotonic() - t0 < 20
        assert not proc.is_alive()  # stopped processes are killed too
    finally:
        t.rollout.stop()


def test_two_workers_deliver_the_batches_in_order():
    t = make("grpo", rollout_workers=2, max_staleness=1, steps=3)
    history = t.train()
    assert [m["rollout/policy_version"] <= step for step, m in enumerate(history)] == [True] * 3
    assert all(m["rollout/staleness"] in (0.0, 1.0) for m in history)
    assert sorted({ep.group_id for ep in t.last_batch.episodes}) == [4, 5]  # the problem stream of step 3
    assert t.collector.state_dict()["next_group_id"] == 6 and not t.rollout.started


def test_workers_can_build_their_policy_from_the_config():
    """``rollout_device`` set: the workers build the policy with make_policy (the path a
    second GPU takes) and only the trained weights are synced."""
    cfg = config("grpo", rollout_workers=1, rollout_device="cpu", steps=2)
    t = GRPOTrainer(cfg)  # the policy from the config: tiny-random
    assert t.rollout._policy_blob() is None
    try:
        history = [t.train_step(), t.train_step()]
        assert [m["rollout/policy_version"] for m in history] == [0.0, 1.0]
    finally:
        t.rollout.stop()


def _failing_env():
    raise RuntimeError("env factory exploded in the worker")


def test_worker_exception_reaches_the_trainer_with_its_traceback():
    t = make("grpo", rollout_workers=1)
    t.env_fn = _failing_env  # the workers build their envs from it (the trainer's were built already)
    try:
        with pytest.raises(RolloutWorkerError, match=r"(?s)rollout worker 0 failed.*env factory exploded"):
            t.train_step()
    finally:
        t.rollout.stop()


class Interrupt(Callback):
    def on_run_step(self, trainer, metrics):
        raise KeyboardInterrupt


def test_ctrl_c_stops_the_workers():
    t = make("grpo", rollout_workers=1, max_staleness=1)
    t.callbacks.append(Interrupt())
    with pytest.raises(KeyboardInterrupt):
        t.train()
    assert not t.rollout.started
    assert t.counters["rollout/dropped_batches"] == 1.0  # the batch generated ahead was never trained on


def test_resume_drops_in_flight_batches_and_counts_them(tmp_path):
    t = make("grpo", rollout_workers=1, max_staleness=1, out_dir=str(tmp_path / "run"))
    try:
        t.train_step()
        t.train_step()
        assert len(t.rollout.outstanding) == 1  # step 3's batch was issued ahead
        path = t.save_checkpoint()
        consumed = t.collector.state_dict()
    finally:
        t.rollout.stop()
    r = make("grpo", rollout_workers=1, max_staleness=1, out_dir=str(tmp_path / "run"))
    try:
        r.load_checkpoint(path)
        assert r.counters["rollout/dropped_batches"] == 1.0
        assert r.collector.state_dict()["next_group_id"] == consumed["next_group_id"] == 4  # 2 steps x 2 groups trained
        m = r.train_step()
        assert sorted({ep.group_id for ep in r.last_batch.episodes}) == [4, 5]  # the dropped batch's problems, again
        assert m["rollout/dropped_batches"] == 1.0 and m["rollout/policy_version"] == 2.0
    finally:
        r.rollout.stop()


def test_a_dropped_trainer_stops_its_workers_and_the_process_exits():
    """A trainer driven by train_step (as benchmarks/equal_budget.py does) and dropped without
    train()'s close: its workers stop when it is freed, and at exit the interpreter never waits
    on a worker blocked on its task queue (it hung there before)."""
    import subprocess
    import sys
    from pathlib import Path

    script = (
        "import gc, sys\n"
        f"sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[1])!r}]\n"  # the test, helpers/
        "from test_async_rollout import make, alive\n"
        "t = make('grpo', rollout_workers=1, max_staleness=1)\n"
        "t.train_step()\n"
        "procs = list(t.rollout.procs)\n"
        "assert alive(t)\n"
        "del t; gc.collect()\n"
        "assert not any(p.is_alive() for p in procs), 'the workers outlived their trainer'\n"
        "t = make('grpo', rollout_workers=1, max_staleness=1)\n"
        "t.train_step()\n"  # left alive at exit
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240, cwd=Path(__file__).parent)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_bad_settings_are_refused_with_a_reason():
    with pytest.raises(ConfigError, match="rollout_workers must be >= 0"):
        GRPOConfig(rollout_workers=-1)
    with pytest.raises(ConfigError, match="max_staleness must be >= 0"):
        GRPOConfig(max_staleness=-1)
    with pytest.raises(ConfigError, match="dynamic_sampling.*rollout_workers=0"):
        make("grpo", rollout_workers=1, dynamic_sampling=True)
    with pytest.raises(ConfigError, match="cannot be pickled"):
        make("grpo", rollout_workers=1, env_fn=lambda: marft_envs.make("echo-duo-v0", **SHAPED))
    assert AsyncRollout.state_key == "async_rollout"


def _throughput():
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "throughput.py"
    spec = importlib.util.spec_from_file_location("bench_throughput_async", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _check_async_section(tp, out, systems):
    import csv

    with (out / "async.csv").open() as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert reader.fieldnames == tp.ASYNC_COLUMNS
    assert [r["system"] for r in rows if r["rep"] == "1"] == systems  # every system once per repetition
    assert all(float(r["samples_s"]) > 0 and r["steps"] == "1" for r in rows)
    workers = [r for r in rows if r["system"] == "marft GRPO duo 1 worker + trainer"]
    assert all(0 <= float(r["worker_idle_frac"]) <= 1 and 0 <= float(r["trainer_idle_frac"]) <= 1 for r in workers)
    assert all(float(r["staleness"]) <= 1 for r in workers)
    assert "1 worker + trainer / marft GRPO duo sync: samples_s" in (out / "throughput.md").read_text()


def test_throughput_async_section_on_the_tiny_model(tmp_path):
    tp = _throughput()
    out = tmp_path / "tp"
    assert tp.main(["--model", "tiny-random", "--sections", "async", "--async-peer", "none", "--reps", "1", "--group-size", "2",
                    "--gen-tokens", "2", "--async-block", "2", "--out", str(out)]) == 0
    # repetition 1 runs the systems in reverse order (as the grpo section alternates them)
    _check_async_section(tp, out, ["marft GRPO duo 1 worker + trainer", "marft GRPO duo sync 1 thread", "marft GRPO duo sync"])


@pytest.mark.slow
def test_throughput_async_section_with_trl(tmp_path):
    pytest.importorskip("trl")
    tp = _throughput()
    out = tmp_path / "tp"
    assert tp.main(["--model", "tiny-random", "--sections", "async", "--reps", "1", "--group-size", "2",
                    "--gen-tokens", "2", "--async-block", "2", "--out", str(out)]) == 0
    _check_async_section(tp, out, ["TRL GRPOTrainer solo", "marft GRPO duo 1 worker + trainer", "marft GRPO duo sync 1 thread", "marft GRPO duo sync"])


def _gone(pid: int) -> bool:
    """Exited (or a zombie its new parent has not reaped yet)."""
    from pathlib import Path

    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_worker_whose_trainer_is_killed_leaves_mid_batch():
    """SIGKILL the trainer while its worker is busy (here: asleep for 2 minutes, a long batch):
    the worker's watchdog thread ends it within about a second, not after the batch."""
    import subprocess

    child = (
        "import os, time\n"
        "from marft_algos.async_rollout.worker import watch_parent\n"
        "watch_parent(os.getppid(), lambda: os._exit(0), period_s=0.1)\n"
        "print(os.getpid(), flush=True)\n"
        "time.sleep(120)\n"
    )
    trainer = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', {child!r}], stdout=subprocess.PIPE, text=True)\n"
        "print(p.stdout.readline().strip(), flush=True)\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", trainer], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(parent.stdout.readline())
        assert not _gone(worker)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 30  # generous for a loaded machine: the sleep is 120 s
        while not _gone(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(worker), "the orphaned worker kept running"
    finally:
        parent.kill()
