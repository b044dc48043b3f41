"""The tutorial's commands run as written (docs/tutorial/third-party-env.md).

Every ```bash block preceded by ``<!-- tested: tests/integration/test_tutorial.py -->`` is taken
from the page and run in a subprocess, the way a reader would paste it:

1. install the example package and run ``check_env`` on its id (from the checkout root);
2. ``marft train --env third_party_env:thirdparty-pair-v0 ... --model tiny-random`` and
   ``marft eval --checkpoint ...`` (in a temporary directory, so ``runs/`` lands there).

The commands get the running interpreter's ``bin/`` first on PATH (``pip``, ``python``,
``marft``; a ``marft`` shim calling ``python -m marft_algos.cli`` where marft's script is
not installed). ``pip install`` gets ``--no-deps --no-build-isolation``: marft is already
installed and CI may be offline. Where pip cannot install, the package goes on
PYTHONPATH instead and the other commands still run.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "tutorial" / "third-party-env.md"
EXAMPLE = REPO / "examples" / "third_party_env"
MARKER = "<!-- tested: tests/integration/test_tutorial.py -->"
BLOCK_RE = re.compile(re.escape(MARKER) + r"\s*\n```bash\n(.*?)^```", re.S | re.M)


def extract_tested_blocks(text: str) -> list[list[str]]:
    """The commands of each tested bash block (``\\`` continuations joined, comments dropped)."""
    blocks = []
    for m in BLOCK_RE.finditer(text):
        joined = re.sub(r"\\\n\s*", "", m.group(1))
        blocks.append([ln.strip() for ln in joined.splitlines() if ln.strip() and not ln.strip().startswith("#")])
    return blocks


@pytest.fixture(scope="module")
def blocks() -> list[list[str]]:
    text = PAGE.read_text(encoding="utf-8")
    found = extract_tested_blocks(text)
    assert len(found) == text.count(MARKER) == 2, "every marker must precede a ```bash block"
    return found


@pytest.fixture(scope="module")
def shell_env(blocks: list[list[str]], tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The shell environment of the commands, after the page's ``pip install`` has run."""
    bindir = Path(sys.executable).parent
    path = [str(bindir)]
    if not (bindir / "marft").exists():
        shim = tmp_path_factory.mktemp("bin")
        (shim / "marft").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m marft_algos.cli "$@"\n')
        (shim / "marft").chmod(0o755)
        path.insert(0, str(shim))
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([*path, env.get("PATH", "")])
    env.pop("PYTHONPATH", None)  # the package must come from the installation, not the test's path
    pip_cmd = blocks[0][0]
    proc = _run(pip_cmd + " -q --no-deps --no-build-isolation", REPO, env)
    if proc.returncode != 0:  # e.g. a read-only site-packages: fall back to the source tree
        env["PYTHONPATH"] = str(EXAMPLE)
    return env


def _run(cmd: str, cwd: Path, env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_blocks_are_the_documented_commands(blocks: list[list[str]]) -> None:
    install, train = blocks
    assert install[0].startswith("pip install -e examples/third_party_env")
    assert "check_env('third_party_env:thirdparty-pair-v0')" in install[1]
    assert train[0].startswith("marft train --env third_party_env:thirdparty-pair-v0") and "--model tiny-random" in train[0]
    assert train[1].startswith("marft eval --checkpoint runs/pair-smoke")


def test_install_and_check_env(blocks: list[list[str]], shell_env: dict[str, str]) -> None:
    # run from the checkout root, outside the example dir: the import comes from the installation
    proc = _run(blocks[0][1], REPO, shell_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "check_env passed" in proc.stdout


def test_train_and_eval_commands(blocks: list[list[str]], shell_env: dict[str, str], tmp_path: Path) -> None:
    train_cmd, eval_cmd = blocks[1]
    proc = _run(train_cmd, tmp_path, shell_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "done: 2 steps" in proc.stdout
    run = tmp_path / "runs" / "pair-smoke"
    # what the page says the run dir holds
    assert json.loads((run / "config.json").read_text())["env_id"] == "third_party_env:thirdparty-pair-v0"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert "agent/drafter/kl" in rows[-1] and "agent/editor/entropy" in rows[-1]
    assert list((run / "tb").glob("events.*")) and (run / "learning_curve.png").is_file()
    assert (run / "checkpoints" / "latest").is_file()

    proc = _run(eval_cmd, tmp_path, shell_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"accuracy \d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\] on 8 test problems", proc.stdout), proc.stdout[-2000:]


def test_the_tiny_model_fits_a_realistic_three_agent_prompt():
    """The tiny model spends one token per byte: its context must hold a three-agent team's
    prompt (system prompt, problem, two predecessors' 256-token actions) within the
    trainers' default max_context (issue 19; the old 512-position model overflowed)."""
    import marft_envs
    from marft_algos.config import TrainConfig
    from marft_algos.models import TeamPolicy

    env = marft_envs.make("arith-trio-v0")
    env.reset(seed=0)
    pol = TeamPolicy(list(env.possible_agents), base="tiny-random")
    for _ in env.possible_agents[:-1]:
        env.step("x" * 256)  # a predecessor using its whole 256-token (= byte) budget
    last = env.agent_selection
    prompt = pol.encode(last, env.messages(last))
    assert len(prompt) > 512  # what the tutorial's readers hit
    default = TrainConfig.__dataclass_fields__["max_context"].default
    assert pol.max_context(last) >= default and len(prompt) + 256 <= default
