"""A decode fast path (a policy flag) must not change what is sampled."""

from __future__ import annotations

from typing import Any


def assert_fast_path_exact(policy: Any, flag: str, reqs: list[Any], seed: int, tol: float = 1e-4) -> list[Any]:
    """Generate ``reqs`` with ``policy.<flag>`` on, then off (restored after): the same
    tokens, and log-probs within ``tol``. Returns the fast path's results."""
    fast = policy.generate(reqs, seed=seed)
    setattr(policy, flag, False)
    try:
        slow = policy.generate(reqs, seed=seed)
    finally:
        setattr(policy, flag, True)
    for f, s in zip(fast, slow, strict=True):
        assert f.token_ids == s.token_ids
        assert max(abs(x - y) for x, y in zip(f.logprobs, s.logprobs, strict=True)) < tol
    return fast
