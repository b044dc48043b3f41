"""CPU threads per phase: decode tok/s and one update step, torch threads x ``OMP_WAIT_POLICY``.

    python benchmarks/threads.py                          # SmolLM2-135M, threads 1,2 x passive,active
    python benchmarks/threads.py --busy 1                 # the same beside one busy-looping process
    python benchmarks/threads.py --model tiny-random --new-tokens 4 --rows 2   # smoke

Each configuration runs in a fresh process (``OMP_NUM_THREADS`` and ``OMP_WAIT_POLICY``
are read once at OpenMP start-up), one after the other, ``--repeat`` rounds interleaved so
every configuration sees the same machine load. Decode: ``generate`` of ``--rows``
sampled rows of ``--prompt`` random tokens, ``--new-tokens`` new tokens each (fp32, LoRA
team policy as in training). Update: one forward + backward of the response log-probs
over the same rows (prompt + new tokens). On a shared machine report the ratios between
configurations of one run, never the absolute times.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks` importable as a script

from benchmarks._common import child_row, markdown_table  # noqa: E402

__all__ = ["main"]


def measure(args: argparse.Namespace) -> dict[str, float | str]:
    """Decode and one update in this process under its thread settings."""
    import torch

    from marft_algos.models import TeamPolicy

    torch.set_num_threads(args.threads)
    pol = TeamPolicy(["a"], base=args.model, share_prefixes=False)
    model = pol.model("a")
    g = torch.Generator().manual_seed(0)
    vocab = model.get_output_embeddings().out_features
    ids = torch.randint(0, vocab, (args.rows, args.prompt), generator=g)
    model.eval()
    with torch.no_grad():
        model.generate(ids[:, :8], attention_mask=torch.ones_like(ids[:, :8]), max_new_tokens=2, do_sample=True)  # warm-up
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=True)
        decode_s = time.perf_counter() - t0
    new = out.shape[1] - ids.shape[1]
    prompts = ids.tolist()
    responses = out[:, ids.shape[1] :].tolist()
    t0 = time.perf_counter()
    stats = pol.sequence_logprobs("a", prompts, responses, entropy_grad=False)
    (stats.logprobs.sum() / stats.mask.sum()).backward()
    update_s = time.perf_counter() - t0
    return {"decode_tok_s": round(args.rows * new / decode_s, 1), "update_s": round(update_s, 2), "torch_threads": torch.get_num_threads()}


def main(argv: Sequence[str] | None = None) -> int:
    """Run every configuration in a fresh process and print the side-by-side table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--threads-list", default="1,2")
    p.add_argument("--policies", default="passive,active", help="OMP_WAIT_POLICY values")
    p.add_argument("--repeat", type=int, default=1, help="interleaved rounds")
    p.add_argument("--busy", type=int, default=0, help="busy-looping processes beside the measurement (simulated load)")
    p.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)  # in the child
    args = p.parse_args(argv)
    if args.threads:
        print(json.dumps(measure(args)))
        return 0
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    rows: dict[tuple[int, str], list[dict]] = {}
    try:
        for _ in range(args.repeat):
            for n in (int(x) for x in args.threads_list.split(",")):
                for policy in args.policies.split(","):
                    env = {**os.environ, "OMP_NUM_THREADS": str(n), "OMP_WAIT_POLICY": policy.upper()}
                    rows.setdefault((n, policy), []).append(child_row(__file__, argv, "--threads", str(n), env=env))
                    print(n, policy, rows[(n, policy)][-1], file=sys.stderr, flush=True)  # progress
    finally:
        for s in spinners:
            s.kill()
            s.wait()
    table = []
    for (n, policy), runs in rows.items():
        table.append(
            {
                "threads": n,
                "OMP_WAIT_POLICY": policy,
                "decode_tok_s": round(sum(r["decode_tok_s"] for r in runs) / len(runs), 1),
                "update_s": round(sum(r["update_s"] for r in runs) / len(runs), 2),
            }
        )
    base = table[0]
    for r in table:
        r["decode_vs_first"] = round(r["decode_tok_s"] / max(base["decode_tok_s"], 1e-9), 2)
        r["update_vs_first"] = round(r["update_s"] / max(base["update_s"], 1e-9), 2)
    print(f"{args.model}: decode {args.rows} rows x {args.prompt} prompt + {args.new_tokens} new tokens; update over the same rows; busy={args.busy}\n")
    print(markdown_table(table, ["threads", "OMP_WAIT_POLICY", "decode_tok_s", "decode_vs_first", "update_s", "update_vs_first"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
