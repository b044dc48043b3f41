"""Shared pytest fixtures (keep this tiny: several developers add to it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# helpers/ holds what several test modules share (tests never import each other); pytest
# puts tests/ on sys.path for this conftest, so the package imports as ``helpers``.
from helpers.fast_path import assert_fast_path_exact as _assert_fast_path_exact
from hypothesis import settings

from marft_envs.sandbox import LEVELS, available_levels

# Hypothesis fails an example slower than 200 ms by default: a wall-clock assert in every
# @given test, which flakes on a loaded 2-core machine. Bounds on time are explicit asserts
# with helpers.timing.MARGIN instead; settings(...) on a test still override the rest.
settings.register_profile("marft", deadline=None)
settings.load_profile("marft")

_DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The real data sets: ``$MARFT_DATA_DIR``, else ``<repo>/../shared/data``; skip if absent."""
    path = Path(os.environ.get("MARFT_DATA_DIR") or _DEFAULT_DATA)
    if not path.is_dir() and _in_ci():  # CI must run the data tests: a skip would hide that
        pytest.fail(f"CI: data directory {path} is absent; set MARFT_DATA_DIR or provide "
                    "<repo>/../shared/data (data tests must not skip in CI)", pytrace=False)
    if not path.is_dir():
        pytest.skip(f"data directory {path} is absent (set MARFT_DATA_DIR to run data tests)")
    return path


def _in_ci() -> bool:
    """``CI`` set to a true value (GitHub Actions and most CI services set ``CI=true``)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


@pytest.fixture
def assert_fast_path_exact():
    """:func:`helpers.fast_path.assert_fast_path_exact`: a decode fast path changes nothing sampled."""
    return _assert_fast_path_exact


@pytest.fixture(params=LEVELS)
def level(request: pytest.FixtureRequest) -> str:
    """Each sandbox isolation level in turn; a level this machine refuses is skipped."""
    reason = available_levels()[request.param]
    if reason is not None:
        pytest.skip(f"isolation level {request.param!r} refused here: {reason}")
    return request.param
