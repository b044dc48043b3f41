"""Programs with asynchronous rollout workers (docs/async.md, docs/programs.md).

A worker process runs the program env itself: its own loopback server, its own program
threads, answered by its own policy copy. Each test spawns a real worker on the tiny model
and drives a real ``openai`` client program through the real endpoint. The programs are
module-level functions of this module, so the spawned worker imports them by name.
"""

from __future__ import annotations

import functools
import json
import socket
import threading
import time

import openai
import pytest

pytest.importorskip("marft_algos.models")
from test_async_rollout import assert_equal_runs, trained  # noqa: E402

from marft_algos.algos.grpo import GRPOConfig, GRPOTrainer  # noqa: E402
from marft_algos.callbacks import Callback  # noqa: E402
from marft_algos.serve.cli import expand_program_flags  # noqa: E402
from marft_envs.program_env import make_program_env  # noqa: E402

ROLES = ["solver", "checker"]
SAMPLING = {"solver": {"max_new_tokens": 3}, "checker": {"max_new_tokens": 3}}
# one thread per phase in both runs (float sums then agree bit for bit), as test_async_rollout
COMMON = dict(model="tiny-random", num_envs=4, group_size=2, steps=2, seed=3, collect_threads=1, update_threads=1,
              micro_batch_tokens=0, lr=0.01, rollout_timeout_s=120, progress=False, tensorboard=False, plot=False,
              sampling_overrides=SAMPLING)


def _ask(base_url: str, role: str, content: str) -> str:
    c = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
    return c.chat.completions.create(model=role, messages=[{"role": "user", "content": content}]).choices[0].message.content


def duo(base_url: str, problem) -> float:
    """solver -> checker, one call at a time; the reward follows the replies' lengths, so
    that (unlike a graded answer of the random model) every group carries signal."""
    draft = _ask(base_url, "solver", problem.question)
    final = _ask(base_url, "checker", f"{problem.question}\nSolution: {draft}")
    return (len(draft) + 3 * len(final)) % 7 / 7


# a long context: a batch of this program pickles to more than a pipe holds (64 KiB), as a
# real model's batches do
CONTEXT = " ".join(f"fact {i}." for i in range(180))


def flaky(base_url: str, problem) -> float:
    """Raises after the solver's call when its reply has an odd length."""
    draft = _ask(base_url, "solver", f"{CONTEXT}\n{problem.question}")
    if len(draft) % 2:
        raise RuntimeError("flaky program")
    return len(_ask(base_url, "checker", draft)) % 5 / 5


def program_kwargs(program: str) -> dict:
    """``env_kwargs`` exactly as ``marft train --program ... --roles ...`` builds them."""
    argv = expand_program_flags(["train", "--program", f"{__name__}:{program}", "--roles", ",".join(ROLES)])
    return json.loads(argv[argv.index("--set") + 1].split("=", 1)[1])


def make(env_fn=None, **kw) -> GRPOTrainer:
    config = GRPOConfig(**{**COMMON, "env_id": "marft_envs.program_env:program-v0", "env_kwargs": program_kwargs("duo"), **kw})
    return GRPOTrainer(config, env_fn=env_fn)


def episodes(batch) -> list[tuple]:
    """Per episode: its flags, its team reward, and its calls (role, response ids)."""
    return [(sorted({f for t in ep.transitions for f in t.flags}), float(ep.team_return),
             [(t.agent, list(t.response_ids)) for t in ep.transitions]) for ep in batch.episodes]


class Batches(Callback):
    """Keep every step's batch, and the worker processes."""

    def __init__(self) -> None:
        self.batches: list = []
        self.procs: list = []

    def on_batch(self, trainer, batch) -> None:
        self.batches.append(batch)
        if trainer.rollout is not None:
            self.procs = [p for p in trainer.rollout.procs if p is not None]


def test_a_sequential_program_at_staleness_zero_equals_the_synchronous_run():
    """A sequential program's calls are answered in an order that does not depend on thread
    timing, so one worker at staleness 0 gives the synchronous run's weights bit for bit."""
    sync = make()
    before = trained(sync)
    hist_sync = sync.train()
    asyn = make(rollout_workers=1, max_staleness=0)
    hist_async = asyn.train()
    assert_equal_runs(before, sync, asyn, hist_sync, hist_async)
    for x, y in zip(hist_sync, hist_async, strict=True):
        assert x["rollout/actions"] == y["rollout/actions"] == 2 * COMMON["num_envs"]  # both calls of every episode


