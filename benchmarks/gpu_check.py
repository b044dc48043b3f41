"""One command that checks and times every GPU path of marft (issue 31).

    python benchmarks/gpu_check.py --out runs/gpu-check                       # smollm2-135m, every check
    python benchmarks/gpu_check.py --model Qwen/Qwen2.5-0.5B-Instruct --checks train,engines
    python benchmarks/gpu_check.py --cpu-dry-run --out /tmp/gc                # no GPU: the logic on tiny-random

Checks (``--checks``, default all), each in its own child process with a time limit
(``--timeout``), so that one that fails, runs out of memory or hangs costs its own row
only:

- ``train``: ``--steps`` GRPO steps and as many action-level MARFT steps on ``arith-duo-v0``
  in bf16 (``dtype="bf16"`` on ``cuda``), LoRA; a non-finite loss fails the check.
- ``engines``: the ``vllm`` engine (one LoRA adapter per role, the roles mixed in every
  batch) against the ``hf`` engine on the same prompts and seeds: greedy agreement
  (the share of rows whose first tokens match) and vLLM's log-prob gap to the trainer,
  then sampled tokens/s of each.
- ``fsdp``: ``torchrun --nproc_per_node <visible GPUs> -m marft_algos.cli train`` with
  ``distributed.strategy=fsdp`` (full fine-tuning, FSDP2) for ``--steps`` steps; ``--num-envs``
  is rounded up to whole GRPO groups on every rank. Skipped with one GPU (marft does not
  shard at world size 1).
- ``async``: asynchronous rollout workers (``rollout_workers=1``, ``max_staleness=1``) on
  the second GPU (``rollout_device="cuda:1"``); skipped with a "not available" row when
  the installed marft has no ``rollout_workers`` setting, or with one GPU.
- ``trl``: the peer, TRL's ``GRPOTrainer`` with ``use_vllm=True`` (``vllm_mode="colocate"``)
  on the same model, LoRA, group size, completions per step (``--num-envs``, in whole
  groups) and completion length; where vllm is not installed,
  TRL generates with transformers (``use_vllm=False``), the peer of marft's ``hf`` engine.

The table has, per path: status (``ok`` / ``skip`` / ``fail``, with the reason), tokens/s
(generated tokens over the wall time of the timed steps or generations; the first
``--warmup`` training steps warm up and are not timed), samples/s (episodes or completions per second),
and the peak GPU memory in GiB: the highest device-wide use (all visible GPUs, every
process, vLLM's included) sampled during the check, read through NVML (``nvidia-ml-py``,
a vLLM dependency) or else ``torch.cuda.mem_get_info``. ``gpu_check.md`` and
``gpu_check.json`` (rows, arguments, devices, versions) go to ``--out``. The exit status
is 1 when a check failed.

``--cpu-dry-run`` runs what can run without CUDA on ``tiny-random`` through the same child
processes and table: fp32 training steps, the ``hf`` engine, FSDP2 on 2 gloo CPU ranks, TRL's
GRPOTrainer without vLLM and (where the setting exists) a rollout worker on the CPU; the
vllm engine row is a skip that says so. Offline use (wheels carried to the GPU machine): docs/engines.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks` importable as a script

__all__ = ["CHECKS", "COLUMNS", "build_parser", "skip_reason", "row", "markdown", "run_checks", "main"]

COLUMNS = ("path", "status", "tokens_s", "samples_s", "peak_gpu_gib", "reason")
CHECKS = ("train", "engines", "fsdp", "async", "trl")
#: checks that run under --cpu-dry-run (the others need CUDA)
DRY_RUN_CHECKS = ("train", "engines", "fsdp", "async", "trl")
_GIB = 1024**3


# ------------------------------------------------------------------------------- the table
def row(path: str, status: str, reason: str = "", tokens_s: float | None = None, samples_s: float | None = None,
        peak_gpu_gib: float | None = None, **detail: Any) -> dict[str, Any]:
    """One table row; ``detail`` keys go to the JSON only."""
    if status not in ("ok", "skip", "fail"):
        raise ValueError(f"status must be ok, skip or fail, got {status!r}")
    return {"path": path, "status": status, "reason": reason, "tokens_s": tokens_s, "samples_s": samples_s,
            "peak_gpu_gib": peak_gpu_gib, **detail}


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if math.isfinite(v) else str(v)
    return str(v).replace("|", "/").replace("\n", " ")


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a Markdown table (``-`` where a figure was not measured)."""
    head = "| path | status | tokens/s | samples/s | peak GPU memory GiB | reason / detail |"
    lines = [head, "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append("| " + " | ".join(_cell(r.get(c)) for c in COLUMNS) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------------- what can run
def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _has_async_workers() -> bool:
    from marft_algos.config import TrainConfig

    return "rollout_workers" in {f.name for f in dataclasses.fields(TrainConfig)}


def skip_reason(check: str, *, cuda_devices: int, dry_run: bool, has: Callable[[str], bool] = _has,
                async_workers: Callable[[], bool] = _has_async_workers) -> str | None:
    """Why ``check`` cannot run here (None: it can). Decided before any child process starts."""
    if check not in CHECKS:
        raise ValueError(f"unknown check {check!r}; choose from {', '.join(CHECKS)}")
    if check == "async" and not async_workers():
        return "not available: this marft has no rollout_workers setting (asynchronous rollout workers, issue 31)"
    if check == "trl" and not has("trl"):
        return "trl is not installed: pip install 'marft[bench]' (offline: docs/engines.md)"
    if dry_run:
        return None if check in DRY_RUN_CHECKS else "--cpu-dry-run: this check needs CUDA"
    if cuda_devices == 0:
        return "no CUDA device (torch.cuda.is_available() is False); --cpu-dry-run runs the CPU part"
    if check == "async" and cuda_devices < 2:
        return f"needs a second GPU for the rollout workers ({cuda_devices} visible)"
    if check == "fsdp" and cuda_devices < 2:
        return "needs 2 or more GPUs to shard over (1 visible; at world size 1 marft trains unsharded)"
    return None


# --------------------------------------------------------------------------- GPU memory
def _nvml_handles() -> tuple[Any, list[Any]]:
    """``(pynvml, handles)`` of the GPUs this process may see (``CUDA_VISIBLE_DEVICES``), through
    NVML (nvidia-ml-py), which creates no CUDA context; raises where NVML is missing."""
    import pynvml  # deferred: optional (nvidia-ml-py), only on a GPU machine

    pynvml.nvmlInit()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    count = pynvml.nvmlDeviceGetCount()
    idx = [int(i) for i in visible.split(",") if i.strip().isdigit()] if visible else list(range(count))
    return pynvml, [pynvml.nvmlDeviceGetHandleByIndex(i) for i in idx if i < count]


class GpuMemory:
    """Peak device-wide GPU memory in use (all visible GPUs, every process), sampled by a thread.

    :meth:`mark` returns the peak since the previous mark (or the start) in GiB and starts
    a new window; None without CUDA.
    """

    def __init__(self, interval_s: float = 0.2) -> None:
        self.interval_s = interval_s
        self.read = self._reader()
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def _reader() -> Callable[[], float] | None:
        try:
            pynvml, handles = _nvml_handles()  # no CUDA context, sees vLLM's processes too
            return lambda: sum(pynvml.nvmlDeviceGetMemoryInfo(h).used for h in handles) / _GIB
        except Exception:  # noqa: BLE001 - no NVML: fall back to torch
            pass
        import torch

        if not torch.cuda.is_available():
            return None
        n = torch.cuda.device_count()

        def used() -> float:
            total = 0
            for i in range(n):
                free, size = torch.cuda.mem_get_info(i)
                total += size - free
            return total / _GIB

        return used

    def __enter__(self) -> GpuMemory:
        if self.read is not None:
            self.peak = self.read()
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.peak = max(self.peak, self.read())
            except Exception:  # noqa: BLE001 - a failed read must not end the check
                pass

    def mark(self) -> float | None:
        """Peak GiB since the last mark; the next window starts at the current use."""
        if self.read is None:
            return None
        peak = max(self.peak, self.read())
        self.peak = self.read()
        return round(peak, 2)

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)


