"""The ``marft`` command line.

    marft train --env arith-duo-v0 --algo grpo --model smollm2-135m --steps 50 --out runs/duo-grpo
    marft train ... --resume                      # continue the run in --out from its latest checkpoint
    marft train ... --config cfg.json --set group_size=8 --set sampling_overrides.actor.temperature=0.7
    marft eval  --env gsm8k-duo-v0 --checkpoint runs/duo-grpo --split test --n 200
    marft sft   --env arith-calc-duo-v0 --demos scripted --out runs/calc-sft      # docs/sft.md
    marft train --env arith-calc-duo-v0 --init runs/calc-sft --out runs/calc-sft-rl
    marft list-envs | list-algos
    marft leaderboard --suite arith --limit 200 --checkpoint duo-grpo=runs/duo-grpo --out runs/leaderboard
    marft quickstart [--out runs/quickstart] [--minutes 6]
    marft serve --model smollm2-135m --roles planner,solver [--checkpoint RUN] [--host] [--port] [--api-key]
    marft train --program MODULE:FUNCTION --roles planner,solver --problems arith ...   # docs/programs.md

Every field of the chosen algorithm's config is also a flag (``--group-size 8``);
``marft train --algo grpo --help`` lists them. Precedence: defaults < --config < flags < --set.
Bad input (unknown env id, algorithm or setting) ends with a one-line error and exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import os
import sys
import time
import typing
from pathlib import Path

# spinning OpenMP threads make decode on a busy CPU collapse (benchmarks/threads.py): wait
# passively unless the user chose otherwise (set before torch is imported)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
from typing import Any

import marft_envs
from marft_algos.rundir import RunDirLock, check_new_run_dir
from marft_algos.sft import SFTConfig, run_sft

__all__ = ["main", "build_parser", "build_config"]

# Flags with a short name mapped onto config fields.
_ALIASES = {"env": "env_id", "out": "out_dir", "model": "model", "steps": "steps", "seed": "seed", "init": "init_from"}


class CLIError(Exception):
    """A user error: printed as one line, exit status 2."""


def _die(msg: str) -> typing.NoReturn:
    raise CLIError(msg)


# --------------------------------------------------------------------------------------
# parsers
# --------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The ``marft`` parser with one sub-parser per command (``train`` takes more flags, see :func:`build_config`)."""
    from marft_algos.evaluation.leaderboard import add_arguments as add_leaderboard_arguments

    p = argparse.ArgumentParser(prog="marft", description="Multi-agent reinforcement fine-tuning of LLM teams.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    t = sub.add_parser("train", help="train a team", add_help=False)
    t.add_argument("-h", "--help", action="store_true", help="show help (with --algo: its options)")
    _add_run_arguments(t, algo="grpo")
    t.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    t.add_argument("--config", help="JSON file with config settings")

    t.add_argument("--init", default=None, metavar="RUN",
                   help="start from the weights of RUN (a `marft sft` run dir, a run or checkpoint dir); config field init_from")

    s = sub.add_parser("sft", help="per-role SFT warm start on demonstrations (docs/sft.md); then train --init RUN")
    _add_sft_arguments(s)

    e = sub.add_parser("eval", help="evaluate a team on held-out problems")
    e.add_argument("--env", help="environment id (default: the checkpoint's)")
    e.add_argument("--checkpoint", help="run dir or checkpoint dir; omit to evaluate the untrained --model")
    e.add_argument("--model", default="smollm2-135m", help="base model of the untrained team (no adapters)")
    e.add_argument("--split", default="test")
    e.add_argument("--n", type=int, default=200, help="number of problems (indices 0..n-1)")
    e.add_argument("--start-index", type=int, default=0)
    e.add_argument("--num-envs", type=int, default=16, help="episodes generated in parallel")
    e.add_argument("--greedy", action="store_true", help="greedy decoding instead of the eval sampling settings")
    e.add_argument("--seed", type=int, default=1234)
    e.add_argument("--json", dest="json_out", help="also write the result as JSON here")
    e.add_argument("--strict-context", action="store_true",
                   help="stop with an error when a prompt does not fit the context (default: count and warn)")
    e.add_argument(
        "--engine",
        help="generation engine: hf or vllm (needs vLLM; docs/engines.md); default: hf, "
        "or for a --checkpoint the engine its run was trained with",
    )

    le = sub.add_parser("list-envs", help="list registered environments (built-in, entry points, --import)")
    le.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                    help="import MODULE first, so that the envs it registers are listed (repeatable)")
    sub.add_parser("list-algos", help="list registered algorithms")

    lb = sub.add_parser(
        "leaderboard",
        help="accuracy of teams, checkpoints and majority-vote baselines on env suites; --compare: what moved per agent",
        description="Leaderboard: systems x env suites with fixed seeds -> Markdown table, CSV and plot "
        "(the same as benchmarks/leaderboard.py; see benchmarks/README.md).",
    )
    add_leaderboard_arguments(lb)  # one set of options for the CLI and the script

    from marft_algos.serve.cli import add_arguments as add_serve_arguments

    add_serve_arguments(sub.add_parser("serve", help="serve the team as an OpenAI-compatible endpoint, model = role (docs/programs.md)"))

    p.train_parser = t  # type: ignore[attr-defined]  (for `train --help` with algorithm options)

    q = sub.add_parser("quickstart", help="evaluate, train and re-evaluate a duo on arith-duo-v0 (about 10 min on 2 cores)")
    _add_run_arguments(q, env="arith-duo-v0", algo="marft-action", model="smollm2-135m", steps=1000, out="runs/quickstart", seed=0)
    q.add_argument("--minutes", type=float, default=6.0, help="training time budget (it usually ends the run before --steps)")
    q.add_argument("--eval-n", type=int, default=64, help="held-out problems per evaluation (greedy decoding)")
    q.add_argument("--env-kwargs", default=None, metavar="JSON",
                   help="keyword arguments of the env; default for arith envs: the easy level " + json.dumps(QUICKSTART_ARITH_LEVEL))
    return p


