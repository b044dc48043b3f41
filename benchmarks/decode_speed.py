"""Rollout decode speed: ``TeamPolicy.generate`` vs HF ``generate`` on the same model.

A duo (two LoRA roles on one base) samples replies to chat prompts at batch 1/8/32
(rows alternate roles, so every batch mixes both adapters), plus a GRPO-style batch of
4 prompts x 8 samples. HF ``generate`` runs on the same peft model with the same
prompts and ``adapter_names`` (one per row), in the same process, interleaved with ours
(alternating order over ``--repeats`` runs), so the ratio is measured side by side. Tokens/s counts generated tokens up to and including
EOS (padding after a finished row is not counted).

Usage::

    python benchmarks/decode_speed.py                         # smollm2-135m, 32 new tokens
    python benchmarks/decode_speed.py --model tiny-random --max-new-tokens 16
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


def main(argv: list[str] | None = None) -> None:
    """Print the decode-speed table (marft vs HF generate, order alternating per repeat)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32])
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=2, help="runs per side, order alternating; medians reported")
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    roles = ["solver", "checker"]
    t0 = time.perf_counter()
    policy = TeamPolicy(roles, base=args.model)
    print(f"model {args.model}: policy built in {time.perf_counter() - t0:.1f}s; threads={torch.get_num_threads()}")
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