# ---------------------------------------------------------------------------- the checks
def _device(args: argparse.Namespace) -> tuple[str, str]:
    """(device, dtype) of the run: cuda + bf16, or cpu + fp32 under --cpu-dry-run."""
    return ("cpu", "fp32") if args.cpu_dry_run else ("cuda", "bf16")


def _train_config(algo: str, args: argparse.Namespace, **extra: Any) -> Any:
    from marft_algos.registry import get_algorithm

    spec = get_algorithm(algo)
    device, dtype = _device(args)
    fields = {f.name for f in dataclasses.fields(spec.config_cls)}
    kwargs: dict[str, Any] = dict(
        env_id="arith-duo-v0", model=args.model, device=device, dtype=dtype, num_envs=args.num_envs, steps=args.steps,
        lr=1e-5, seed=0, progress=False, tensorboard=False, plot=False, transcript_every=0,
        out_dir=tempfile.mkdtemp(prefix=f"marft-gpu-check-{algo}-"),
        sampling_overrides={a: {"max_new_tokens": args.max_new_tokens, "temperature": 1.0} for a in ("reasoner", "actor")},
        group_size=args.group_size, **extra,
    )
    missing = sorted(k for k in extra if k not in fields)
    if missing:
        raise RuntimeError(f"{algo}'s config has no {', '.join(missing)}")
    return spec.trainer_cls(spec.config_cls(**{k: v for k, v in kwargs.items() if k in fields}))