def _add_run_arguments(parser: argparse.ArgumentParser, **defaults: Any) -> None:
    """The options of a training run that ``train`` and ``quickstart`` share. ``defaults``:
    the parser's own defaults; an option without one (None) leaves the setting to the config."""
    d: dict[str, Any] = {"env": None, "algo": None, "model": None, "steps": None, "out": None, "seed": None, **defaults}

    def shown(name: str, fallback: Any = None) -> str:
        value = d[name] if d[name] is not None else fallback
        return f" (default {value})" if value is not None else ""

    parser.add_argument("--env", default=d["env"], help="environment id (marft list-envs)" + shown("env"))
    parser.add_argument("--algo", default=d["algo"], help="algorithm (marft list-algos)" + shown("algo"))
    parser.add_argument("--model", default=d["model"], help="base model alias, Hub id or path" + shown("model", "smollm2-135m"))
    parser.add_argument("--steps", type=int, default=d["steps"], help="training steps" + shown("steps"))
    parser.add_argument("--out", default=d["out"], help="run directory" + shown("out"))
    parser.add_argument("--seed", type=int, default=d["seed"], help="random seed" + shown("seed"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config setting (repeatable; dotted keys go into dict settings)")


#: ``marft sft`` flags whose names differ from their SFTConfig fields
_SFT_FLAGS = {"env_id": "--env", "out_dir": "--out"}


def _add_sft_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per :class:`~marft_algos.sft.SFTConfig` field (``--env``, ``--demos``, ``--out``, ...)."""
    for f in dataclasses.fields(SFTConfig):
        flag = _SFT_FLAGS.get(f.name, "--" + f.name.replace("_", "-"))
        parser.add_argument(flag, dest=f"sft_{f.name}", default=None, metavar="VALUE", help=f.metadata.get("help", ""))


def _sft_config(args: argparse.Namespace) -> Any:
    """The :class:`~marft_algos.sft.SFTConfig` of ``marft sft``'s flags (values parsed as JSON
    where they are numbers, booleans, lists or dicts; ``--roles a,b`` also works)."""
    data: dict[str, Any] = {}
    for f in dataclasses.fields(SFTConfig):
        raw = getattr(args, f"sft_{f.name}", None)
        if raw is None:
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        if default is None or isinstance(default, str) or (f.name == "roles" and not raw.lstrip().startswith("[")):
            data[f.name] = raw  # text (roles: "a,b", split by SFTConfig)
            continue
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            _die(f"{_SFT_FLAGS.get(f.name, '--' + f.name.replace('_', '-'))} {raw!r}: expected {type(default).__name__} (JSON)")
        if type(value) is not type(default) and not (isinstance(default, float) and type(value) is int):
            _die(f"{_SFT_FLAGS.get(f.name, '--' + f.name.replace('_', '-'))} {raw!r}: expected {type(default).__name__}")
        data[f.name] = value
    return SFTConfig(**data)


def cmd_sft(args: argparse.Namespace) -> int:
    """``marft sft``: train each role's adapter on demonstrations and write a run dir for
    ``marft train --init`` (a new or empty ``--out``)."""
    config = _sft_config(args)
    if not config.out_dir:
        _die("sft needs --out (the run directory to write; then marft train --init DIR)")
    _check_env(config.env_id)
    _check_device(config.device)
    if config.demos != "scripted" and not Path(config.demos).is_file():
        _die(f"--demos {config.demos!r}: no such file (give a JSONL file of per-role chat turns, or 'scripted')")
    out = Path(config.out_dir)
    check_new_run_dir(out)
    with RunDirLock(out):
        try:
            result = run_sft(config)
        except ValueError as e:  # no demonstrations, a bad JSONL line: the user's input
            _die(str(e))
    print(f"done: sft of {', '.join(f'{r} ({k} demos)' for r, k in result.demos.items())}, loss "
          + ", ".join(f"{r} {result.first_loss[r]:.3f} -> {v[-1]:.3f}" for r, v in result.losses.items())
          + f"; start RL with: marft train --env {config.env_id} --init {out} --model {config.model}")
    return 0


def _config_flag_parser(config_cls: type) -> argparse.ArgumentParser:
    """One ``--field-name`` flag per config field, ``--part-setting`` per setting of a nested
    part (``--recovery-max-rollbacks``); values are parsed like ``--set`` values."""
    from marft_algos.config import nested_fields

    p = argparse.ArgumentParser(prog=f"marft train --algo {config_cls.algo or '?'}", add_help=False)
    nested = nested_fields(config_cls)
    for f in dataclasses.fields(config_cls):
        if f.name in ("model", "steps", "seed"):  # already flags of `marft train`
            continue
        p.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=None, metavar="VALUE", help=f.metadata.get("help", ""))
        if f.name not in nested:
            continue
        for sub in dataclasses.fields(nested[f.name]):
            if sub.name == "enabled":  # that is --recovery true/false
                continue
            flag = f"--{f.name}-{sub.name}".replace("_", "-")
            p.add_argument(flag, dest=f"{f.name}.{sub.name}", default=None, metavar="VALUE", help=sub.metadata.get("help", ""))
    return p


def build_config(args: argparse.Namespace, extra: list[str]) -> Any:
    """The algorithm's config from defaults < --config < flags < --set."""
    from marft_algos.config import apply_overrides, config_from_dict
    from marft_algos.registry import get_algorithm

    spec = get_algorithm(args.algo)
    cls = spec.config_cls
    data: dict[str, Any] = {}
    if args.config:
        path = Path(args.config)
        if not path.is_file():
            _die(f"config file {path} not found")
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            _die(f"config file {path} is not valid JSON: {e}")
        if not isinstance(data, dict):
            _die(f"config file {path} must hold a JSON object of settings, got {type(data).__name__}")
        data.pop("algo", None)
    for flag, name in _ALIASES.items():
        value = getattr(args, flag, None)
        if value is not None:
            data[name] = value
    parser = _config_flag_parser(cls)
    flags, unknown = parser.parse_known_args(extra)
    if unknown:
        import difflib

        names = [a.option_strings[0] for a in parser._actions if a.option_strings]
        bad = unknown[0]
        close = difflib.get_close_matches(bad.split("=")[0], names, n=1)
        _die(f"unknown option {bad!r} for --algo {args.algo}" + (f"; did you mean {close[0]!r}?" if close else ""))
    # flags are parsed exactly like --set values (dotted keys into nested parts)
    from_flags = [f"{name}={value}" for name, value in vars(flags).items() if value is not None]
    data = apply_overrides(cls, data, from_flags + list(args.set))
    return config_from_dict(cls, data)


# --------------------------------------------------------------------------------------
# commands
# --------------------------------------------------------------------------------------


def _check_env(env_id: str) -> None:
    """Fail early on an unknown env id (with a did-you-mean), before any model loads."""
    import marft_envs

    marft_envs.spec(env_id)  # raises NameNotFound / VersionNotFound with a suggestion


def _get_algorithm(name: str) -> Any:
    """The registered algorithm, with an entry point that does not import as a one-line error."""
    from marft_algos.registry import ALGORITHMS, get_algorithm

    try:
        return get_algorithm(name)
    except (ImportError, AttributeError, TypeError) as e:
        spec = ALGORITHMS.get(name)
        where = f" ({spec.trainer_cls!r}, {spec.config_cls!r})" if spec is not None else ""
        _die(f"algorithm {name!r} is registered{where} but does not load: {type(e).__name__}: {e}")


def _check_device(device: str) -> None:
    """A CUDA / MPS device that this machine does not have is a one-line error, not a traceback."""
    if device == "auto":
        return
    import torch

    kind = torch.device(device).type
    if kind == "cuda" and not torch.cuda.is_available():
        _die(f"device {device!r}: CUDA is not available on this machine (use --set device=cpu or auto)")
    if kind == "cuda" and torch.device(device).index is not None and torch.device(device).index >= torch.cuda.device_count():
        _die(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if kind == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        _die(f"device {device!r}: MPS is not available on this machine (use --set device=cpu or auto)")


def _check_rank_split(config: Any, world_size: int) -> None:
    """Under torchrun each rank plays whole groups of episodes: refuse a batch that does not
    split evenly before any model loads (it used to fail at the first step, after start-up)."""
    if world_size <= 1:
        return
    unit = max(1, int(getattr(config, "group_size", 1) or 1))
    groups = config.num_envs // unit
    if groups % world_size:
        per = unit * world_size
        sizes = f"num_envs={config.num_envs}" + (f" with group_size={unit}" if unit > 1 else "")
        _die(f"{sizes} gives {groups} group(s) of episodes per step, which do not split evenly over {world_size} ranks: "
             f"set num_envs to a multiple of {per} (e.g. --set num_envs={max(per, (config.num_envs // per) * per)}) "
             f"or launch a number of ranks that divides {groups}")


def _write_config(config: Any, path: Path) -> None:
    """config.json (with its ``algo``), replaced atomically."""
    tmp = path.with_name(f".{path.name}.tmp")
    from marft_algos.checkpoint import run_config

    tmp.write_text(json.dumps(run_config(config), indent=2, sort_keys=True))
    os.replace(tmp, path)


def cmd_train(args: argparse.Namespace, extra: list[str]) -> int:
    """``marft train``: build the config, train (or resume) and save into ``--out``.

    The run dir is locked for the run's life. A new run needs a missing or empty ``--out``;
    a failed start leaves nothing behind (a dir it created is removed), and a failed
    ``--resume`` leaves the run dir as it was (config.json is written once the resume
    succeeded).
    """
    import shutil

    from marft_algos.checkpoint import (
        CheckpointError,
        clean_stale,
        find_checkpoint,
        read_checkpoint_config,
    )
    from marft_algos.distributed import env_rank, env_world_size
    from marft_algos.rundir import (
        RunDirLock,
        check_new_run_dir,
        has_checkpoint,
        remove_unsaved_run,
        resume_changes,
    )

    if args.help:
        print(build_parser().train_parser.format_help())  # type: ignore[attr-defined]
        if args.algo:
            print(f"\noptions of --algo {args.algo} (also settable with --set key=value):")
            print(_config_flag_parser(_get_algorithm(args.algo).config_cls).format_help().split("\n", 2)[-1])
        return 0
    spec = _get_algorithm(args.algo)
    config = build_config(args, extra)
    _check_env(config.env_id)
    _check_device(config.device)
    if args.resume and not config.out_dir:
        _die("--resume needs --out (the run directory to continue)")
    _check_rank_split(config, env_world_size())  # under torchrun: before any model loads or dir is made
    out = Path(config.out_dir) if config.out_dir else None
    # under torchrun / accelerate every rank runs this command: rank 0 alone checks, locks and
    # writes the run dir (the other ranks would find it "in use" or "not empty")
    main_rank = env_rank() == 0
    if out is not None:
        if out.exists() and not out.is_dir():
            _die(f"--out {out} is a file, not a directory; choose another --out")
        if args.resume and not out.is_dir():
            _die(f"cannot resume: run directory {out} does not exist")
        if args.resume and not has_checkpoint(out):
            _die(f"cannot resume: run directory {out} holds no checkpoint (the run stopped before its first save; "
                 "checkpoints are written every checkpoint_every steps and at the end): there is nothing to continue. "
                 "Run the same command without --resume to start it again from step 0 in that directory "
                 "(its earlier logs are replaced), or choose another --out")
        if not args.resume and main_rank:
            check_new_run_dir(out)
    created = out is not None and not out.exists() and main_rank
    lock = RunDirLock(out) if out is not None and main_rank else None
    try:
        if lock is not None:
            lock.acquire()
            if not args.resume and (removed := remove_unsaved_run(out)):  # type: ignore[arg-type]
                print(f"run directory {out} held a run that stopped before its first checkpoint: "
                      f"starting again from step 0 (replaced {', '.join(removed)})")
        ckpt = None
        if args.resume:
            assert out is not None
            clean_stale(out / "checkpoints")
            try:
                ckpt = find_checkpoint(out)
                resume_changes(read_checkpoint_config(ckpt), config, where=ckpt)  # refuse before loading any model
                at = int(ckpt.name.split("-")[-1]) if ckpt.name.startswith("step-") else 0
                if config.steps < at:
                    _die(f"cannot resume to --steps {config.steps}: the run in {out} is already at step {at} "
                         f"({ckpt.name}); pass --steps above {at} to train further, or evaluate it with "
                         f"marft eval --checkpoint {out}")
            except CheckpointError as e:
                _die(f"cannot resume: {e}")
        trainer = spec.trainer_cls(config)
        if ckpt is not None:
            try:
                ckpt = trainer.load_checkpoint(ckpt)
            except CheckpointError as e:
                _die(f"cannot resume: {e}")
            print(f"resumed from {ckpt} at step {trainer.global_step}")
            for line in getattr(trainer, "resume_changes", []):
                print(f"  changed on resume (applied): {line}")
        if out is not None and main_rank:
            _write_config(config, out / "config.json")
    except BaseException:
        if lock is not None:
            lock.release()
        if created and out is not None:
            shutil.rmtree(out, ignore_errors=True)  # a failed start leaves nothing behind
        raise
    try:
        trainer.train()
    finally:
        if lock is not None:
            lock.release()
    last = trainer.history[-1] if trainer.history else {}
    if main_rank:
        print(f"done: {trainer.global_step} steps, team/reward {last.get('team/reward', float('nan')):.3f}" + (f", run dir {config.out_dir}" if config.out_dir else ""))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    """``marft eval``: accuracy of a checkpoint, or of the untrained ``--model``, on problems 0..n-1.

    On another ``--env`` than its run's, a checkpoint keeps its team but not the run's task
    options (see :func:`marft_algos.evaluation.policies.checkpoint_env`).
    """
    from marft_algos.evaluation import evaluate, evaluate_checkpoint, untrained_policy

    if args.n < 1:
        _die(f"--n must be at least 1 (the number of problems to evaluate), got {args.n}")
    if args.start_index < 0:
        _die(f"--start-index must be >= 0, got {args.start_index}")
    if args.env:
        _check_env(args.env)
    kwargs = dict(n=args.n, split=args.split, start_index=args.start_index, num_envs=args.num_envs, greedy=args.greedy, seed=args.seed,
                  strict_context=args.strict_context)
    if args.checkpoint:
        result = evaluate_checkpoint(args.checkpoint, args.env, engine=args.engine, **kwargs)
    else:
        if not args.env:
            _die("eval needs --env (or --checkpoint, whose run names its env)")
        import marft_envs

        policy = untrained_policy(marft_envs.spec(args.env).agents_for(split=args.split), args.model, engine=args.engine or "hf")
        result = evaluate(policy, args.env, label=f"untrained {args.model}", **kwargs)
    print(result)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result.to_dict(), indent=2))
    return 0


