"""Golden runs: the fixed-seed runs of ``tests/golden`` give the recorded metrics and weights.

They were recorded before the training loop was restructured (issue 26): a refactor of
the loop must leave every case's per-step metrics and final trained tensors as they were.
Tolerance: metrics 1e-5 relative (plus 1e-7 absolute), for summation-order differences;
trained tensors 1e-5 relative plus 5e-5 absolute, because Adam amplifies a summation-order
difference in a near-zero gradient: the cases with an entropy bonus moved by up to 3.7e-6
when the LM head was chunked (5ce91ce) and by up to 4.2e-6 on a CPU with other kernels
(AVX-512/AMX), while a change of the algorithm moves weights by about the learning rate
(1e-2). Equal arithmetic gives equal bits (printed when a case is not bit-identical). New metric keys
may appear; a recorded one may not vanish or change.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("marft_algos.models")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: golden/
from golden import runs  # noqa: E402

RTOL, ATOL = 1e-5, 1e-7
TENSOR_ATOL = 5e-5


def assert_matches(name: str, history: list[dict[str, float]], tensors: dict[str, torch.Tensor]) -> None:
    """``history`` / ``tensors`` equal the recording of case ``name`` within the tolerance."""
    rec = torch.load(runs.path_of(name), weights_only=False)
    assert len(history) == len(rec["history"]), name
    for step, (got, want) in enumerate(zip(history, rec["history"], strict=True), 1):
        missing = sorted(set(want) - set(got))
        assert not missing, f"{name} step {step}: metrics no longer logged: {missing}"
        for k, v in want.items():
            assert math.isclose(got[k], v, rel_tol=RTOL, abs_tol=ATOL), f"{name} step {step}: {k} = {got[k]!r}, recorded {v!r}"
    assert set(tensors) == set(rec["tensors"]), f"{name}: trained tensors {sorted(set(tensors) ^ set(rec['tensors']))}"
    exact = True
    for k, want in rec["tensors"].items():
        got = tensors[k]
        assert got.shape == want.shape, (name, k)
        assert torch.allclose(got, want, rtol=RTOL, atol=TENSOR_ATOL), f"{name}: {k} differs by {(got - want).abs().max():.3g}"
        exact = exact and torch.equal(got, want)
    if not exact:
        print(f"{name}: within tolerance, not bit-identical")


@pytest.mark.parametrize("name", list(runs.CASES))
def test_golden_run(name: str) -> None:
    assert_matches(name, *runs.run_case(name))


@pytest.mark.parametrize("name", runs.DDP_CASES)
def test_golden_run_two_ranks(name: str, tmp_path: Path) -> None:
    out = tmp_path / "run.pt"
    proc = runs.launch_ddp(name, out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    rec = torch.load(out, weights_only=False)
    assert_matches(f"ddp-{name}", rec["history"], rec["tensors"])
