"""Rollout decode speed: ``TeamPolicy.generate`` vs HF ``generate`` on the same model.

A duo (two LoRA roles on one base) samples replies to chat prompts at batch 1/8/32
(rows alternate roles, so every batch mixes both adapters), plus a GRPO-style batch of
4 prompts x 8 samples. HF ``generate`` runs on the same peft model with the same
prompts and ``adapter_names`` (one per row), in the same process, interleaved with ours
(alternating order over ``--repeats`` runs), so the ratio is measured side by side. Tokens/s counts generated tokens up to and including
EOS (padding after a finished row is not counted).

With ``--continuous-batching`` it measures the duo rollout instead (``arith-duo-v0``, the
collector with sampling from the team's profiles, each agent <= ``--max-new-tokens``):
continuous batching on vs off (``RolloutCollector(continuous_batching=...)``) on the same
policy, interleaved over ``--repeats`` runs per side in this process; tokens/s (generated
tokens / rollout seconds) and samples/s (episodes / rollout seconds), medians, and the
ratios on / off.

With ``--profile`` it breaks one batch-``--batches[-1]`` generation down instead: wall time
into model forwards (prefill and decode steps), sampling and the rest (the Python loop:
finish checks, stop strings, row bookkeeping); the share of attended KV columns that are
padding; and the top operators of the decode forwards (``torch.profiler``, self CPU time).

Usage::

    python benchmarks/decode_speed.py                         # smollm2-135m, 32 new tokens
    python benchmarks/decode_speed.py --model tiny-random --max-new-tokens 16
    python benchmarks/decode_speed.py --continuous-batching --episodes 32 --group-size 8
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from marft_algos.models import GenRequest, SamplingParams, TeamPolicy

QUESTIONS = [
    "What is {a} + {b}?",
    "Compute {a} times {b}.",
    "Is {a} larger than {b}? Explain briefly.",
    "Write a short sentence about the number {a}.",
]


def prompts_for(policy: TeamPolicy, roles: list[str], n: int, distinct: int | None = None) -> list[tuple[str, list[int]]]:
    """n encoded chat prompts ``(role, ids)``; with ``distinct``, groups of equal prompts (GRPO-like)."""
    out = []
    for i in range(n):
        k = i if distinct is None else i // (n // distinct)
        role = roles[i % len(roles)] if distinct is None else roles[k % len(roles)]
        q = QUESTIONS[k % len(QUESTIONS)].format(a=3 + k, b=7 + 2 * k)
        msgs = [{"role": "system", "content": f"You are the {role}."}, {"role": "user", "content": q}]
        out.append((role, policy.encode(role, msgs)))
    return out


def ours(policy: TeamPolicy, rows: list[tuple[str, list[int]]], max_new: int) -> tuple[int, float]:
    """Generate with marft's ``policy.generate``: (generated tokens, seconds)."""
    sp = SamplingParams(temperature=1.0, max_new_tokens=max_new)
    t0 = time.perf_counter()
    res = policy.generate([GenRequest(r, p, sp) for r, p in rows])
    dt = time.perf_counter() - t0
    return sum(len(x.token_ids) for x in res), dt


def hf(policy: TeamPolicy, rows: list[tuple[str, list[int]]], max_new: int) -> tuple[int, float]:
    """Generate the same rows with HF ``model.generate`` (left padding, per-row adapters): (tokens up to EOS, seconds)."""
    role0 = rows[0][0]
    model, tok = policy.model(role0), policy.tokenizer(role0)
    plen = max(len(p) for _, p in rows)
    pad = tok.pad_token_id
    ids = torch.full((len(rows), plen), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (_, p) in enumerate(rows):
        ids[i, plen - len(p) :] = torch.tensor(p)
        mask[i, plen - len(p) :] = 1
    eos = sorted(policy._base(role0).eos_ids)
    kwargs = {}
    if policy.mode != "full":
        kwargs["adapter_names"] = [policy.adapter_of(r) for r, _ in rows]
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
            max_new_tokens=max_new, pad_token_id=pad, eos_token_id=eos, **kwargs,
        )
    dt = time.perf_counter() - t0
    tokens = 0
    for row in out[:, plen:].tolist():
        n = len(row)
        for j, t in enumerate(row):
            if t in eos:
                n = j + 1
                break
        tokens += n
    return tokens, dt