def cmd_list_envs(imports: list[str] | None = None) -> int:
    """``marft list-envs``: the env registry (built-in ids, those of installed ``marft_envs``
    entry points, and those registered by the ``--import`` modules), grouped by family."""
    import importlib

    import marft_envs

    marft_envs.load_plugins()
    for module in imports or []:
        try:
            importlib.import_module(module)
        except ImportError as e:
            _die(f"--import {module}: {e} (is the module on PYTHONPATH or installed?)")
    marft_envs.pprint_registry()
    return 0


def cmd_list_algos() -> int:
    """``marft list-algos``: registered algorithms and their one-line descriptions."""
    from marft_algos.registry import list_algorithms

    for spec in list_algorithms():
        print(f"{spec.name:<16} {spec.description}")
    return 0


#: The quickstart's settings for every algorithm (``--set`` overrides any of them): CPU-sized
#: rollouts (a short analysis, a short boxed answer) sampled at temperature 0.7, where a
#: 135M model still produces answers worth reinforcing (at 1.0 its team reward is ~0.1
#: against ~0.5 greedy), and a LoRA learning rate that moves within a few minutes.
QUICKSTART_RECIPE: dict[str, Any] = {
    "num_envs": 16,
    "lr": 2e-4,
    "lora_r": 16,
    "lora_alpha": 32,
}
#: The quickstart trains arith at its easy level, where a few minutes of CPU move the team
#: visibly (the default level, ~20% for the untrained model, needs the longer headline run).
QUICKSTART_ARITH_LEVEL: dict[str, Any] = {"digits": 1, "ops": "+-*"}
#: Per-role sampling of the recipe; other roles (another ``--env``) sample at 0.7 with
#: their profile's token limit.
QUICKSTART_SAMPLING: dict[str, dict[str, Any]] = {
    "reasoner": {"max_new_tokens": 64, "temperature": 0.7},
    "actor": {"max_new_tokens": 24, "temperature": 0.7},
}
#: A calculator or search call is 34 SmolLM2 tokens before its end token: the quickstart
#: actor's 24 would cut every call, so a role with tools samples at least this many.
TOOL_ROLE_MIN_TOKENS = 48


