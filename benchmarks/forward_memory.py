"""Peak memory of one training forward + backward of the log-probs, per memory mode.

    python benchmarks/forward_memory.py                                   # SmolLM2-135M, 16 rows x (100 + 256) tokens
    python benchmarks/forward_memory.py --model tiny-random --rows 2 --response 8   # smoke

Each mode runs in a fresh process with glibc's malloc thresholds pinned
(:func:`marft_algos.memory.pin_malloc_thresholds`), so the peak RSS follows the live
tensors rather than the heap's high-water mark. Modes: ``plain`` (every layer's
activations kept), ``checkpointing-full-head`` (activation checkpointing, the LM head's
``[tokens, vocab]`` logits kept: the behaviour before the chunked head) and
``checkpointing`` (activation checkpointing with the chunked, recomputed LM head of
:mod:`marft_algos.models.chunked_head`). The loss is the mean response log-prob (no
entropy bonus), as in a PPO step with ``ent_coef=0``. The table reports peak RSS and CPU
seconds of the forward + backward, and their ratios to ``plain``.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks` importable as a script

from benchmarks._common import child_row, markdown_table  # noqa: E402

__all__ = ["main", "MODES"]

MODES = ("plain", "checkpointing-full-head", "checkpointing")


def measure(mode: str, args: argparse.Namespace) -> dict[str, float | str]:
    """One forward + backward in this process; returns peak RSS (MB) and CPU seconds."""
    import torch

    from marft_algos.memory import pin_malloc_thresholds
    from marft_algos.models import TeamPolicy

    pin_malloc_thresholds()
    torch.set_num_threads(args.threads)
    pol = TeamPolicy(["a"], base=args.model, activation_checkpointing=mode != "plain", share_prefixes=False)
    pol.chunked_head = mode == "checkpointing"
    g = torch.Generator().manual_seed(0)
    vocab = pol.model("a").get_output_embeddings().out_features
    prompts = [torch.randint(0, vocab, (args.prompt,), generator=g).tolist() for _ in range(args.rows)]
    responses = [torch.randint(0, vocab, (args.response,), generator=g).tolist() for _ in range(args.rows)]
    loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    c0 = time.process_time()
    stats = pol.sequence_logprobs("a", prompts, responses, entropy_grad=False)
    (stats.logprobs.sum() / stats.mask.sum()).backward()
    cpu = time.process_time() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"mode": mode, "peak_rss_mb": round(peak), "after_load_mb": round(loaded), "cpu_s": round(cpu, 1), "vocab": vocab}


def main(argv: Sequence[str] | None = None) -> int:
    """Run every mode in a fresh process (or one ``--mode`` here) and print the table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--prompt", type=int, default=100, help="prompt tokens per row")
    p.add_argument("--response", type=int, default=256, help="response tokens per row")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--mode", default="", help=argparse.SUPPRESS)  # one mode, in the child process
    args = p.parse_args(argv)
    if args.mode:
        print(json.dumps(measure(args.mode, args)))
        return 0
    rows = [child_row(__file__, argv, "--mode", mode) for mode in args.modes.split(",")]
    base = next((r for r in rows if r["mode"] == "plain"), rows[0])
    for r in rows:
        r["rss_vs_plain"] = round(r["peak_rss_mb"] / base["peak_rss_mb"], 2)
        r["cpu_vs_plain"] = round(r["cpu_s"] / max(base["cpu_s"], 1e-9), 2)
    print(f"{args.model}: {args.rows} rows x ({args.prompt} prompt + {args.response} response) tokens, {args.threads} thread(s)\n")
    print(markdown_table(rows, ["mode", "peak_rss_mb", "rss_vs_plain", "cpu_s", "cpu_vs_plain", "after_load_mb", "vocab"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