def _timed(items: list[Any], warmup: int) -> list[Any]:
    """The items after the first ``warmup`` (the last one when there are no more)."""
    return items[warmup:] or items[-1:]


def _time_steps(trainer: Any, steps: int, warmup: int) -> dict[str, float]:
    """Run ``steps`` training steps; tokens/s, samples/s and the phases' seconds over the
    steps after the first ``warmup`` (a process's first steps load CUDA kernels)."""
    done = []
    for i in range(steps):
        m = trainer.train_step()
        bad = sorted(k for k, v in m.items() if "loss" in k and isinstance(v, float) and not math.isfinite(v))
        if bad:
            raise RuntimeError(f"step {i}: non-finite {', '.join(bad[:3])}")
        done.append(m)
    timed = _timed(done, warmup)
    secs = sum(m["perf/step_s"] for m in timed)
    tokens = sum(m.get("rollout/tokens", 0.0) for m in timed)
    episodes = sum(m.get("rollout/episodes", float(trainer.config.num_envs)) for m in timed)
    phases = {k.removeprefix("perf/"): sum(m.get(k, 0.0) for m in timed) / len(timed) for k in ("perf/generate_s", "perf/update_s")}
    return {"tokens_s": tokens / secs, "samples_s": episodes / secs, "step_s": secs / len(timed), "timed_steps": len(timed),
            **phases}


def check_train(args: argparse.Namespace, mem: GpuMemory) -> list[dict[str, Any]]:
    """bf16 (fp32 in the dry run) GRPO and action-level MARFT steps on arith-duo-v0."""
    _, dtype = _device(args)
    rows = []
    for algo in ("grpo", "marft-action"):
        name = f"train {algo} {dtype}"
        try:
            mem.mark()
            res = _time_steps(_train_config(algo, args), args.steps, args.warmup)
            rows.append(row(name, "ok", f"{res['timed_steps']} timed steps, {res['step_s']:.2f} s/step "
                            f"(generate {res['generate_s']:.2f}, update {res['update_s']:.2f})",
                            res.pop("tokens_s"), res.pop("samples_s"), mem.mark(), **res))
        except Exception as e:  # noqa: BLE001 - one algorithm failing leaves the other's row
            rows.append(row(name, "fail", _why(e), peak_gpu_gib=mem.mark()))
        _free()
    return rows


