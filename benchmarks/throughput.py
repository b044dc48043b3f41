"""Throughput: marft GRPO vs TRL GRPOTrainer side by side, team-size scaling, memory modes, decode bound.

    python benchmarks/throughput.py --model smollm2-135m --reps 5 --out runs/throughput
    python benchmarks/throughput.py --model tiny-random --reps 1 --gen-tokens 8 --scaling 1,2 --out /tmp/tp   # smoke

Four sections, all run by ONE invocation so that the numbers compared were taken under
the same machine load (on a shared CPU only the ratios are meaningful):

1. ``grpo``: one training step = one group of G samples of one arith prompt.
   TRL ``GRPOTrainer`` on a single agent (G completions of <= T tokens), marft GRPO on
   the same single agent (``arith-solo-v0``, G episodes of <= T tokens) and marft GRPO
   on a duo (``arith-duo-v0``, G episodes, each agent <= T/2 tokens: the same token
   budget per step). Same base model, LoRA (r=8, alpha=16, q/k/v/o), lr, temperature 1,
   no KL term, one optimizer step per batch; gradient checkpointing off on both sides
   (TRL's default is on, marft's ``activation_checkpointing`` is off). The steps interleave:
   a TRL callback runs one marft solo and one marft duo step after every TRL step, so
   each repetition sees the same load. The first (warm-up) repetition is dropped.
   Reported per repetition: step time, rollout time, generated tokens, rollout tokens/s
   (tokens / generation time), training tokens/s (tokens / whole step time),
   samples/s (episodes or completions / step time) and the peak memory rise during the
   step; the ratios marft / TRL are given as min / median / max over repetitions.
2. ``scaling``: chains of 1, 2, 4, 8 agents (one LoRA adapter each) on ONE base: time
   per episode of the rollout (interleaved repetitions in this process) and memory
   (each team size in a fresh subprocess running one full GRPO step: peak RSS, parameter
   bytes, optimizer-state bytes).
3. ``memory`` (opt-in: ``--sections memory``): the same chains, each team size under each
   memory mode (``--memory-modes``): ``default``; ``checkpointing``
   (``activation_checkpointing``); ``low`` (``activation_checkpointing`` +
   ``release_freed_memory``). Every (size, mode) runs ``--memory-steps`` GRPO steps in a
   fresh subprocess, the modes interleaved per size; reported: peak RSS, the ratio to
   the 1-agent team of the same mode, and the last step's time with its ratio to the
   ``default`` mode at the same size (same seed, hence the same episodes).
4. ``bandwidth``: the decode memory-bandwidth bound of the model vs measured decode
   tokens/s of marft's generation. Every decode step reads every weight once (tied
   embeddings counted once) and the KV cache of every row, so a step takes at least
   ``(W + KV) / BW`` seconds: W = unique parameter bytes, KV = batch x mean context x
   the KV bytes per token (2 x layers x KV heads x head dim x the element size of the
   model's dtype), BW = measured read bandwidth (a large fp32 ``sum``). With ``s``
   decode steps producing ``n`` tokens the bound is ``n / (s * (W + KV) / BW)`` tokens/s;
   the KV part is also listed on its own (``kv_mb_per_step``). The prefill is excluded
   by subtracting a 1-token generation of the same batch.

5. ``async`` (opt-in: ``--sections async``): asynchronous rollouts (docs/async.md) on the
   duo. Three systems, in blocks of ``--async-block`` steps interleaved per repetition
   from a TRL callback (blocks, not single steps: a pipeline needs several steps to show
   its rate): marft GRPO duo synchronous (today's default threads: 1 to collect, 2 to
   update; and again with 1 thread in both phases, which isolates the gain of overlap
   from that of thread counts), marft GRPO duo with ``rollout_workers=1, max_staleness=1`` (one thread in the
   worker, one in the trainer) and TRL ``GRPOTrainer`` on a single agent (the ``grpo``
   section's settings). A block's rate is measured from the end of its first step to the
   end of its last (the first step fills the pipeline); the worker is stopped after each
   block so it generates nothing while the other systems run. Reported per block:
   samples/s and, for the asynchronous duo, the mean worker and trainer idle fractions
   (``perf/worker_idle_frac``, ``perf/trainer_idle_frac``) and staleness; ratios over
   repetitions (the first is a warm-up and dropped).

Outputs: ``throughput.md``, ``throughput.json``, ``grpo_vs_trl.csv``, ``scaling.csv``,
``memory_modes.csv``, ``bandwidth.csv``, ``async.csv`` and ``throughput.png`` in ``--out``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks` importable as a script

import torch  # noqa: E402

from benchmarks._common import (  # noqa: E402
    PeakMemory,
    markdown_table,
    max_rss_bytes,
    summary_stats,
    versions,
    write_csv,
    write_json,
)

__all__ = ["main", "build_parser", "GRPO_COLUMNS", "SCALING_COLUMNS", "MEMORY_COLUMNS", "MEMORY_MODES", "BANDWIDTH_COLUMNS", "ASYNC_COLUMNS", "ASYNC_SYSTEMS"]

GRPO_COLUMNS = ["rep", "system", "step_s", "rollout_s", "update_s", "tokens", "samples", "rollout_tok_s", "train_tok_s", "samples_s", "peak_mem_delta_mb"]
MEMORY_COLUMNS = ["agents", "mode", "rss_peak_mb", "rss_vs_solo", "step_s", "step_vs_default", "tokens_per_episode"]
#: TrainConfig settings of each memory mode
MEMORY_MODES: dict[str, dict[str, bool]] = {
    "default": {},
    "checkpointing": {"activation_checkpointing": True},
    "low": {"activation_checkpointing": True, "release_freed_memory": True},
}
SCALING_COLUMNS = ["agents", "episode_s_median", "episode_s_min", "episode_s_max", "tokens_per_episode", "rss_peak_mb", "param_mb", "adapter_mb", "optimizer_state_mb", "rss_vs_solo"]
ASYNC_COLUMNS = ["rep", "system", "steps", "wall_s", "samples", "samples_s", "worker_idle_frac", "trainer_idle_frac", "staleness"]
#: the systems of the async section, in report order
ASYNC_SYSTEMS = ["marft GRPO duo sync", "marft GRPO duo sync 1 thread", "marft GRPO duo 1 worker + trainer", "TRL GRPOTrainer solo"]
BANDWIDTH_COLUMNS = ["batch", "decode_steps", "tokens", "decode_s", "measured_tok_s", "bound_tok_s", "fraction_of_bound", "kv_mb_per_step"]

_MB = 1024 * 1024


# --------------------------------------------------------------------------------------
# section 1: marft GRPO vs TRL GRPOTrainer
# --------------------------------------------------------------------------------------


def _marft_grpo(model: str, env_id: str, agents_tokens: dict[str, int], group_size: int, lr: float, seed: int, **extra: Any) -> Any:
    from marft_algos.algos.grpo import GRPOConfig, GRPOTrainer

    config = GRPOConfig(
        env_id=env_id,
        model=model,
        num_envs=group_size,
        group_size=group_size,
        steps=10_000,
        lr=lr,
        lora_r=8,
        lora_alpha=16,
        seed=seed,
        sampling_overrides={a: {"max_new_tokens": t, "temperature": 1.0} for a, t in agents_tokens.items()},
        progress=False,
        plot=False,
        tensorboard=False,
        transcript_every=0,
        **extra,
    )
    return GRPOTrainer(config)


def _marft_step(trainer: Any) -> dict[str, float]:
    with PeakMemory() as mem:
        m = trainer.train_step()
    tokens = m.get("rollout/tokens", 0.0)
    samples = m.get("rollout/episodes", float(trainer.config.num_envs))
    return {
        "step_s": m["perf/step_s"],
        "rollout_s": m["perf/collect_s"],
        "update_s": m["perf/update_s"],
        "tokens": tokens,
        "samples": samples,
        "rollout_tok_s": tokens / max(m.get("perf/generate_s", m["perf/collect_s"]), 1e-9),
        "train_tok_s": tokens / m["perf/step_s"],
        "samples_s": samples / m["perf/step_s"],
        "peak_mem_delta_mb": mem.delta / _MB,
    }


def _trl_trainer(args: argparse.Namespace, steps: int) -> Any:
    """TRL's GRPOTrainer on the solo arith prompts for ``steps`` steps (the ``grpo`` section's
    settings: LoRA r=8 on the attention projections, no KL, temperature 1, fp32 on CPU)."""
    from peft import LoraConfig
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer as TRLTrainer

    from marft_algos.models import load_base

    G, T = args.group_size, args.gen_tokens
    dataset, task = _arith_dataset(steps * 4)

    def reward(completions: list[Any], pidx: list[int], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else str(c) for c in completions]
        return [float(task.grade(t, task.get(int(i))).correct) for t, i in zip(texts, pidx, strict=True)]

    model, tok = load_base(args.model)
    cuda = torch.cuda.is_available()
    cfg = TRLConfig(
        output_dir=tempfile.mkdtemp(prefix="marft-trl-"), per_device_train_batch_size=G, num_generations=G, max_completion_length=T,
        learning_rate=args.lr, max_steps=steps, logging_steps=1, report_to="none", save_strategy="no", use_cpu=not cuda, bf16=cuda,
        gradient_checkpointing=False, beta=0.0, temperature=1.0, seed=args.seed, dataloader_num_workers=0, disable_tqdm=True,
    )
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], bias="none", task_type="CAUSAL_LM")
    return TRLTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=dataset, processing_class=tok, peft_config=lora)


def _trl_grpo(args: argparse.Namespace, steps: int, callback: Any) -> Any:
    """:func:`_trl_trainer` with ``callback`` added; its generation runs on marft's collect threads."""
    from marft_algos.threads import phase_threads

    trl = _trl_trainer(args, steps)
    gen = trl._generate

    def threaded_generate(*a: Any, **k: Any) -> Any:
        with phase_threads("collect", args.collect_threads):
            return gen(*a, **k)

    trl._generate = threaded_generate
    trl.add_callback(callback)
    return trl