def rollout_on_off(policy: TeamPolicy, args: argparse.Namespace) -> None:
    """Print the duo rollout with continuous batching off vs on (one side per
    ``--join-fractions`` value), interleaved, medians."""
    import os

    import marft_envs
    from marft_algos.rollout import RolloutCollector

    env_id = "arith-duo-v0"
    agents = marft_envs.make(env_id).possible_agents
    over = {a: {"max_new_tokens": args.max_new_tokens} for a in agents}
    sides: list[float | None] = [None, *args.join_fractions]  # None: continuous batching off
    cols = {
        side: RolloutCollector(lambda: marft_envs.make(env_id), policy, num_envs=args.episodes, group_size=args.group_size,
                               seed=args.seed, sampling_overrides=over, continuous_batching=side is not None)
        for side in sides
    }
    ours(policy, prompts_for(policy, list(agents), 2), 2)  # warm-up
    name = {side: "off" if side is None else f"on (join {side:g})" for side in sides}
    runs: dict[float | None, list[tuple[int, int, float]]] = {side: [] for side in sides}
    for rep in range(args.repeats):
        order = sides if rep % 2 == 0 else sides[::-1]  # alternate: the load drifts between runs
        for side in order:
            if side is not None:
                policy.engine.join_fraction = side
            torch.manual_seed(args.seed + rep)
            batch = cols[side].collect()
            m = batch.metrics
            runs[side].append((int(m["rollout/tokens"]), len(batch.episodes), m["perf/rollout_s"]))
            print(f"  run {rep} {name[side]}: {runs[side][-1][0]} tokens, {runs[side][-1][2]:.1f}s, "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
    header = f"{'continuous':<14} {'tok/s':>7} {'samples/s':>10} {'vs off':>7} {'tokens':>7} {'episodes':>8} {'seconds':>8}"
    print(header)
    print("-" * len(header))
    med = {side: (statistics.median(n / d for n, _, d in runs[side]), statistics.median(e / d for _, e, d in runs[side])) for side in sides}
    for side in sides:
        tok_s, smp_s = med[side]
        print(f"{name[side]:<14} {tok_s:>7.1f} {smp_s:>10.3f} {tok_s / med[None][0]:>7.2f} {sum(n for n, _, _ in runs[side]):>7} "
              f"{sum(e for _, e, _ in runs[side]):>8} {sum(d for _, _, d in runs[side]):>8.1f}")
    print(f"\n{env_id}, {args.episodes} episodes (groups of {args.group_size}) per rollout, each agent <= {args.max_new_tokens} "
          f"tokens, profile sampling; medians over {args.repeats} rollouts per side (order alternating); 'vs off' = "
          f"tokens/s ratio (samples/s ratios: {', '.join(f'{name[s]} {med[s][1] / med[None][1]:.2f}' for s in sides[1:])}); "
          f"load average {os.getloadavg()[0]:.1f} at the end.")


def profile_decode(policy: TeamPolicy, roles: list[str], args: argparse.Namespace) -> None:
    """Print where the time of one batched generation goes (see the module docstring)."""
    from torch.profiler import ProfilerActivity, profile

    import marft_algos.engines.hf as hf_mod

    batch = args.batches[-1]
    rows = prompts_for(policy, roles, batch)
    engine = policy.engine
    spent = {"prefill": 0.0, "decode": 0.0, "sample": 0.0}
    counts = {"decode": 0, "cols": 0, "pad_cols": 0}
    forward, sample = engine._forward, hf_mod.sample_next

    def timed_forward(b, **kw):
        t = time.perf_counter()
        out = forward(b, **kw)
        kind = "decode" if kw["ids"].shape[1] == 1 else "prefill"
        spent[kind] += time.perf_counter() - t
        if kind == "decode":
            m = kw["mask"]
            counts["decode"] += 1
            counts["cols"] += m.numel()
            counts["pad_cols"] += int(m.numel() - m.sum())
        return out

    def timed_sample(*a, **k):
        t = time.perf_counter()
        out = sample(*a, **k)
        spent["sample"] += time.perf_counter() - t
        return out

    engine._forward, hf_mod.sample_next = timed_forward, timed_sample
    try:
        ours(policy, rows[:2], 4)  # warm-up
        for k in spent:
            spent[k] = 0.0
        counts.update(decode=0, cols=0, pad_cols=0)
        tokens, wall = ours(policy, rows, args.max_new_tokens)
    finally:
        engine._forward, hf_mod.sample_next = forward, sample
    rest = wall - sum(spent.values())
    print(f"batch {batch}, {tokens} tokens in {wall:.2f}s ({tokens / wall:.1f} tok/s), {counts['decode']} decode steps")
    for k, v in [*spent.items(), ("python loop (rest)", rest)]:
        per = f", {1e3 * v / max(counts['decode'], 1):.1f} ms/step" if k != "prefill" else ""
        print(f"  {k:<20} {v:>7.2f}s {100 * v / wall:>5.1f}%{per}")
    print(f"  attended KV columns that are padding: {100 * counts['pad_cols'] / max(counts['cols'], 1):.1f}%")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        ours(policy, rows, min(args.max_new_tokens, 16))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))


