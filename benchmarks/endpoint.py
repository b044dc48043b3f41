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
and episodes/s, episodes/s relative to the same path at the first K (how concurrency
pays), the episodes a program failure ended (timeouts would otherwise pass for speed), and
the ratio endpoint / built-in. On a shared CPU only the ratios are meaningful.
``--budget-minutes`` stops starting new concurrencies once spent (the rest are listed as
not measured), so a slow machine still gives the small-K rows.

Note that the paths do not take the same number of engine rounds: the built-in env's AEC
order answers ``solver_a`` and ``solver_b`` one round each (3 rounds per episode), the
program's fan-out is answered in one (2 rounds).

Usage::

    python benchmarks/endpoint.py                                   # smollm2-135m
    python benchmarks/endpoint.py --model tiny-random --concurrency 1,4 --repeats 1
    python benchmarks/endpoint.py --concurrency 1,4,16,64 --budget-minutes 40 --out endpoint.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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


FAILED_FLAGS = ("program_timeout", "program_error", "unknown_role", "max_calls_exceeded", "bad_program_return")
METRICS = ("samples_s", "tokens_s", "episodes_s")


def _collect(env_fn: Any, policy: Any, k: int, max_new: int, seed: int) -> dict[str, float]:
    """One batch of ``k`` concurrent episodes; its throughput and how many episodes a program flag ended."""
    sampling = {r: {"max_new_tokens": max_new, "temperature": 1.0} for r in ROLES}
    col = RolloutCollector(env_fn, policy, num_envs=k, seed=seed, sampling_overrides=sampling, share_prefill=False)
    t0 = time.perf_counter()
    batch = col.collect()
    dt = time.perf_counter() - t0
    for env in col.envs:
        env.close()
    calls = sum(len(ep.transitions) for ep in batch.episodes)
    tokens = sum(ep.num_tokens for ep in batch.episodes)
    # an episode a program failure ended early is fast and worthless: count it, so a high
    # episodes/s at large K made of timeouts cannot pass for throughput
    failed = sum(any(f in FAILED_FLAGS for t in ep.transitions for f in t.flags) for ep in batch.episodes)
    return {"samples_s": calls / dt, "tokens_s": tokens / dt, "episodes_s": len(batch.episodes) / dt,
            "calls": calls, "episodes": len(batch.episodes), "failed": failed,
            "accuracy": batch.metrics.get("team/accuracy", 0.0)}


def build_parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--concurrency", default="1,4,16,64", help="comma-separated numbers of concurrent episodes")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2, help="runs per path and concurrency (medians reported)")
    ap.add_argument("--budget-minutes", type=float, default=None,
                    help="stop starting new concurrencies after this much wall time; the rest are listed as not measured")
    ap.add_argument("--out", default=None, help="also write the rows as JSON here")
    return ap


def _row_text(r: dict[str, Any]) -> str:
    if r.get("status") == "not measured":
        return f"| {r['path']} | {r['episodes']} | not measured ({r['reason']}) | | | | |"
    fmt = "{:.2f}" if r["path"].startswith("ratio") else "{:.3g}"
    cells = [fmt.format(r[m]) for m in METRICS]
    cells.append(f"{r['scaling']:.2f}" if r.get("scaling") is not None else "-")
    cells.append(str(r["failed"]) if "failed" in r else "-")
    return f"| {r['path']} | {r['episodes']} | " + " | ".join(cells) + " |"


HEADER = ("| path | concurrent episodes | samples/s | tokens/s | episodes/s | episodes/s vs the first K | failed episodes |\n"
          "|---|---|---|---|---|---|---|")


def measure(policy: Any, paths: dict[str, Any], ks: list[int], max_new: int, repeats: int,
            budget_s: float | None = None, echo: Any = print) -> list[dict[str, Any]]:
    """Both ``paths`` at each concurrency in ``ks``, interleaved; the rows (medians), echoed as they finish.

    Per path and K: medians of samples/s, tokens/s, episodes/s over ``repeats``; ``scaling`` is
    episodes/s over the same path's episodes/s at the first K (how concurrency pays); ``failed``
    the episodes (over all repeats) a program flag ended. After each K, a ratio row
    (second path / first). Once ``budget_s`` has passed (checked after the first K), the remaining Ks get
    ``status="not measured"`` rows instead of running.
    """
    names = list(paths)
    rows: list[dict[str, Any]] = []
    first: dict[str, float] = {}
    t0 = time.perf_counter()
    for k in ks:
        if rows and budget_s is not None and time.perf_counter() - t0 > budget_s:  # the first K always runs
            for name in names:
                rows.append({"path": name, "episodes": k, "status": "not measured", "reason": f"budget of {budget_s:.0f} s spent"})
                echo(_row_text(rows[-1]))
            continue
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
        for rep in range(repeats):
            order = names if rep % 2 == 0 else list(reversed(names))  # alternate: neither path always goes first
            for name in order:
                runs[name].append(_collect(paths[name], policy, k, max_new, seed=rep))
        med = {name: {m: statistics.median(r[m] for r in rs) for m in METRICS} for name, rs in runs.items()}
        for name in names:
            first.setdefault(name, med[name]["episodes_s"])
            rows.append({"path": name, "episodes": k, "status": "ok", **med[name],
                         "scaling": med[name]["episodes_s"] / first[name],
                         "failed": sum(int(r["failed"]) for r in runs[name])})
        a, b = (med[n] for n in names)
        rows.append({"path": f"ratio {names[1].split(' ')[0]} / {names[0].split(' ')[0]}", "episodes": k, "status": "ok",
                     **{m: b[m] / a[m] for m in METRICS}, "scaling": None})
        for r in rows[-3:]:  # as each concurrency finishes: a long run killed early keeps its rows
            echo(_row_text(r))
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Measure both paths at each concurrency, interleaved; print a Markdown table (and ``--out`` JSON)."""
    args = build_parser().parse_args(argv)
    try:
        ks = [int(x) for x in args.concurrency.split(",") if x.strip()]
    except ValueError:
        ks = []
    if not ks or min(ks) < 1:
        raise SystemExit(f"--concurrency must list positive integers, e.g. 1,4,16,64; got {args.concurrency!r}")
    from marft_algos.models import TeamPolicy

    policy = TeamPolicy(ROLES, base=args.model, max_context=1024)
    paths = {
        "built-in env (arith-trio-v0)": lambda: marft_envs.make("arith-trio-v0"),
        "endpoint (ProgramEnv + AsyncOpenAI)": lambda: ProgramEnv(trio_program, ROLES, "arith", split="train"),
    }
    _collect(paths["endpoint (ProgramEnv + AsyncOpenAI)"], policy, 1, 2, seed=99)  # warm-up: server, client, model
    print(f"model {args.model}, max_new_tokens {args.max_new_tokens}, repeats {args.repeats} (medians)\n", flush=True)
    print(HEADER, flush=True)
    budget = None if args.budget_minutes is None else 60 * args.budget_minutes
    rows = measure(policy, paths, ks, args.max_new_tokens, args.repeats, budget, echo=lambda s: print(s, flush=True))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump({"args": vars(args), "rows": rows, "loadavg": list(os.getloadavg())}, fh, indent=1)
    return rows


if __name__ == "__main__":
    main()