def _listening(pid: int) -> set[int]:
    import psutil

    try:
        return {c.laddr.port for c in psutil.Process(pid).net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}
    except psutil.NoSuchProcess:
        return set()


def _refused(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_marft_train_program_with_a_worker_one_update_behind(tmp_path):
    """``marft train --program ... --set rollout_workers=1 --set max_staleness=1``: 3 steps,
    ``rollout/staleness`` logged every step; the worker served the program's calls on its
    own port (not the trainer), and the run's end leaves no worker and no listening port."""
    psutil = pytest.importorskip("psutil")
    from marft_algos.cli import main

    me = psutil.Process()
    ours_before = _listening(me.pid)
    seen: dict[int, set[int]] = {}  # worker pid -> its listening ports, while the run goes on
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for child in me.children(recursive=True):
                ports = _listening(child.pid)
                if ports:
                    seen.setdefault(child.pid, set()).update(ports)
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    out = tmp_path / "run"
    try:
        status = main(["train", "--program", f"{__name__}:duo", "--roles", ",".join(ROLES), "--problems", "arith",
                       "--algo", "grpo", "--model", "tiny-random", "--steps", "3", "--out", str(out),
                       "--set", "num_envs=2", "--set", "group_size=2", "--set", "progress=false",
                       "--set", "rollout_workers=1", "--set", "max_staleness=1", "--set", "rollout_timeout_s=120",
                       "--set", f"sampling_overrides={json.dumps(SAMPLING)}"])
    finally:
        done.set()
        watcher.join()
    assert status == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/staleness" in r]
    assert len(steps) == 3 and all(r["rollout/staleness"] in (0.0, 1.0) for r in steps)
    assert all(r["rollout/policy_version"] == r["step"] - 1 - r["rollout/staleness"] for r in steps)
    assert len(seen) == 1, seen  # one worker, and it was the one with the program server
    (pid, ports), = seen.items()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert all(_refused(p) for p in ports)
    assert _listening(me.pid) == ours_before  # the trainer ran no program server of its own


def test_a_program_that_raises_in_a_worker_ends_its_episode_with_reward_zero_and_the_flag():
    """Built from ``make_program_env`` (the Python form, picklable with functools.partial): the
    worker's first batch equals the synchronous run's, flags and rewards included; the run goes
    on; at the end the worker exits by itself at once (it used to be terminated after 5 s:
    the batch generated ahead, never read and larger than a pipe holds, held its exit)."""
    env_fn = functools.partial(make_program_env, f"{__name__}:flaky", ROLES, "arith")
    sync, asyn = Batches(), Batches()
    s = make(env_fn=env_fn, steps=1, num_envs=12)
    s.callbacks.append(sync)
    s.train()
    t = make(env_fn=env_fn, rollout_workers=1, max_staleness=1, num_envs=12)
    t.callbacks.append(asyn)
    t0 = time.monotonic()
    history = t.train()
    elapsed = time.monotonic() - t0
    assert len(history) == 2 and not t.rollout.started
    first = episodes(asyn.batches[0])
    assert first == episodes(sync.batches[0])  # batch 1 comes from the initial weights in both runs
    failed = [e for e in first + episodes(asyn.batches[1]) if "program_error" in e[0]]
    assert failed and all(reward == 0.0 for _, reward, _ in failed)
    assert any("program_error" not in e[0] for e in first)
    assert history[0]["rollout/program_errors"] == sum("program_error" in e[0] for e in first)
    for batch in asyn.batches:  # the version and the behaviour log-probs travel with the batch
        assert batch.metrics["rollout/policy_version"] in (0.0, 1.0)
        assert all(len(tr.sampler_logprobs) == len(tr.response_ids) for ep in batch.episodes for tr in ep.transitions)
    (proc,) = asyn.procs
    assert proc.exitcode == 0, f"worker exit status {proc.exitcode} (a terminated worker: -15), run took {elapsed:.1f} s"