def run_async(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Blocks of synchronous duo, asynchronous duo (1 worker + trainer, 1 thread each) and
    TRL steps, interleaved per repetition (see the module docstring, section 5)."""
    from transformers import TrainerCallback

    from marft_algos.threads import threads_for, torch_threads

    G, T, B = args.group_size, args.gen_tokens, args.async_block
    if B < 2:
        raise SystemExit(f"--async-block must be at least 2 (the first step of a block fills the pipeline), got {B}")
    total = args.reps + 1  # + warm-up
    tokens = {"reasoner": T // 2, "actor": T - T // 2}
    print(f"[throughput] async: G={G}, <= {T} tokens per sample, blocks of {B} steps, {args.reps} reps (+1 warm-up)", flush=True)
    sync = _marft_grpo(args.model, "arith-duo-v0", tokens, G, args.lr, args.seed)
    sync1 = _marft_grpo(args.model, "arith-duo-v0", tokens, G, args.lr, args.seed, collect_threads=1, update_threads=1)
    asyn = _marft_grpo(args.model, "arith-duo-v0", tokens, G, args.lr, args.seed, rollout_workers=1, max_staleness=1,
                       collect_threads=1, update_threads=1, rollout_timeout_s=3600.0)
    rows: list[dict[str, Any]] = []

    def marft_block(name: str, trainer: Any, rep: int) -> None:
        ms, ends = [], []
        try:
            for _ in range(B):
                ms.append(trainer.train_step())
                ends.append(time.perf_counter())
        finally:
            if trainer.rollout is not None:
                trainer.rollout.stop()  # nothing generates while the other systems run
        wall = ends[-1] - ends[0]
        samples = sum(m.get("rollout/episodes", float(G)) for m in ms[1:])
        later = ms[1:]
        mean = (lambda k: sum(m[k] for m in later) / len(later)) if trainer.rollout is not None else (lambda k: float("nan"))
        rows.append({"rep": rep, "system": name, "steps": B - 1, "wall_s": wall, "samples": samples, "samples_s": samples / wall,
                     "worker_idle_frac": mean("perf/worker_idle_frac"), "trainer_idle_frac": mean("perf/trainer_idle_frac"),
                     "staleness": mean("rollout/staleness")})

    class Blocks(TrainerCallback):
        """Times TRL's steps; after each block of them, one block of each marft system."""

        def __init__(self) -> None:
            self.step = 0
            self.ends: list[float] = []
            self.threads: Any = None

        def on_step_begin(self, *a: Any, **k: Any) -> None:
            """The TRL step's threads (generation switches to the collect threads itself)."""
            self.threads = torch_threads(threads_for("update", args.update_threads))
            self.threads.__enter__()
            if not self.ends:
                self.ends.append(time.perf_counter())  # a TRL block is measured from its first step's start

        def on_step_end(self, *a: Any, **k: Any) -> None:
            """Record the step; at the end of a block, run the marft blocks."""
            self.threads.__exit__(None, None, None)
            self.ends.append(time.perf_counter())
            self.step += 1
            if self.step % (B - 1):
                return
            rep = self.step // (B - 1) - 1
            wall = self.ends[-1] - self.ends[0]
            rows.append({"rep": rep, "system": ASYNC_SYSTEMS[3], "steps": B - 1, "wall_s": wall, "samples": float(G * (B - 1)),
                         "samples_s": G * (B - 1) / wall, "worker_idle_frac": float("nan"), "trainer_idle_frac": float("nan"), "staleness": float("nan")})
            for name, tr in list(zip(ASYNC_SYSTEMS, (sync, sync1, asyn), strict=False))[:: 1 if rep % 2 == 0 else -1]:
                marft_block(name, tr, rep)
            print(f"[throughput] async rep {rep}: " + ", ".join(f"{r['system']} {r['samples_s']:.2f} samples/s" for r in rows[-4:]), flush=True)
            self.ends = []

    if args.async_peer == "trl":
        _trl_grpo(args, total * (B - 1), Blocks()).train()
    else:  # no peer: the marft blocks alone
        for rep in range(total):
            for name, tr in list(zip(ASYNC_SYSTEMS, (sync, sync1, asyn), strict=False))[:: 1 if rep % 2 == 0 else -1]:
                marft_block(name, tr, rep)
    measured = [r for r in rows if r["rep"] > 0] or rows
    summary: dict[str, Any] = {}
    sy, sy1, asy, peer = ASYNC_SYSTEMS
    pairs = [(asy, sy), (asy, sy1), (sy, peer), (asy, peer)]
    for a_name, b_name in pairs:
        ratios = []
        for rep in sorted({r["rep"] for r in measured}):
            a = next((r for r in measured if r["rep"] == rep and r["system"] == a_name), None)
            b = next((r for r in measured if r["rep"] == rep and r["system"] == b_name), None)
            if a and b:
                ratios.append(a["samples_s"] / b["samples_s"])
        if ratios:
            summary[f"{a_name} / {b_name}: samples_s"] = {**summary_stats(ratios), "reps": len(ratios)}
    for system in ASYNC_SYSTEMS:
        rs = [r for r in measured if r["system"] == system]
        if rs:
            summary[f"{system}: samples_s"] = summary_stats([r["samples_s"] for r in rs])
    rs = [r for r in measured if r["system"] == asy]
    for key in ("worker_idle_frac", "trainer_idle_frac", "staleness"):
        summary[f"{asy}: {key}"] = summary_stats([r[key] for r in rs])
    return rows, summary


def _arith_dataset(n: int) -> tuple[Any, Any]:
    """Chat prompts of the arith train split as the solo actor sees them, + the task."""
    from datasets import Dataset

    import marft_envs

    env = marft_envs.make("arith-solo-v0", split="train")
    rows = []
    for i in range(n):
        env.reset(seed=i, options={"problem_index": i % env.num_problems})
        rows.append({"prompt": env.messages("actor"), "pidx": i % env.num_problems})
    return Dataset.from_list(rows), env.task


def run_grpo_vs_trl(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """TRL steps with marft solo + duo steps interleaved (run from a TRL callback)."""
    from transformers import TrainerCallback

    G, T = args.group_size, args.gen_tokens
    total = args.reps + 1  # + warm-up
    print(f"[throughput] grpo: G={G}, <= {T} tokens per sample, {args.reps} reps (+1 warm-up)", flush=True)
    solo = _marft_grpo(args.model, "arith-solo-v0", {"actor": T}, G, args.lr, args.seed)
    duo = _marft_grpo(args.model, "arith-duo-v0", {"reasoner": T // 2, "actor": T - T // 2}, G, args.lr, args.seed)
    trl = _trl_trainer(args, total)

    # Instrument TRL: generation time and generated tokens of each step. These are private
    # methods (checked with TRL 1.16): a TRL that renamed or bypassed them must make this
    # benchmark fail, not report a generation time of 0.
    import trl as trl_pkg

    for name in ("_generate", "_generate_and_score_completions"):
        if not callable(getattr(trl, name, None)):
            raise RuntimeError(f"TRL {trl_pkg.__version__}: GRPOTrainer.{name} is gone; update the instrumentation in {__file__}")
    probe: dict[str, float] = {"gen_s": 0.0, "tokens": 0.0, "gen_calls": 0, "score_calls": 0}
    gen, score = trl._generate, trl._generate_and_score_completions

    from marft_algos.threads import phase_threads, threads_for, torch_threads

    def timed_generate(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            with phase_threads("collect", args.collect_threads):  # the peer gets marft's per-phase threads
                return gen(*a, **k)
        finally:
            probe["gen_s"] += time.perf_counter() - t0
            probe["gen_calls"] += 1

    def counted_score(*a: Any, **k: Any) -> Any:
        out = score(*a, **k)
        probe["tokens"] += float(out["completion_mask"].sum())
        probe["score_calls"] += 1
        return out

    trl._generate = timed_generate
    trl._generate_and_score_completions = counted_score
    rows: list[dict[str, Any]] = []

    class Interleave(TrainerCallback):
        """Times each TRL step and runs the marft steps between TRL steps (same load)."""

        def __init__(self) -> None:
            self.rep = 0
            self.threads: Any = None
            self.mem: PeakMemory | None = None
            self.t0 = 0.0

        def on_step_begin(self, *a: Any, **k: Any) -> None:
            """Reset the TRL probes; start the step's clock and memory sampling."""
            probe.update(gen_s=0.0, tokens=0.0, gen_calls=0, score_calls=0)
            self.mem = PeakMemory().__enter__()
            self.threads = torch_threads(threads_for("update", args.update_threads))
            self.threads.__enter__()  # the whole TRL step but its generation (set there)
            self.t0 = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            """Record the TRL step, then run one marft solo and one marft duo step."""
            step_s = time.perf_counter() - self.t0
            self.threads.__exit__(None, None, None)
            assert self.mem is not None
            self.mem.__exit__(None, None, None)
            if not probe["gen_calls"] or not probe["score_calls"]:
                raise RuntimeError(
                    f"TRL {trl_pkg.__version__} ran a training step without calling the instrumented "
                    f"_generate ({int(probe['gen_calls'])} calls) / _generate_and_score_completions "
                    f"({int(probe['score_calls'])} calls): its generation time and tokens cannot be measured"
                )
            tokens = probe["tokens"]
            rows.append({
                "rep": self.rep, "system": "TRL GRPOTrainer solo", "step_s": step_s, "rollout_s": probe["gen_s"],
                "update_s": step_s - probe["gen_s"], "tokens": tokens, "samples": float(G),
                "rollout_tok_s": tokens / max(probe["gen_s"], 1e-9), "train_tok_s": tokens / step_s,
                "samples_s": G / step_s, "peak_mem_delta_mb": self.mem.delta / _MB,
            })
            # Alternate the order of the two marft systems between repetitions.
            for name, tr in ([("marft GRPO solo", solo), ("marft GRPO duo", duo)])[:: 1 if self.rep % 2 == 0 else -1]:
                rows.append({"rep": self.rep, "system": name, **_marft_step(tr)})
            print(f"[throughput] grpo rep {self.rep}: " + ", ".join(f"{r['system']} {r['step_s']:.1f} s" for r in rows[-3:]), flush=True)
            self.rep += 1

    trl.add_callback(Interleave())
    trl.train()
    measured = [r for r in rows if r["rep"] > 0] or rows  # drop the warm-up repetition
    summary: dict[str, Any] = {}
    for ours in ("marft GRPO solo", "marft GRPO duo"):
        for metric in ("train_tok_s", "samples_s", "rollout_tok_s", "step_s"):
            ratios = []
            for rep in sorted({r["rep"] for r in measured}):
                a = next(r for r in measured if r["rep"] == rep and r["system"] == ours)
                b = next(r for r in measured if r["rep"] == rep and r["system"] == "TRL GRPOTrainer solo")
                ratios.append(a[metric] / b[metric] if b[metric] else float("nan"))
            summary[f"{ours} / TRL: {metric}"] = {**summary_stats(ratios), "reps": len(ratios)}
    for system in ("TRL GRPOTrainer solo", "marft GRPO solo", "marft GRPO duo"):
        rs = [r for r in measured if r["system"] == system]
        summary[f"{system}: step_s"] = summary_stats([r["step_s"] for r in rs])
        summary[f"{system}: tokens per step"] = summary_stats([r["tokens"] for r in rs])
        summary[f"{system}: peak_mem_delta_mb"] = summary_stats([r["peak_mem_delta_mb"] for r in rs])
    return rows, summary


# --------------------------------------------------------------------------------------
# section 2: team-size scaling
# --------------------------------------------------------------------------------------


def chain_profiles(n: int) -> list[dict[str, Any]]:
    """A chain of n agents on arith: n-1 helpers, then the answering agent."""
    return [
        {
            "role": f"agent_{i}",
            "prompt": "You are the final agent of a team. Check the previous messages and give the final answer inside \\boxed{}."
            if i == n - 1
            else f"You are agent {i + 1} of a {n}-agent team. Think step by step about the problem and help the next agent.",
            "with_answer": i == n - 1,
        }
        for i in range(n)
    ]


def _team_sizes(args: argparse.Namespace) -> list[int]:
    return [int(s) for s in args.scaling.split(",") if s.strip()]


def run_scaling(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Rollout time per episode for chains of several sizes on one base (one process),
    and memory of one full GRPO step per size (a fresh subprocess each)."""
    import marft_envs
    from marft_algos.models import TeamPolicy
    from marft_algos.rollout import RolloutCollector

    sizes = _team_sizes(args)
    print(f"[throughput] scaling: team sizes {sizes}, {args.scaling_episodes} episodes x {args.scaling_tokens} tokens per agent", flush=True)
    policy = TeamPolicy([f"agent_{i}" for i in range(max(sizes))], base=args.model, mode="lora")
    collectors = {}
    for n in sizes:
        profiles = chain_profiles(n)
        env_fn = (lambda p: lambda: marft_envs.make("arith-solo-v0", profiles=p, split="train"))(profiles)
        over = {f"agent_{i}": {"max_new_tokens": args.scaling_tokens, "temperature": 1.0} for i in range(n)}
        collectors[n] = RolloutCollector(env_fn, policy, num_envs=args.scaling_episodes, seed=args.seed, sampling_overrides=over)
    times: dict[int, list[float]] = {n: [] for n in sizes}
    tokens: dict[int, list[float]] = {n: [] for n in sizes}
    for rep in range(args.scaling_reps + 1):
        for n in sizes if rep % 2 == 0 else sizes[::-1]:
            torch.manual_seed(args.seed + rep)
            with torch.no_grad():
                batch = collectors[n].collect()
            if rep == 0:
                continue  # warm-up
            times[n].append(batch.metrics["perf/rollout_s"] / len(batch))
            tokens[n].append(batch.metrics["team/tokens_per_episode"])
        print(f"[throughput] scaling rep {rep}: " + ", ".join(f"{n}: {times[n][-1]:.2f} s/ep" for n in sizes if times[n]), flush=True)
    del policy, collectors
    gc.collect()
    rows = []
    for n in sizes:
        probe = _memory_probe_subprocess(args, n)
        st = summary_stats(times[n])
        rows.append({
            "agents": n,
            "episode_s_median": st["median"], "episode_s_min": st["min"], "episode_s_max": st["max"],
            "tokens_per_episode": summary_stats(tokens[n])["median"],
            **probe,
        })
    solo = next((r for r in rows if r["agents"] == 1), rows[0])
    for r in rows:
        r["rss_vs_solo"] = r["rss_peak_mb"] / solo["rss_peak_mb"] if solo.get("rss_peak_mb") else float("nan")
    return rows


def _memory_probe_subprocess(args: argparse.Namespace, n: int, mode: str = "default", steps: int = 1) -> dict[str, float]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--memory-probe", str(n), "--model", args.model,
           "--scaling-episodes", str(args.scaling_episodes), "--scaling-tokens", str(args.scaling_tokens), "--seed", str(args.seed),
           "--probe-mode", mode, "--probe-steps", str(steps)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("MEMPROBE ")]
    if out.returncode != 0 or not lines:
        print(f"[throughput] memory probe for {n} agents failed:\n{out.stderr[-2000:]}", flush=True)
        return {k: float("nan") for k in ("rss_peak_mb", "param_mb", "adapter_mb", "optimizer_state_mb", "step_s", "tokens_per_episode")}
    return json.loads(lines[-1][len("MEMPROBE "):])


def run_memory(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Peak RSS and step time per (team size, memory mode), each in a fresh subprocess."""
    sizes = _team_sizes(args)
    modes = [m.strip() for m in args.memory_modes.split(",") if m.strip()]
    unknown = sorted(set(modes) - set(MEMORY_MODES))
    if unknown:
        raise SystemExit(f"unknown memory modes {unknown}; choose from {sorted(MEMORY_MODES)}")
    if args.memory_steps < 1:
        raise SystemExit(f"--memory-steps must be at least 1 (the probe reports the last step), got {args.memory_steps}")
    rows: list[dict[str, Any]] = []
    for n in sizes:
        for mode in modes:
            probe = _memory_probe_subprocess(args, n, mode, steps=args.memory_steps)
            rows.append({"agents": n, "mode": mode, **probe})
            print(f"[throughput] memory: {n} agents, {mode}: {probe['rss_peak_mb']:.0f} MB, step {probe['step_s']:.1f} s", flush=True)
    for r in rows:
        solo = next((x for x in rows if x["agents"] == sizes[0] and x["mode"] == r["mode"]), r)
        ref = next((x for x in rows if x["agents"] == r["agents"] and x["mode"] == "default"), None)
        r["rss_vs_solo"] = r["rss_peak_mb"] / solo["rss_peak_mb"]
        r["step_vs_default"] = r["step_s"] / ref["step_s"] if ref else float("nan")
    return rows


def memory_probe(args: argparse.Namespace, n: int, mode: str = "default", steps: int = 1) -> dict[str, float]:
    """``steps`` full GRPO steps of an n-agent chain in THIS (fresh) process under memory
    ``mode`` (see :data:`MEMORY_MODES`); peak RSS after, and the last step's time."""
    from marft_algos.algos.grpo import GRPOConfig, GRPOTrainer

    G = max(2, min(args.scaling_episodes, 4))
    config = GRPOConfig(
        env_id="arith-solo-v0",
        env_kwargs={"profiles": chain_profiles(n)},
        model=args.model,
        num_envs=args.scaling_episodes - args.scaling_episodes % G,
        group_size=G,
        seed=args.seed,
        sampling_overrides={f"agent_{i}": {"max_new_tokens": args.scaling_tokens, "temperature": 1.0} for i in range(n)},
        progress=False,
        plot=False,
        tensorboard=False,
        transcript_every=0,
        **MEMORY_MODES[mode],
    )
    trainer = GRPOTrainer(config)
    for _ in range(steps):
        last = trainer.train_step()
    pb = trainer.policy.parameter_bytes()
    opt_bytes = 0
    seen: set[int] = set()
    for opt in trainer.optimizers.values():
        if id(opt) in seen:
            continue
        seen.add(id(opt))
        for st in opt.state.values():
            opt_bytes += sum(v.numel() * v.element_size() for v in st.values() if torch.is_tensor(v))
    if torch.cuda.is_available():
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = max_rss_bytes()
    return {"rss_peak_mb": peak / _MB, "param_mb": pb["total"] / _MB, "adapter_mb": pb["adapters"] / _MB, "optimizer_state_mb": opt_bytes / _MB,
            "step_s": float(last["perf/step_s"]), "tokens_per_episode": float(last.get("team/tokens_per_episode", float("nan")))}


# --------------------------------------------------------------------------------------
# section 3: decode memory-bandwidth bound
# --------------------------------------------------------------------------------------


def _bandwidth(mb: int = 512, reps: int = 5) -> dict[str, float]:
    """Read bandwidth (fp32 sum over a buffer far larger than the caches) and copy rate."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.ones(mb * _MB // 4, dtype=torch.float32, device=dev)
    y = torch.empty_like(x)
    read, copy = [], []
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        float(x.sum())
        read.append(x.nbytes / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        y.copy_(x)
        if dev == "cuda":
            torch.cuda.synchronize()
        copy.append(x.nbytes / (time.perf_counter() - t0))
    a = torch.randn(1024, 1024, device=dev)
    b = torch.randn(1024, 1024, device=dev)
    flops = []
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        c = a @ b
        if dev == "cuda":
            torch.cuda.synchronize()
        float(c[0, 0])
        flops.append(2 * 1024**3 / (time.perf_counter() - t0))
    del x, y
    return {"read_gb_s": max(read[1:]) / 1e9, "copy_gb_s": max(copy[1:]) / 1e9, "matmul_gflop_s": max(flops[1:]) / 1e9}


def run_bandwidth(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Measured decode tokens/s per batch size vs the memory-bandwidth bound; (rows, machine info)."""
    import marft_envs
    from marft_algos.models import GenRequest, SamplingParams, TeamPolicy

    policy = TeamPolicy(["actor"], base=args.model, mode="lora")
    base = policy.base_model("actor")
    seen: set[int] = set()
    weight_bytes = 0
    for p in list(base.parameters()) + list(base.buffers()):
        ptr = p.untyped_storage().data_ptr()
        if ptr not in seen and p.is_floating_point():
            seen.add(ptr)
            weight_bytes += p.untyped_storage().nbytes()
    cfg = base.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    # the cache holds keys and values in the model's compute dtype (the dtype of its weights)
    kv_dtype = next(p.dtype for p in base.parameters() if p.is_floating_point())
    kv_elem = torch.empty((), dtype=kv_dtype).element_size()
    kv_per_token = 2 * cfg.num_hidden_layers * getattr(cfg, "num_key_value_heads", cfg.num_attention_heads) * head_dim * kv_elem
    bw = _bandwidth(args.bandwidth_mb)
    print(f"[throughput] bandwidth: weights {weight_bytes / 1e6:.1f} MB per decode step, read {bw['read_gb_s']:.2f} GB/s, "
          f"copy {bw['copy_gb_s']:.2f} GB/s, matmul {bw['matmul_gflop_s']:.1f} GFLOP/s", flush=True)
    env = marft_envs.make("arith-solo-v0", split="train")
    prompts = []
    for i in range(max(args.decode_batches)):
        env.reset(options={"problem_index": i % env.num_problems})
        prompts.append(policy.encode("actor", env.messages("actor")))
    rows = []
    for B in args.decode_batches:
        def gen(max_new: int, B: int = B) -> tuple[float, list[Any]]:
            reqs = [GenRequest("actor", prompts[i], SamplingParams(temperature=1.0, max_new_tokens=max_new)) for i in range(B)]
            torch.manual_seed(args.seed)
            t0 = time.perf_counter()
            with torch.no_grad():
                res = policy.generate(reqs)
            return time.perf_counter() - t0, res

        gen(2)  # warm-up
        t1s, tns, res = [], [], []
        for _ in range(args.decode_reps):
            t1s.append(gen(1)[0])
            tn, res = gen(args.decode_tokens)
            tns.append(tn)
        # min over repetitions: the least-disturbed run on a shared machine
        decode_s = min(tns) - min(t1s)
        tokens = sum(len(r.token_ids) for r in res) - B  # minus the token that came with the prefill
        steps = max(len(r.token_ids) for r in res) - 1
        ctx = len(prompts[0]) + args.decode_tokens // 2
        kv = B * ctx * kv_per_token  # KV cache read per step at the mean context
        bound = tokens / (steps * (weight_bytes + kv) / (bw["read_gb_s"] * 1e9)) if steps > 0 else float("nan")
        measured = tokens / decode_s if decode_s > 0 else float("nan")
        best = {"batch": B, "decode_steps": steps, "tokens": tokens, "decode_s": decode_s, "measured_tok_s": measured,
                "bound_tok_s": bound, "fraction_of_bound": measured / bound if bound else float("nan"), "kv_mb_per_step": kv / _MB}
        rows.append(best)
        print(f"[throughput] decode batch {B}: {best['measured_tok_s']:.1f} tok/s measured, bound {best['bound_tok_s']:.1f} tok/s "
              f"({best['fraction_of_bound']:.2f} of bound)", flush=True)
    info = {"weight_bytes": weight_bytes, "kv_bytes_per_token": kv_per_token, "kv_dtype": str(kv_dtype).replace("torch.", ""), **bw,
            "compute_bound_tok_s_per_row": bw["matmul_gflop_s"] * 1e9 / (2 * sum(p.numel() for p in base.parameters()))}
    return rows, info


# --------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------


def _plot(out: Path, grpo: list[dict[str, Any]], scaling: list[dict[str, Any]], bandwidth: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    if grpo:
        systems = list(dict.fromkeys(r["system"] for r in grpo))
        data = [[r["train_tok_s"] for r in grpo if r["system"] == s and r["rep"] > 0] or [r["train_tok_s"] for r in grpo if r["system"] == s] for s in systems]
        axes[0].boxplot(data)
        axes[0].set_xticks(range(1, len(systems) + 1))
        axes[0].set_xticklabels(systems, rotation=15, fontsize=8)
        axes[0].set_ylabel("generated tokens / step time (tok/s)")
        axes[0].set_title("GRPO training throughput")
    if scaling:
        n = [r["agents"] for r in scaling]
        axes[1].plot(n, [r["episode_s_median"] for r in scaling], "o-", label="s / episode (rollout)")
        ax2 = axes[1].twinx()
        ax2.plot(n, [r["rss_peak_mb"] for r in scaling], "s--", color="tab:red", label="peak memory (MB)")
        ax2.set_ylabel("peak memory of one GRPO step (MB)")
        ax2.set_ylim(bottom=0)
        axes[1].set_xlabel("agents on one base")
        axes[1].set_ylabel("seconds per episode")
        axes[1].set_title("team-size scaling")
    if bandwidth:
        b = [r["batch"] for r in bandwidth]
        axes[2].plot(b, [r["measured_tok_s"] for r in bandwidth], "o-", label="measured")
        axes[2].plot(b, [r["bound_tok_s"] for r in bandwidth], "k--", label="bandwidth bound")
        axes[2].set_xscale("log", base=2)
        axes[2].set_yscale("log")
        axes[2].set_xlabel("decode batch")
        axes[2].set_ylabel("tokens / s")
        axes[2].legend()
        axes[2].set_title("decode vs memory-bandwidth bound")
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=110)
    plt.close(fig)


def write_report(out: Path, args: argparse.Namespace, res: dict[str, Any]) -> str:
    """Write ``throughput.md`` from the sections that ran; returns its text."""
    parts = [f"# Throughput\n\nmodel `{args.model}`; versions: " + ", ".join(f"{k} {v}" for k, v in res["versions"].items())]
    if res.get("grpo"):
        s = res["grpo_summary"]
        ratio_rows = [{"ratio": k, **v} for k, v in s.items() if "/ TRL" in k]
        abs_rows = [{"measure": k, **v} for k, v in s.items() if "/ TRL" not in k]
        parts.append(
            f"## GRPO step: marft vs TRL GRPOTrainer (G={args.group_size}, <= {args.gen_tokens} generated tokens per sample, "
            f"{args.reps} repetitions after 1 warm-up, interleaved in one process)\n\n"
            + markdown_table(ratio_rows, ["ratio", "min", "median", "max", "reps"])
            + "\n\n" + markdown_table(abs_rows, ["measure", "min", "median", "max"], digits=2)
            + "\n\nPer repetition:\n\n" + markdown_table(res["grpo"], GRPO_COLUMNS, digits=2)
        )
    if res.get("scaling"):
        parts.append(
            f"## Team-size scaling (chains on one base, {args.scaling_episodes} episodes x <= {args.scaling_tokens} tokens per agent; "
            f"time: median/min/max of {args.scaling_reps} interleaved repetitions; memory: one GRPO step in a fresh process)\n\n"
            + markdown_table(res["scaling"], SCALING_COLUMNS, digits=3)
        )
    if res.get("memory"):
        parts.append(
            f"## Memory modes (chains on one base, {args.scaling_episodes} episodes x <= {args.scaling_tokens} tokens per agent; "
            f"{args.memory_steps} GRPO steps per fresh process; step time of the last step)\n\n"
            + markdown_table(res["memory"], MEMORY_COLUMNS, digits=3)
        )
    if res.get("async"):
        s = res["async_summary"]
        parts.append(
            f"## Asynchronous rollouts: duo samples/s, synchronous vs 1 worker + trainer (1 thread each) vs TRL GRPOTrainer "
            f"(G={args.group_size}, <= {args.gen_tokens} generated tokens per sample, blocks of {args.async_block} steps, "
            f"{args.reps} repetitions after 1 warm-up)\n\n"
            + markdown_table([{"measure": k, **v} for k, v in s.items()], ["measure", "min", "median", "max", "reps"], digits=3)
            + "\n\nPer block:\n\n" + markdown_table(res["async"], ASYNC_COLUMNS, digits=3)
        )
    if res.get("bandwidth"):
        info = res["bandwidth_info"]
        parts.append(
            "## Decode vs memory-bandwidth bound\n\n"
            f"weights read per decode step W = {info['weight_bytes'] / 1e6:.1f} MB (unique parameter storage, tied embeddings once); "
            f"measured read bandwidth BW = {info['read_gb_s']:.2f} GB/s (fp32 sum over {args.bandwidth_mb} MB), copy {info['copy_gb_s']:.2f} GB/s; "
            f"matmul {info['matmul_gflop_s']:.1f} GFLOP/s (compute bound ~{info['compute_bound_tok_s_per_row']:.0f} tok/s). "
            f"KV = batch x mean context x {info['kv_bytes_per_token']} bytes per token ({info['kv_dtype']} cache). "
            "bound = tokens / (decode steps x (W + KV) / BW).\n\n"
            + markdown_table(res["bandwidth"], BANDWIDTH_COLUMNS, digits=2)
        )
    text = "\n\n".join(parts) + "\n"
    (out / "throughput.md").write_text(text)
    return text


def build_parser() -> argparse.ArgumentParser:
    """Options of ``benchmarks/throughput.py``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--sections", default="grpo,scaling,bandwidth", help="comma list of grpo, scaling, memory, bandwidth, async")
    p.add_argument("--async-block", type=int, default=4, help="async section: steps per block (the first fills the pipeline)")
    p.add_argument("--async-peer", default="trl", choices=["trl", "none"], help="async section: run TRL's GRPOTrainer beside it, or no peer")
    p.add_argument("--reps", type=int, default=5, help="measured GRPO repetitions (after one warm-up)")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--gen-tokens", type=int, default=64, help="max generated tokens per sample (the duo splits it between its agents)")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--scaling", default="1,2,4,8", help="team sizes")
    p.add_argument("--scaling-episodes", type=int, default=8)
    p.add_argument("--scaling-tokens", type=int, default=32)
    p.add_argument("--scaling-reps", type=int, default=3)
    p.add_argument("--memory-modes", default="default,checkpointing,low", help=f"memory section: comma list of {', '.join(MEMORY_MODES)}")
    p.add_argument("--memory-steps", type=int, default=2, help="memory section: GRPO steps per probe process")
    p.add_argument("--bandwidth-mb", type=int, default=512, help="buffer for the bandwidth probe (far above the caches)")
    p.add_argument("--decode-batches", default="1,8,32", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--decode-tokens", type=int, default=64)
    p.add_argument("--decode-reps", type=int, default=2)
    p.add_argument("--collect-threads", type=int, default=0, help="torch threads of TRL's generation (0 = marft_algos.threads' default, 1)")
    p.add_argument("--update-threads", type=int, default=0, help="torch threads of the rest of TRL's step (0 = marft_algos.threads' default, 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/throughput")
    p.add_argument("--memory-probe", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--probe-mode", default="default", choices=sorted(MEMORY_MODES), help=argparse.SUPPRESS)
    p.add_argument("--probe-steps", type=int, default=1, help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the selected sections and write the report; exit status 0."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.memory_probe is not None:
        print("MEMPROBE " + json.dumps(memory_probe(args, args.memory_probe, args.probe_mode, args.probe_steps)), flush=True)
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sections = {s.strip() for s in args.sections.split(",")}
    res: dict[str, Any] = {"versions": versions(), "settings": vars(args), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                           "load_average_start": os.getloadavg()}
    if "grpo" in sections:
        res["grpo"], res["grpo_summary"] = run_grpo_vs_trl(args)
        gc.collect()  # the three models of this section are released before the next
        write_csv(out / "grpo_vs_trl.csv", res["grpo"], GRPO_COLUMNS)
    if "scaling" in sections:
        res["scaling"] = run_scaling(args)
        write_csv(out / "scaling.csv", res["scaling"], SCALING_COLUMNS)
    if "memory" in sections:
        res["memory"] = run_memory(args)
        write_csv(out / "memory_modes.csv", res["memory"], MEMORY_COLUMNS)
    if "async" in sections:
        res["async"], res["async_summary"] = run_async(args)
        gc.collect()
        write_csv(out / "async.csv", res["async"], ASYNC_COLUMNS)
    if "bandwidth" in sections:
        res["bandwidth"], res["bandwidth_info"] = run_bandwidth(args)
        write_csv(out / "bandwidth.csv", res["bandwidth"], BANDWIDTH_COLUMNS)
    res["load_average_end"] = os.getloadavg()
    write_json(out / "throughput.json", res)
    _plot(out, res.get("grpo", []), res.get("scaling", []), res.get("bandwidth", []))
    print(write_report(out, args, res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
