"""Memory of n roles on one base: 1/2/4/8 roles, RSS and parameter bytes.

Each configuration runs in a fresh subprocess (RSS is per process), builds a
``TeamPolicy`` with n LoRA roles, runs one tiny generate + a forward/backward so the
numbers include the runtime, and reports:

- param MB: bytes of unique parameter storages (base + all adapters),
- adapters MB: the adapters' share,
- RSS MB after one generate + backward, its growth over the imports, and peak RSS,
- naive MB: what n full copies of the base would cost (the reference implementation).

Usage::

    python benchmarks/memory_roles.py                 # smollm2-135m and tiny-random
    python benchmarks/memory_roles.py --models tiny-random --roles 1 2 4 8
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys


def _rss_mb(field: str = "VmRSS:") -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field):
                return int(line.split()[1]) / 1024
    return float("nan")


def child(model: str, n: int) -> dict[str, float]:
    """In a fresh process: build n roles on one base, generate and backprop once; memory figures."""
    import torch

    from marft_algos.models import GenRequest, SamplingParams, TeamPolicy

    rss0 = _rss_mb()  # interpreter + torch/transformers imports
    roles = [f"agent{i}" for i in range(n)]
    policy = TeamPolicy(roles, base=model)
    rss_built = _rss_mb()
    pb = policy.parameter_bytes()
    prompt = policy.encode(roles[0], [{"role": "user", "content": "What is 3+4?"}])
    policy.generate([GenRequest(r, prompt, SamplingParams(max_new_tokens=4)) for r in roles])
    policy.set_train_role(roles[-1])
    st = policy.sequence_logprobs(roles[-1], [prompt], [[1, 2, 3]])
    st.logprobs.sum().backward()
    rss_used = _rss_mb()
    del torch
    return {
        "model": model,
        "roles": n,
        "param_mb": pb["total"] / 2**20,
        "adapter_mb": pb["adapters"] / 2**20,
        "base_mb": pb["base"] / 2**20,
        "rss_imports_mb": rss0,
        "rss_built_mb": rss_built,
        "rss_used_mb": rss_used,
        "peak_rss_mb": _rss_mb("VmHWM:"),  # not ru_maxrss: Linux carries it over execve from the parent
    }


def main(argv: list[str] | None = None) -> None:
    """Run :func:`child` per (model, roles) in a subprocess and print the memory table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["tiny-random", "smollm2-135m"])
    ap.add_argument("--roles", nargs="+", type=int, default=[1, 2, 4, 8])
    ap.add_argument("--child", nargs=2, metavar=("MODEL", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]))))
        return
    rows = []
    for model in args.models:
        for n in args.roles:
            out = subprocess.run(
                [sys.executable, __file__, "--child", model, str(n)], capture_output=True, text=True, check=True
            ).stdout.strip().splitlines()[-1]
            rows.append(json.loads(out))
    header = f"{'model':<14} {'roles':>5} {'param MB':>9} {'adapters MB':>11} {'naive MB':>9} {'RSS used':>9} {'RSS +model':>10} {'peak RSS':>9}"
    print(header)
    print("-" * len(header))
    for r in rows:
        naive = r["base_mb"] * r["roles"] + r["adapter_mb"]
        print(
            f"{r['model']:<14} {r['roles']:>5} {r['param_mb']:>9.1f} {r['adapter_mb']:>11.2f} {naive:>9.1f} "
            f"{r['rss_used_mb']:>9.0f} {r['rss_used_mb'] - r['rss_imports_mb']:>10.0f} {r['peak_rss_mb']:>9.0f}"
        )
    print("\nparam MB = unique parameter storages (one base + n adapters); naive = n full copies of the base;")
    print("RSS used = RSS after one generate + one forward/backward (weights are mmap-loaded: pages count once")
    print("touched); RSS +model = RSS used minus RSS after imports; MB = 2**20 bytes.")


if __name__ == "__main__":
    main()