def _greedy_agreement(a: Sequence[Any], b: Sequence[Any], prefix: int = 8) -> float:
    """Share of rows whose first ``prefix`` tokens are equal (bf16 kernels may part later)."""
    same = sum(list(x.token_ids[:prefix]) == list(y.token_ids[:prefix]) for x, y in zip(a, b, strict=True))
    return same / max(len(a), 1)


def _vllm_verdict(agree: float, agree_swapped: float, control: float) -> tuple[str, str]:
    """ok / fail of the vllm engine from greedy agreements (first 8 tokens of each row).

    ``agree``: vLLM vs hf with the right adapters; ``agree_swapped``: vLLM vs hf with the roles'
    adapters swapped; ``control``: hf vs hf swapped (how far apart the roles' adapters are)."""
    said = f"greedy agreement with hf {agree:.0%}, with hf on the swapped adapters {agree_swapped:.0%}"
    if agree < 0.5:
        return "fail", f"{said}: vLLM does not reproduce the hf engine"
    if control < 1.0 and agree <= agree_swapped:
        return "fail", f"{said}: vLLM does not serve each role its own adapter"
    if control == 1.0:
        return "ok", f"{said} (the two adapters give the same greedy text: roles not told apart; raise --adapter-scale)"
    return "ok", said


def check_engines(args: argparse.Namespace, mem: GpuMemory) -> list[dict[str, Any]]:
    """The vllm engine against the hf engine on the same mixed-role prompts (hf only in the dry run)."""
    import torch

    from benchmarks.engines import ROLES, make_requests, timed
    from marft_algos.models import SamplingParams, TeamPolicy

    device, dtype = _device(args)
    torch.manual_seed(0)
    policy = TeamPolicy(ROLES, args.model, seed=0, device=device, dtype=dtype, max_context=args.max_model_len)
    with torch.no_grad():  # distinct random adapters: a role served with the wrong adapter shows
        for k, role in enumerate(ROLES):
            g = torch.Generator().manual_seed(k + 1)
            for p in policy.trainable_parameters(role):
                p.copy_((torch.randn(p.shape, generator=g) * args.adapter_scale).to(p.device, p.dtype))
    reqs = make_requests(policy, args.batch, args.max_new_tokens)
    greedy = [dataclasses.replace(r, sampling=SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens)) for r in reqs]
    other = {ROLES[0]: ROLES[1], ROLES[1]: ROLES[0]}
    engines: dict[str, Any] = {"hf": policy.engine}
    rows = []
    mem.mark()
    outputs = {"hf": policy.engine.generate(greedy, seed=0),
               # the control: every prompt answered by the other role's adapter
               "hf swapped": policy.engine.generate([dataclasses.replace(r, role=other[r.role]) for r in greedy], seed=0)}
    control = _greedy_agreement(outputs["hf"], outputs["hf swapped"])
    if args.cpu_dry_run:
        reason = "--cpu-dry-run: the vllm engine needs CUDA"
    elif not _has("vllm"):
        reason = "vllm is not installed: pip install 'marft[vllm]' (offline: docs/engines.md)"
    else:
        reason = ""
    for name in ("hf", "vllm"):
        if name == "vllm":
            if reason:
                rows.append(row("engine vllm (per-role LoRA)", "skip", reason))
                break
            try:
                from marft_algos.engines.vllm import VLLMEngine

                t0 = time.perf_counter()
                engines["vllm"] = VLLMEngine(policy, gpu_memory_utilization=args.gpu_memory_utilization,
                                             max_model_len=args.max_model_len)
                start_s = time.perf_counter() - t0
                outputs["vllm"] = engines["vllm"].generate(greedy, seed=0)
                gaps = {k: v for k, v in engines["vllm"].metrics().items() if "logprob_gap_max" in k}
            except Exception as e:  # noqa: BLE001
                rows.append(row("engine vllm (per-role LoRA)", "fail", _why(e), peak_gpu_gib=mem.mark()))
                break
        eng = engines[name]
        timed(eng, reqs, seed=0)  # warm-up
        runs = [timed(eng, reqs, seed=s) for s in (1, 2)]
        secs, tokens = sum(s for s, _ in runs), sum(n for _, n in runs)
        detail: dict[str, Any] = {"batch": len(reqs), "tokens": tokens, "seconds": secs, "roles_swapped_agreement": control}
        if name == "hf":
            r = row("engine hf", "ok", f"batch {len(reqs)}, roles mixed; swapping the roles' adapters keeps {control:.0%} "
                    "of greedy rows (first 8 tokens)", tokens / secs, 2 * len(reqs) / secs, mem.mark(), **detail)
        else:
            agree = _greedy_agreement(outputs["hf"], outputs["vllm"])
            agree_swapped = _greedy_agreement(outputs["hf swapped"], outputs["vllm"])
            gap = max(gaps.values(), default=float("nan"))
            detail.update(startup_s=start_s, greedy_agreement=agree, greedy_agreement_swapped=agree_swapped, logprob_gap_max=gap)
            status, why = _vllm_verdict(agree, agree_swapped, control)
            why += f"; max log-prob gap to the trainer {gap:.3g}; engine start {start_s:.0f} s"
            r = row("engine vllm (per-role LoRA)", status, why, tokens / secs, 2 * len(reqs) / secs, mem.mark(), **detail)
        rows.append(r)
    return rows