def main(argv: list[str] | None = None) -> None:
    """Print the decode-speed table (marft vs HF generate, order alternating per repeat)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32])
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=2, help="runs per side, order alternating; medians reported")
    ap.add_argument("--continuous-batching", action="store_true", help="measure the duo rollout with continuous batching on vs off")
    ap.add_argument("--join-fractions", nargs="+", type=float, default=[0.25], help="--continuous-batching: HFEngine.join_fraction of each 'on' side")
    ap.add_argument("--episodes", type=int, default=32, help="--continuous-batching: episodes per rollout (env copies)")
    ap.add_argument("--group-size", type=int, default=8, help="--continuous-batching: GRPO group size")
    ap.add_argument("--profile", action="store_true", help="break one generation at the largest --batches down (forward, sampling, loop, padding, top ops)")
    ap.add_argument("--max-batch", type=int, default=64, help="the policy's max running batch")
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    roles = ["solver", "checker"]
    t0 = time.perf_counter()
    if args.continuous_batching:
        import marft_envs

        roles = list(marft_envs.make("arith-duo-v0").possible_agents)
    policy = TeamPolicy(roles, base=args.model, max_batch=args.max_batch)
    print(f"model {args.model}: policy built in {time.perf_counter() - t0:.1f}s; threads={torch.get_num_threads()}")
    if args.continuous_batching:
        rollout_on_off(policy, args)
        return
    if args.profile:
        profile_decode(policy, roles, args)
        return
    warm = prompts_for(policy, roles, 2)
    ours(policy, warm, 4)
    hf(policy, warm, 4)
    cases = [(f"batch {b}", prompts_for(policy, roles, b)) for b in args.batches]
    cases.append(("groups 4x8", prompts_for(policy, roles, 32, distinct=4)))
    header = f"{'case':<12} {'ours tok/s':>11} {'HF tok/s':>9} {'ratio':>6} {'ours tok':>9} {'HF tok':>7} {'ours s':>7} {'HF s':>6}"
    print(header)
    print("-" * len(header))
    for name, rows in cases:
        runs: dict[str, list[tuple[int, float]]] = {"ours": [], "hf": []}
        for rep in range(args.repeats):
            # alternate which side goes first: on a shared CPU the load drifts between runs
            order = [("ours", ours), ("hf", hf)] if rep % 2 == 0 else [("hf", hf), ("ours", ours)]
            for side, fn in order:
                runs[side].append(fn(policy, rows, args.max_new_tokens))
        (nt_o, dt_o), (nt_h, dt_h) = (
            (sum(n for n, _ in runs[k]), sum(d for _, d in runs[k])) for k in ("ours", "hf")
        )
        r_o = statistics.median(n / d for n, d in runs["ours"])
        r_h = statistics.median(n / d for n, d in runs["hf"])
        print(f"{name:<12} {r_o:>11.1f} {r_h:>9.1f} {r_o / r_h:>6.2f} {nt_o:>9} {nt_h:>7} {dt_o:>7.1f} {dt_h:>6.1f}", flush=True)
    print(
        f"\nsampling T=1, top-p 1, max_new_tokens={args.max_new_tokens}; both duo adapters in every batch; "
        f"tok/s = median over {args.repeats} runs per side (order alternating); tokens/seconds columns are totals; "
        "ratio = ours / HF."
    )


if __name__ == "__main__":
    main()
