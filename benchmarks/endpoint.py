"""A 3-role team through the OpenAI-compatible endpoint vs the same team as a built-in env.

The team is ``arith-trio-v0``'s: ``solver_a`` and ``solver_b`` solve an arith problem
independently, the ``aggregator`` sees both and answers. Path (a) is the built-in env
(``marft_envs.make("arith-trio-v0")``). Path (b) is :func:`trio_program`, a plain
``openai.AsyncOpenAI`` program with the same prompts (the solvers as an
``asyncio.gather`` fan-out), run by :class:`~marft_envs.program_env.ProgramEnv` through the
loopback endpoint. Both are collected by the same :class:`~marft_algos.rollout.RolloutCollector`
on the same policy (one base model, the untrained team), with the same sampling
(temperature 1, at most ``--max-new-tokens`` per call), interleaved in one process.

For each number K of concurrent episodes (``--concurrency``, default 1,4,16,64), each
path collects K episodes at once (``num_envs=K``), ``--repeats`` times; the table gives
medians of samples/s (answered calls per second), tokens/s (generated tokens per second)
and episodes/s, and the ratio endpoint / built-in. On a shared CPU only the ratios are
meaningful.

Note that the paths do not take the same number of engine rounds: the built-in env's AEC
order answers ``solver_a`` and ``solver_b`` one round each (3 rounds per episode), the
program's fan-out is answered in one (2 rounds).

Usage::

    python benchmarks/endpoint.py                                   # smollm2-135m
    python benchmarks/endpoint.py --model tiny-random --concurrency 1,4 --repeats 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import marft_envs
from marft_algos.rollout import RolloutCollector
from marft_envs.program_env import ProgramEnv

ROLES = ["solver_a", "solver_b", "aggregator"]
SYSTEM = {  # arith-trio-v0's prompts, so both paths condition on the same text
    "solver_a": "You are one of two independent solvers. Solve the problem step by step and end with your answer inside \\boxed{}.",
    "solver_b": ("You are one of two independent solvers. Solve the problem in your own way, checking each step, "
                 "and end with your answer inside \\boxed{}."),
    "aggregator": ("You are the aggregator. Compare the two solvers' solutions, decide which is right (or correct both), "
                   "and give the final answer inside \\boxed{}."),
}
_CLIENTS: dict[str, Any] = {}


async def trio_program(base_url: str, problem: Any) -> str:
    """The team as a user writes it: two solvers at once, then the aggregator (its reply is graded)."""
    import openai

    host = base_url.split("/episodes/")[0]
    if host not in _CLIENTS:  # one client (one connection pool) on the shared program loop
        _CLIENTS[host] = openai.AsyncOpenAI(base_url=host + "/v1", api_key="unused", max_retries=0, timeout=600)
    client = _CLIENTS[host].with_options(base_url=base_url)

    async def ask(role: str, user: str) -> str:
        r = await client.chat.completions.create(
            model=role, messages=[{"role": "system", "content": SYSTEM[role]}, {"role": "user", "content": user}])
        return r.choices[0].message.content or ""

    question = f"Problem:\n{problem.question}"
    a, b = await asyncio.gather(ask("solver_a", question), ask("solver_b", question))
    return await ask("aggregator", f"{question}\n\nYour teammates' responses:\n[solver_a]: {a}\n\n[solver_b]: {b}\n\n"
                                   "Give the final answer as a single number inside \\boxed{}.")


def _collect(env_fn: Any, policy: Any, k: int, max_new: int, seed: int) -> dict[str, float]:
    """One batch of ``k`` concurrent episodes; its throughput."""
    sampling = {r: {"max_new_tokens": max_new, "temperature": 1.0} for r in ROLES}
    col = RolloutCollector(env_fn, policy, num_envs=k, seed=seed, sampling_overrides=sampling, share_prefill=False)
    t0 = time.perf_counter()
    batch = col.collect()
    dt = time.perf_counter() - t0
    for env in col.envs:
        env.close()
    calls = sum(len(ep.transitions) for ep in batch.episodes)
    tokens = sum(ep.num_tokens for ep in batch.episodes)
    return {"samples_s": calls / dt, "tokens_s": tokens / dt, "episodes_s": len(batch.episodes) / dt,
            "calls": calls, "accuracy": batch.metrics.get("team/accuracy", 0.0)}


def main(argv: list[str] | None = None) -> None:
    """Measure both paths at each concurrency, interleaved; print a Markdown table (and ``--out`` JSON)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--concurrency", default="1,4,16,64", help="comma-separated numbers of concurrent episodes")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2, help="runs per path and concurrency (medians reported)")
    ap.add_argument("--out", default=None, help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    ks = [int(x) for x in args.concurrency.split(",") if x.strip()]
    if not ks or min(ks) < 1:
        raise SystemExit(f"--concurrency must list positive integers, got {args.concurrency!r}")
    from marft_algos.models import TeamPolicy

    policy = TeamPolicy(ROLES, base=args.model, max_context=1024)
    paths = {
        "built-in env (arith-trio-v0)": lambda: marft_envs.make("arith-trio-v0"),
        "endpoint (ProgramEnv + AsyncOpenAI)": lambda: ProgramEnv(trio_program, ROLES, "arith", split="train"),
    }
    _collect(paths["endpoint (ProgramEnv + AsyncOpenAI)"], policy, 1, 2, seed=99)  # warm-up: server, client, model
    rows = []
    print(f"model {args.model}, max_new_tokens {args.max_new_tokens}, repeats {args.repeats} (medians)\n", flush=True)
    print("| path | concurrent episodes | samples/s | tokens/s | episodes/s |\n|---|---|---|---|---|", flush=True)
    for k in ks:
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in paths}
        for rep in range(args.repeats):
            order = list(paths) if rep % 2 == 0 else list(reversed(paths))  # alternate: neither path always goes first
            for name in order:
                runs[name].append(_collect(paths[name], policy, k, args.max_new_tokens, seed=rep))
        med = {name: {m: statistics.median(r[m] for r in rs) for m in ("samples_s", "tokens_s", "episodes_s")}
               for name, rs in runs.items()}
        for name in paths:
            rows.append({"path": name, "episodes": k, **med[name]})
        a, b = (med[n] for n in paths)
        rows.append({"path": "ratio endpoint / built-in", "episodes": k,
                     **{m: b[m] / a[m] for m in ("samples_s", "tokens_s", "episodes_s")}})
        for r in rows[-3:]:  # as each concurrency finishes: a long run killed early keeps its rows
            fmt = "{:.2f}" if r["path"].startswith("ratio") else "{:.3g}"
            print(f"| {r['path']} | {r['episodes']} | "
                  + " | ".join(fmt.format(r[m]) for m in ("samples_s", "tokens_s", "episodes_s")) + " |", flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump({"args": vars(args), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
