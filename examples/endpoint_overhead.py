"""What the OpenAI-compatible endpoint costs over calling the engine in-process.

The same K chat requests (3 roles, one prompt each, ``max_tokens`` new tokens, greedy)
are generated (a) by one ``policy.generate`` call and (b) as K concurrent HTTP requests
from ``openai.AsyncOpenAI`` to ``TeamServer``, which batches them into engine calls.
Prints samples/s and tokens/s of both. On the tiny random model the engine is so
fast that (b) mostly measures HTTP and JSON overhead: an upper bound on the relative
cost for a real model.

    python examples/endpoint_overhead.py --model tiny-random --requests 48 --max-tokens 16
"""

from __future__ import annotations

import argparse
import asyncio
import time

import openai

from marft_algos.models import GenRequest, SamplingParams, TeamPolicy
from marft_algos.serve import TeamServer

ROLES = ["planner", "solver", "verifier"]


def main() -> None:
    """Run both paths and print a two-row table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3, help="runs of each path; the fastest counts (a shared machine is noisy)")
    args = ap.parse_args()
    policy = TeamPolicy(ROLES, base=args.model, max_context=1024)
    messages = [[{"role": "user", "content": f"Problem {k}: what is {k} + {k}?"}] for k in range(args.requests)]
    roles = [ROLES[k % len(ROLES)] for k in range(args.requests)]
    sampling = SamplingParams(temperature=0.0, max_new_tokens=args.max_tokens)
    reqs = [GenRequest(r, policy.encode(r, m), sampling) for r, m in zip(roles, messages, strict=True)]
    policy.generate(reqs[:2])  # warm-up

    t_direct, tok_direct = float("inf"), 0
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        direct = policy.generate(reqs)
        t_direct = min(t_direct, time.perf_counter() - t0)
        tok_direct = sum(len(r.token_ids) for r in direct)

    with TeamServer(policy, window_s=0.02) as srv:
        client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=600)

        async def one(role: str, msgs: list[dict[str, str]]) -> int:
            r = await client.chat.completions.create(model=role, messages=msgs, max_tokens=args.max_tokens, temperature=0)
            return r.usage.completion_tokens

        async def run_all() -> tuple[float, int]:
            await one(roles[0], messages[0])  # warm-up (connection, first request)
            best, tokens = float("inf"), 0
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                done = await asyncio.gather(*[one(r, m) for r, m in zip(roles, messages, strict=True)])
                best, tokens = min(best, time.perf_counter() - t0), sum(done)
            return best, tokens

        before = srv.batcher.stats["engine_calls"]
        t_served, tok_served = asyncio.run(run_all())
        calls = (srv.batcher.stats["engine_calls"] - before - 1) / args.repeats
    print("| path | samples/s | tokens/s | engine calls per run |\n|---|---|---|---|")
    print(f"| in-process generate | {args.requests / t_direct:.1f} | {tok_direct / t_direct:.1f} | 1 |")
    print(f"| endpoint (AsyncOpenAI x {args.requests}) | {args.requests / t_served:.1f} | {tok_served / t_served:.1f} | {calls:.1f} |")


if __name__ == "__main__":
    main()
