"""``marft serve``: the team (untrained ``--model``, or a trained ``--checkpoint``) as an
OpenAI-compatible endpoint, ``model`` = role.

    marft serve --model smollm2-135m --roles planner,solver --port 8000
    marft serve --checkpoint runs/duo-grpo                  # the trained team, its roles
    marft serve --checkpoint runs/duo-grpo --host 0.0.0.0 --api-key "$KEY"
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from marft_algos.evaluation.policies import checkpoint_policy, untrained_policy
from marft_algos.serve.server import API_KEY_ENV, TeamServer, check_exposure

__all__ = ["PROGRAM_ENV_ID", "add_arguments", "build_server", "expand_program_flags", "run"]

#: the registered id of the program env (importing its module registers it)
PROGRAM_ENV_ID = "marft_envs.program_env:program-v0"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``marft serve``."""
    parser.add_argument("--model", default="smollm2-135m", help="base model of an untrained team (ignored with --checkpoint)")
    parser.add_argument("--checkpoint", help="run dir or checkpoint dir: serve the trained team (each role its adapter)")
    parser.add_argument("--roles", help="comma-separated roles to serve (required without --checkpoint; "
                        "with one, a subset of its roles)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default loopback; another needs an API key)")
    parser.add_argument("--port", type=int, default=8000, help="port (0: any free port, printed)")
    parser.add_argument("--api-key", default=None, help="required bearer token (default: $MARFT_API_KEY)")
    parser.add_argument("--tool-parser", default="hermes", help="tool-call syntax of the model family: hermes, json, mistral")
    parser.add_argument("--engine", default=None, help="generation engine (default hf, or the checkpoint's)")
    parser.add_argument("--batch-window-ms", type=float, default=10.0, help="how long a request waits for companions")
    parser.add_argument("--transcripts", default=None, metavar="JSONL",
                        help="append every answered call here (role, exact prompt and sampled ids, log-probs, latency)")


def _roles(text: str | None) -> list[str]:
    roles = [r.strip() for r in (text or "").split(",") if r.strip()]
    if len(set(roles)) != len(roles):
        raise ValueError(f"--roles names a role twice: {text}")
    return roles


def build_server(args: argparse.Namespace) -> Any:
    """The :class:`~marft_algos.serve.server.TeamServer` the options describe (not started)."""
    check_exposure(args.host, args.api_key or os.environ.get(API_KEY_ENV))  # before loading any model
    roles = _roles(args.roles)
    defaults: dict[str, dict[str, Any]] = {}
    if args.checkpoint:
        trained = checkpoint_policy(args.checkpoint, engine=args.engine)
        policy = trained.policy
        missing = [r for r in roles if r not in trained.roles]
        if missing:
            raise ValueError(f"--roles {missing} are not roles of the checkpoint (it has {trained.roles})")
        # the per-role sampling the team was trained with, under what a request sets itself
        for role in trained.roles:
            over = dict(getattr(trained.config, "sampling_overrides", {}).get(role, {}))
            defaults[role] = {k: v for k, v in over.items() if k in ("temperature", "top_p", "max_new_tokens", "stop")}
    else:
        if not roles:
            raise ValueError("serve needs --roles a,b,... (the model names clients ask for) or --checkpoint")

        policy = untrained_policy(roles, args.model, engine=args.engine or "hf")
    return TeamServer(policy, roles=roles or None, host=args.host, port=args.port, api_key=args.api_key,
                      parser=args.tool_parser, role_defaults=defaults, window_s=args.batch_window_ms / 1000.0,
                      transcripts=args.transcripts)


def run(args: argparse.Namespace) -> int:
    """``marft serve``: start the server and serve until Ctrl-C (exit 2 on bad options)."""
    try:
        server = build_server(args)
    except ValueError as e:
        print(f"marft serve: error: {e}", file=sys.stderr)
        return 2
    server.start()
    served = ", ".join(server.app.state.roles) if hasattr(server.app.state, "roles") else ""
    print(f"marft serve: {server.url}/v1 (models: {served})", flush=True)
    try:
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


def _take(argv: list[str], flag: str) -> str | None:
    """Remove ``flag VALUE`` (or ``flag=VALUE``) from ``argv``; its value, or None."""
    for k, item in enumerate(argv):
        if item == flag:
            if k + 1 >= len(argv):
                raise ValueError(f"{flag} needs a value")
            value = argv[k + 1]
            del argv[k: k + 2]
            return value
        if item.startswith(flag + "="):
            del argv[k]
            return item.split("=", 1)[1]
    return None


def expand_program_flags(argv: list[str]) -> list[str]:
    """``marft train --program MODULE:FUNCTION --roles a,b [--problems TASK]`` as the
    program env: ``--env marft_envs.program_env:program-v0 --set env_kwargs={...}``.

    Other arguments pass through unchanged; argv without ``--program`` is returned as is.

    >>> expand_program_flags(["train", "--program", "m:f", "--roles", "a,b", "--steps", "2"])[1:]
    ['--steps', '2', '--env', 'marft_envs.program_env:program-v0', '--set', 'env_kwargs={"program": "m:f", "roles": ["a", "b"], "problems": "arith"}']
    """
    if not argv or argv[0] != "train" or not any(a == "--program" or a.startswith("--program=") for a in argv):
        return argv
    out = list(argv)
    program = _take(out, "--program")
    roles = _roles(_take(out, "--roles"))
    problems = _take(out, "--problems") or "arith"
    if not program or ":" not in program:
        raise ValueError(f"--program must be MODULE:FUNCTION (a program(base_url, problem) function), got {program!r}")
    if not roles:
        raise ValueError("--program needs --roles a,b,... (the model names the program asks for)")
    if any(a == "--env" or a.startswith("--env=") for a in out):
        raise ValueError("--program runs the program env; leave out --env")
    kwargs = {"program": program, "roles": roles, "problems": problems}
    return [*out, "--env", PROGRAM_ENV_ID, "--set", "env_kwargs=" + json.dumps(kwargs)]