def check_fsdp(args: argparse.Namespace, mem: GpuMemory) -> list[dict[str, Any]]:
    """FSDP2 full fine-tuning over every visible GPU (2 gloo CPU ranks in the dry run), launched by torchrun."""
    import torch

    device, dtype = _device(args)
    world = 2 if args.cpu_dry_run else torch.cuda.device_count()
    unit = args.group_size * world  # whole GRPO groups on every rank
    num_envs = -(-args.num_envs // unit) * unit
    out = Path(tempfile.mkdtemp(prefix="marft-gpu-check-fsdp-"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(world),
           "-m", "marft_algos.cli", "train", "--algo", "grpo", "--env", "arith-duo-v0", "--model", args.model,
           "--steps", str(args.steps), "--out", str(out)]
    sampling = {a: {"max_new_tokens": args.max_new_tokens} for a in ("reasoner", "actor")}
    for kv in ("mode=full", "distributed.strategy=fsdp", f"device={device}", f"dtype={dtype}", f"num_envs={num_envs}",
               f"group_size={args.group_size}", "progress=false", "plot=false", "tensorboard=false", "transcript_every=0",
               f"sampling_overrides={json.dumps(sampling)}"):
        cmd += ["--set", kv]
    name = f"fsdp2 grpo full {dtype} ({world} {'CPU ranks' if args.cpu_dry_run else 'GPUs'})"
    mem.mark()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                              env={**os.environ, "PYTHONPATH": _pythonpath()})
    except subprocess.TimeoutExpired:
        return [row(name, "fail", f"torchrun timed out after {args.timeout:.0f} s", peak_gpu_gib=mem.mark())]
    peak = mem.mark()
    if proc.returncode != 0:
        return [row(name, "fail", f"torchrun exit {proc.returncode}: {_last_line(proc.stderr + proc.stdout)}", peak_gpu_gib=peak)]
    steps = [m for m in _jsonl(out / "metrics.jsonl") if "perf/step_s" in m]
    timed = _timed(steps, args.warmup)
    if not timed:
        return [row(name, "fail", f"no step metrics in {out / 'metrics.jsonl'}", peak_gpu_gib=peak)]
    secs = sum(m["perf/step_s"] for m in timed)
    tokens = sum(m.get("rollout/tokens", 0.0) for m in timed)  # every rank's (the logged metrics are global)
    episodes = sum(m.get("rollout/episodes", float(num_envs)) for m in timed)
    return [row(name, "ok", f"{len(timed)} timed steps, {num_envs} episodes per step over {world} ranks",
                tokens / secs, episodes / secs, peak, world_size=world, num_envs=num_envs, step_s=secs / len(timed))]


def check_async(args: argparse.Namespace, mem: GpuMemory) -> list[dict[str, Any]]:
    """GRPO with one asynchronous rollout worker on the second GPU (on the CPU in the dry run), staleness 1."""
    mem.mark()
    where = "cpu" if args.cpu_dry_run else "cuda:1"
    trainer = _train_config("grpo", args, rollout_workers=1, max_staleness=1, rollout_device=where)
    try:
        res = _time_steps(trainer, args.steps, args.warmup)
    finally:
        close = getattr(trainer, "close", None)
        if callable(close):
            close()
    return [row(f"async rollout workers (1 worker on {where}, staleness 1)", "ok", f"{res['timed_steps']} timed steps",
                res.pop("tokens_s"), res.pop("samples_s"), mem.mark(), **res)]


def check_trl(args: argparse.Namespace, mem: GpuMemory) -> list[dict[str, Any]]:
    """TRL's GRPOTrainer on the same model, the peer: with use_vllm (colocate) where vllm is installed."""
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer as TRLTrainer

    from benchmarks.throughput import _arith_dataset
    from marft_algos.models import load_base
    from marft_algos.models.aliases import resolve_alias
    from marft_algos.models.loading import ensure_cached

    G, T = args.group_size, 2 * args.max_new_tokens  # the duo's token budget per sample, in one completion
    B = args.num_envs  # completions per step: marft's episodes per step (parse_args: whole groups)
    dataset, task = _arith_dataset(B // G * (args.steps + 1))

    def reward(completions: list[Any], pidx: list[int], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else str(c) for c in completions]
        return [float(task.grade(t, task.get(int(i))).correct) for t, i in zip(texts, pidx, strict=True)]

    # TRL loads the model itself, and its colocated vLLM the same folder (an alias's converted one);
    # the in-code tiny model (dry run) goes in as an object
    alias = resolve_alias(args.model)
    tiny = alias is not None and alias.kind == "tiny"
    path = str(ensure_cached(alias)) if alias is not None and not tiny else args.model
    model, tok = load_base(args.model) if tiny else (path, None)
    gpu = not args.cpu_dry_run
    use_vllm = gpu and _has("vllm")
    vllm = dict(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=args.gpu_memory_utilization,
                vllm_max_model_length=args.max_model_len) if use_vllm else {}
    cfg = TRLConfig(output_dir=tempfile.mkdtemp(prefix="marft-gpu-check-trl-"), per_device_train_batch_size=B,
                    num_generations=G, max_completion_length=T, learning_rate=1e-5, max_steps=args.steps, logging_steps=1,
                    report_to="none", save_strategy="no", bf16=gpu, use_cpu=not gpu, gradient_checkpointing=False, beta=0.0,
                    temperature=1.0, seed=0, disable_tqdm=True, dataloader_num_workers=0, **vllm)
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                      bias="none", task_type="CAUSAL_LM")
    step_s: list[float] = []
    lengths: list[float] = []

    class Clock(TrainerCallback):
        """Step times, and TRL's logged mean completion length of each step (logging_steps=1)."""

        t0 = 0.0

        def on_step_begin(self, *a: Any, **k: Any) -> None:
            """Start the step's clock."""
            self.t0 = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            """Record the step time."""
            step_s.append(time.perf_counter() - self.t0)

        def on_log(self, _args: Any, _state: Any, _control: Any, logs: dict[str, float] | None = None, **k: Any) -> None:
            """Record the step's mean completion length."""
            if logs and "completions/mean_length" in logs:
                lengths.append(float(logs["completions/mean_length"]))

    mem.mark()
    trl = TRLTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=dataset, processing_class=tok, peft_config=lora,
                     callbacks=[Clock()])
    trl.train()
    first = len(step_s) - len(_timed(step_s, args.warmup))  # warm-up steps, by the training checks' rule
    secs = sum(step_s[first:])
    tokens = B * sum(lengths[first:]) if len(lengths) == len(step_s) else float("nan")
    n = len(step_s) - first
    if use_vllm:
        name = "TRL GRPOTrainer use_vllm (colocate)"
    elif gpu:
        name = "TRL GRPOTrainer (transformers generate, no vllm)"
    else:
        name = "TRL GRPOTrainer (dry run: CPU, no vllm)"
    return [row(name, "ok", f"{n} timed steps, {B} completions per step (G={G}), <= {T} tokens per completion",
                tokens / secs, B * n / secs, mem.mark(), step_s=secs / max(n, 1), model_path=path)]