def tool_roles(env_id: str, env_kwargs: dict[str, Any] | None = None) -> frozenset[str]:
    """The agents of ``env_id`` that have tools."""
    env = marft_envs.make(env_id, **(env_kwargs or {}))
    return frozenset(a for a in env.possible_agents if env.tools(a))


def quickstart_sampling(env_id: str, env_kwargs: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """The recipe's per-role sampling for ``env_id``'s agents (``QUICKSTART_SAMPLING``, other roles
    at 0.7), a role with tools given at least ``TOOL_ROLE_MIN_TOKENS`` new tokens."""
    tools = tool_roles(env_id, env_kwargs)
    out = {}
    for a in marft_envs.spec(env_id).agents_for(**(env_kwargs or {})):
        s = dict(QUICKSTART_SAMPLING.get(a, {"temperature": 0.7}))
        if a in tools and s.get("max_new_tokens", TOOL_ROLE_MIN_TOKENS) < TOOL_ROLE_MIN_TOKENS:
            s["max_new_tokens"] = TOOL_ROLE_MIN_TOKENS
        out[a] = s
    return out


def cmd_quickstart(args: argparse.Namespace) -> int:
    """Untrained eval -> timed training with a progress bar -> trained eval -> table + plot."""
    from marft_algos.config import apply_overrides, config_from_dict
    from marft_algos.evaluation import evaluate, format_table
    from marft_algos.registry import get_algorithm

    _check_env(args.env)
    if args.eval_n < 1:
        _die(f"--eval-n must be at least 1 (held-out problems per evaluation), got {args.eval_n}")
    spec = get_algorithm(args.algo)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = {
        "env_id": args.env,
        "model": args.model,
        "steps": args.steps,
        "max_minutes": args.minutes,
        "out_dir": str(out),
        "seed": args.seed,
        "transcript_every": 5,
    }

    base.update(QUICKSTART_RECIPE)
    if args.env_kwargs is not None:
        try:
            base["env_kwargs"] = json.loads(args.env_kwargs)
        except json.JSONDecodeError as e:
            _die(f"--env-kwargs is not valid JSON: {e}")
    elif args.env.startswith("arith-"):
        base["env_kwargs"] = dict(QUICKSTART_ARITH_LEVEL)
    base["sampling_overrides"] = quickstart_sampling(args.env, base.get("env_kwargs"))
    if spec.name == "grpo":
        base["group_size"] = 4
    config = config_from_dict(spec.config_cls, apply_overrides(spec.config_cls, base, args.set))
    t_start = time.time()
    level = f" with {json.dumps(config.env_kwargs)}" if config.env_kwargs else ""
    print(f"[quickstart] loading {config.model} and building a {args.env}{level} team ({spec.name})")
    trainer = spec.trainer_cls(config)
    eval_kwargs = dict(n=args.eval_n, split="test", num_envs=16, max_context=config.max_context, env_kwargs=config.env_kwargs,
                       greedy=True, sampling_overrides=config.sampling_overrides)
    print(f"[quickstart] evaluating the untrained team on {args.eval_n} held-out problems")
    with trainer.gathered():  # under FSDP: whole weights, no collective per decode step
        before = evaluate(trainer.policy, args.env, label="untrained team", **eval_kwargs)
    print(f"[quickstart] {before}")
    print(f"[quickstart] training for up to {args.minutes:g} min (max {args.steps} steps)")
    trainer.train()
    print("[quickstart] evaluating the trained team")
    with trainer.gathered():
        after = evaluate(trainer.policy, args.env, label=f"trained ({trainer.global_step} steps)", **eval_kwargs)
    table = format_table([before, after])
    summary = {
        "before": before.to_dict(),
        "after": after.to_dict(),
        "steps": trainer.global_step,
        "minutes": (time.time() - t_start) / 60,
        "config": config.to_dict(),
    }
    (out / "results.json").write_text(json.dumps(summary, indent=2))
    (out / "results.txt").write_text(table + "\n")
    print()
    print(table)
    print()
    print(f"learning curve: {out / 'learning_curve.png'}   metrics: {out / 'metrics.jsonl'}   TensorBoard: {out / 'tb'}")
    print(f"total time {(time.time() - t_start) / 60:.1f} min")
    return 0


# --------------------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------------------


def _user_errors() -> tuple[type[BaseException], ...]:
    from marft_algos.checkpoint import CheckpointError
    from marft_algos.config import ConfigError
    from marft_algos.engines import EngineNotFound
    from marft_algos.evaluation.errors import EvaluationError
    from marft_algos.logging import LogFileError
    from marft_algos.registry import UnknownAlgorithmError
    from marft_algos.rollout import ContextOverflowError
    from marft_algos.rundir import RunDirError

    errs: list[type[BaseException]] = [CLIError, ConfigError, UnknownAlgorithmError, CheckpointError, FileNotFoundError, EvaluationError,
                                       RunDirError, LogFileError, ContextOverflowError,
                                       EngineNotFound]
    try:
        from marft_algos.models.aliases import UnknownModelError
        from marft_algos.models.policy import AdapterNameError

        errs += [UnknownModelError, AdapterNameError]
    except ImportError:
        pass
    try:
        import marft_envs

        errs.append(marft_envs.Error)
    except ImportError:
        pass
    return tuple(errs)


#: OSErrors that are the user's disk, not a bug: one line naming the path, exit status 2
_DISK_ERRNOS = frozenset(
    e for e in (errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, getattr(errno, "EDQUOT", None), errno.ENOTDIR, errno.EISDIR)
    if e is not None
)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``marft`` command; returns the exit status (2 for bad input)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    from marft_algos.serve.cli import expand_program_flags

    try:
        argv = expand_program_flags(argv)  # train --program M:F --roles a,b: the program env
    except ValueError as e:
        print(f"marft train: error: {e}", file=sys.stderr)
        return 2
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "train":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return _run_command(parser, args, extra)
    except SystemExit as e:
        from marft_algos.distributed import abort_rank, env_world_size

        if env_world_size() > 1:  # under torchrun: name the rank that left, end the job now
            abort_rank(e)
        raise


def _run_command(parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str]) -> int:
    """Run the parsed command; user errors become one line on stderr and exit status 2."""
    from marft_algos.distributed import env_rank, env_world_size

    user_errors = _user_errors()
    # under torchrun every rank prints its own errors: say which rank
    who = f"marft {args.command} (rank {env_rank()})" if env_world_size() > 1 else f"marft {args.command}"
    try:
        if args.command == "train":
            return cmd_train(args, extra)
        if args.command == "eval":
            return cmd_eval(args)
        if args.command == "sft":
            return cmd_sft(args)
        if args.command == "list-envs":
            return cmd_list_envs(args.imports)
        if args.command == "list-algos":
            return cmd_list_algos()
        if args.command == "leaderboard":
            from marft_algos.evaluation.leaderboard import run as run_leaderboard

            return run_leaderboard(args)
        if args.command == "quickstart":
            return cmd_quickstart(args)
        if args.command == "serve":
            from marft_algos.serve.cli import run as run_serve

            return run_serve(args)
    except user_errors as e:
        msg = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
        print(f"{who}: error: {msg}", file=sys.stderr)
        return 2
    except OSError as e:
        if e.errno not in _DISK_ERRNOS:
            raise
        # a full or read-only disk, or no permission: say where, not a traceback
        where = e.filename if e.filename is not None else "(unknown path)"
        print(f"{who}: error: cannot write {where}: {e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
