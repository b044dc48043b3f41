"""A third-party package registers its own env on import and passes check_env.

The example package (examples/third_party_env) is pip-installed (editable, no deps, no
build isolation) into the running venv; a fresh interpreter then uses it the way a user
would. If pip cannot install here, the package directory goes on sys.path instead.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import marft_envs
from marft_envs.testing import check_env

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "third_party_env"
ENV_ID = "third_party_env:thirdparty-pair-v0"


@pytest.fixture(scope="module")
def installed() -> bool:
    """True if pip installed the example; otherwise it is importable through sys.path."""
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if str(EXAMPLE) not in sys.path:
        sys.path.insert(0, str(EXAMPLE))  # this interpreter cannot see a fresh editable install
    return proc.returncode == 0


def test_installed_package_works_in_a_fresh_interpreter(installed):
    if not installed:
        pytest.skip("pip could not install the example package here")
    code = (
        "import marft_envs\n"
        "from marft_envs.testing import check_env\n"
        f"env = marft_envs.make({ENV_ID!r})\n"
        "env.reset(seed=0)\n"
        "assert env.possible_agents == ['drafter', 'editor'], env.possible_agents\n"
        f"check_env({ENV_ID!r}, n_episodes=2)\n"
        "import third_party_env, os\n"
        "print(os.path.dirname(third_party_env.__file__))\n"
    )
    # cwd outside the example so the import must come from the installation
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert Path(proc.stdout.strip().splitlines()[-1]).resolve() == (EXAMPLE / "third_party_env").resolve()


def test_make_with_module_prefix_and_check_env(installed):
    env = marft_envs.make(ENV_ID)
    assert "thirdparty-pair-v0" in marft_envs.registry
    assert env.team.name == "pair" and env.team.topology.dependency("drafter", "editor")
    env.reset(options={"problem_index": 0})
    env.step("e-n-o-t-s")
    assert "[drafter]: e-n-o-t-s" in env.observe("editor")["prompt"]
    env.step("The reversed word is enots")
    assert env.rewards == {"drafter": 1.0, "editor": 1.0}
    check_env(ENV_ID, n_episodes=3)
    # also mirrored into PettingZoo's registry
    import pettingzoo

    if hasattr(pettingzoo, "aec_registry"):
        assert "marft/thirdparty-pair-v0" in pettingzoo.aec_registry