RUNNERS: dict[str, Callable[[argparse.Namespace, GpuMemory], list[dict[str, Any]]]] = {
    "train": check_train, "engines": check_engines, "fsdp": check_fsdp, "async": check_async, "trl": check_trl}
#: the rows a check gives when it fails as a whole (no row of its own)
PATHS = {"train": "train", "engines": "engines", "fsdp": "fsdp2", "async": "async rollout workers",
         "trl": "TRL GRPOTrainer"}


# --------------------------------------------------------------------------- the runner
def _why(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def _last_line(text: str) -> str:
    """The line that says what went wrong: the last CLI ``error:`` message (marft's own, which
    says what to do), else the last exception line, else the last line."""
    lines = [x.strip() for x in (text or "").strip().splitlines() if x.strip()]
    cli = [x for x in lines if re.search(r"\berror: ", x)]
    exc = [x for x in lines if re.match(r"[\w.]+(Error|Exception)\b", x)]
    return (cli or exc or lines or ["(no output)"])[-1][:300]


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _pythonpath() -> str:
    repo = str(Path(__file__).resolve().parents[1])
    return os.pathsep.join([repo, *([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])])


def _free() -> None:
    import gc

    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001
        pass


def run_one(check: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Run ``check`` in this process; an exception becomes its fail row."""
    with GpuMemory() as mem:
        try:
            return RUNNERS[check](args, mem)
        except Exception as e:  # noqa: BLE001 - the check's failure is its row
            return [row(PATHS[check], "fail", _why(e), peak_gpu_gib=mem.mark())]


def _child(check: str, args: argparse.Namespace, argv: Sequence[str]) -> list[dict[str, Any]]:
    """Run ``check`` in a child process (isolation: a crash, an OOM or a hang is that check's row)."""
    with tempfile.TemporaryDirectory(prefix="marft-gpu-check-") as tmp:
        result = Path(tmp) / "rows.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--child", check, "--child-out", str(result)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                                  env={**os.environ, "PYTHONPATH": _pythonpath()})
        except subprocess.TimeoutExpired:
            return [row(PATHS[check], "fail", f"timed out after {args.timeout:.0f} s (--timeout)")]
        if result.exists():
            return json.loads(result.read_text())
        return [row(PATHS[check], "fail", f"child process exit {proc.returncode}: {_last_line(proc.stderr)}")]


def run_checks(args: argparse.Namespace, argv: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Every selected check: a skip row where it cannot run, else its rows (isolated unless --in-process)."""
    import torch

    cuda = 0 if args.cpu_dry_run or not torch.cuda.is_available() else torch.cuda.device_count()
    rows: list[dict[str, Any]] = []
    for check in args.checks:
        why = skip_reason(check, cuda_devices=cuda, dry_run=args.cpu_dry_run)
        if why:
            got = [row(PATHS[check], "skip", why)]
        else:
            t0 = time.perf_counter()
            got = run_one(check, args) if args.in_process else _child(check, args, argv)
            for r in got:
                r.setdefault("check_s", round(time.perf_counter() - t0, 1))
        rows += got
        print("\n".join(markdown(got).splitlines()[2:]), flush=True)  # as each check ends: a killed run keeps its rows
    return rows


def _checks(text: str) -> list[str]:
    names = [c.strip() for c in text.split(",") if c.strip()]
    bad = [c for c in names if c not in CHECKS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown check(s) {', '.join(bad) or '(none given)'}; choose from {', '.join(CHECKS)}")
    return names


def build_parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="alias, Hub id or local folder (default smollm2-135m; tiny-random with --cpu-dry-run)")
    p.add_argument("--checks", type=_checks, default=list(CHECKS), help=f"comma-separated, from {','.join(CHECKS)} (default all)")
    p.add_argument("--steps", type=int, default=5, help="training steps per training check, --warmup of them untimed")
    p.add_argument("--warmup", type=int, default=2,
                   help="untimed first steps of each training check (an H200 took ~3 steps to warm up); the last step is timed regardless")
    p.add_argument("--num-envs", type=int, default=8, help="episodes per training step")
    p.add_argument("--group-size", type=int, default=4, help="GRPO group size (marft and TRL)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="per agent action (engines: per request)")
    p.add_argument("--batch", type=int, default=32, help="requests per engine generate (roles alternate)")
    p.add_argument("--adapter-scale", type=float, default=0.05,
                   help="std of the engines check's random LoRA weights (large enough that the two roles answer differently)")
    p.add_argument("--max-model-len", type=int, default=1024, help="vLLM's context (prompt + response)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.3, help="vLLM's share of GPU memory (marft's engine and TRL's)")
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds a check may take before it is a fail row")
    p.add_argument("--cpu-dry-run", action="store_true", help="no CUDA: train and the hf engine on CPU in fp32, the rest skipped")
    p.add_argument("--in-process", action="store_true", help="run the checks in this process (debugging; no isolation)")
    p.add_argument("--out", default="runs/gpu-check", help="folder for gpu_check.md and gpu_check.json")
    p.add_argument("--child", choices=CHECKS, help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    return p


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parsed, checked arguments (the model default depends on --cpu-dry-run)."""
    p = build_parser()
    args = p.parse_args(argv)
    if args.model is None:
        args.model = "tiny-random" if args.cpu_dry_run else "smollm2-135m"
    for name in ("steps", "num_envs", "group_size", "max_new_tokens", "batch"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        p.error(f"--warmup must be >= 0, got {args.warmup}")
    if args.num_envs % args.group_size:
        p.error(f"--num-envs ({args.num_envs}) must be a multiple of --group-size ({args.group_size})")
    if not 0 < args.gpu_memory_utilization < 1:
        p.error(f"--gpu-memory-utilization must be in (0, 1), got {args.gpu_memory_utilization}")
    return args


def _devices() -> tuple[list[str], float | None]:
    """GPU names and the device-wide memory in use before any check (GiB; None without NVML).

    Read through NVML where it is installed, so that this parent process never creates a CUDA
    context of its own (it would hold memory on GPU 0 through every check)."""
    try:
        pynvml, handles = _nvml_handles()
        names = [pynvml.nvmlDeviceGetName(h) for h in handles]
        used = sum(pynvml.nvmlDeviceGetMemoryInfo(h).used for h in handles) / _GIB
        return [n.decode() if isinstance(n, bytes) else str(n) for n in names], round(used, 2)
    except Exception:  # noqa: BLE001 - no NVML (or no GPU): torch's names, no baseline
        import torch

        if not torch.cuda.is_available():
            return [], None
        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())], None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the checks, print the table, write ``--out``; exit status 1 when a check failed."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.child:
        Path(args.child_out).write_text(json.dumps(run_one(args.child, args), default=str))
        return 0
    from benchmarks._common import versions

    devices, baseline = _devices()
    print(f"gpu_check: model {args.model}, devices {devices or 'none (CPU)'}{', CPU dry run' if args.cpu_dry_run else ''}", flush=True)
    print(markdown([]), flush=True)
    rows = run_checks(args, argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    before = "" if baseline is None else f"; GPU memory in use before the checks: {baseline} GiB"
    (out / "gpu_check.md").write_text(f"Model {args.model}; devices: {', '.join(devices) or 'none (CPU)'}{before}.\n\n{markdown(rows)}\n")
    (out / "gpu_check.json").write_text(json.dumps({"args": vars(args), "devices": devices, "baseline_gpu_gib": baseline, "rows": rows,
                                                    "versions": versions()}, indent=1, default=str))
    return 1 if any(r["status"] == "fail" for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
