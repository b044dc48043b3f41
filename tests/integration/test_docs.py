"""The documentation builds strictly, its generated pages are complete, its examples run.

* ``mkdocs build --strict`` (warnings are errors) in a subprocess, as CI does;
* the generated environment catalog names every registered id (built-in ids plus the
  tutorial's example package), the generated CLI page every subcommand and algorithm;
* every ``pycon`` example (``>>>``) in the hand-written pages runs as a doctest.

mkdocs is in the ``dev`` extra, so these tests do not skip in CI.
"""

from __future__ import annotations

import doctest
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
EXAMPLE = REPO / "examples" / "third_party_env"
PYCON_RE = re.compile(r"^```pycon\n(.*?)^```", re.M | re.S)


def _env_with_example() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(EXAMPLE), env.get("PYTHONPATH", "")) if p)
    return env


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    pytest.importorskip("mkdocs", reason="mkdocs is in the dev extra")
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{log[-5000:]}"
    assert "WARNING" not in log, log[-5000:]
    return out


def _text(html: str) -> str:
    return re.sub(r"<[^>]+>", "", html)


def test_build_is_strict_and_complete(site):
    for page in (
        "index.html",
        "quickstart/index.html",
        "concepts/flex-pomdp/index.html",
        "concepts/teams/index.html",
        "concepts/rewards/index.html",
        "envs/index.html",
        "algorithms/index.html",
        "cli/index.html",
        "checkpoints/index.html",
        "tutorial/third-party-env/index.html",
        "results/index.html",
    ):
        assert (site / page).is_file(), page
    # no marker was left unexpanded, no reST role leaked into prose
    for html in site.rglob("*.html"):
        text = html.read_text(encoding="utf-8")
        assert "&lt;!-- include" not in text and "<!-- include" not in text, html
        assert "<!-- docstring" not in text, html


def test_catalog_lists_every_registered_env(site):
    code = (
        "import json, marft_envs, third_party_env\nprint(json.dumps(sorted(marft_envs.registry)))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=_env_with_example(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ids = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "arith-duo-v0" in ids and "thirdparty-pair-v0" in ids
    overview = _text((site / "envs" / "index.html").read_text(encoding="utf-8"))
    family_pages = {
        p.parent.name: _text(p.read_text(encoding="utf-8"))
        for p in (site / "envs").glob("*/index.html")
    }
    for env_id in ids:
        assert env_id in overview, f"{env_id} missing from the catalog overview"
        family = env_id.split("/")[-1].split("-")[0]
        assert family in family_pages, f"no catalog page for the family of {env_id}"
        assert env_id in family_pages[family], f"{env_id} missing from envs/{family}"
    # the generated pages carry the real objects, e.g. D and the spaces
    arith = family_pages["arith"]
    assert "reasoner→actor" in arith and "UnicodeText(4096)" in arith


def test_cli_page_lists_every_subcommand_and_algorithm(site):
    from marft_algos.cli import build_parser
    from marft_algos.registry import list_algorithms

    page = _text((site / "cli" / "index.html").read_text(encoding="utf-8"))
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    assert {"train", "eval", "list-envs", "list-algos", "leaderboard", "quickstart"} <= set(subparsers.choices)
    for name, sub in subparsers.choices.items():
        assert f"marft {name}" in page, name
        for action in sub._actions:
            for flag in action.option_strings:
                assert flag in page, f"{name} {flag}"
    for spec in list_algorithms():
        assert f"--algo {spec.name}" in page, spec.name


def _pycon_pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "```pycon" in p.read_text(encoding="utf-8"))


@pytest.mark.parametrize("page", _pycon_pages(), ids=lambda p: str(p.relative_to(DOCS)))
def test_pycon_examples_run(page, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))  # the tutorial's example package
    text = page.read_text(encoding="utf-8")
    blocks = list(PYCON_RE.finditer(text))
    assert blocks
    parser = doctest.DocTestParser()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    globs: dict = {}  # shared: a page's blocks build on each other, like a session
    out: list[str] = []
    for m in blocks:
        lineno = text.count("\n", 0, m.start(1))
        test = parser.get_doctest(m.group(1), globs, str(page.relative_to(REPO)), str(page), lineno)
        runner.run(test, out=out.append, clear_globs=False)
        globs = test.globs  # DocTest copies its globals: carry them to the next block
    assert runner.failures == 0, "".join(out)[-5000:]


def _hooks():
    import importlib.util

    spec = importlib.util.spec_from_file_location("marft_docs_hooks", DOCS / "_gen" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docstring_conversion():
    pytest.importorskip("mkdocs", reason="mkdocs is in the dev extra")
    rst_to_md = _hooks().rst_to_md
    doc = """Summary with :class:`~marft_envs.topology.Chain` and ``x < y``.

    ====  ==========
    id    team
    ====  ==========
    a-v0  one <agent>
    ====  ==========

    Usage::

        make("a-v0")

    Plain text with <tags> and a fenced ```python block.
    """
    md = rst_to_md(doc)
    assert "`Chain`" in md and "`x < y`" in md
    assert "| id | team |" in md and "| a-v0 | one &lt;agent&gt; |".replace("&gt;", ">") in md
    assert 'Usage:\n\n```\nmake("a-v0")\n```' in md
    assert "&lt;tags>" in md and "`` ```python ``" in md


# --------------------------------------------------------------------------------------
# every logged metric key is documented in docs/algorithms.md
# --------------------------------------------------------------------------------------

_KEY_RE = re.compile(r"""f?["']((?:team|agent|rollout|perf|train|critic|recovery|value)/[A-Za-z0-9_{}./]+)["']""")


def _doc_key(key: str, agents: set[str]) -> str:
    """A logged key as the docs write it: agent names -> ``<a>``, recovery reasons -> ``<r>``,
    reward components (open-ended: each env names its own) -> ``<c>``, routes -> ``<from>-><to>``."""
    parts = key.split("/")
    if parts[0] in ("agent", "value") and len(parts) > 2 and (parts[1] in agents or parts[1].startswith("{")):
        parts[1] = "<a>"
    if parts[:2] == ["recovery", "reason"]:
        return "recovery/reason/<r>"
    if parts[0] == "route" and len(parts) == 2:
        return "route/<from>-><to>"
    if len(parts) == 3 and parts[:2] == ["team", "reward"] or len(parts) == 4 and parts[0] == "agent" and parts[2] == "reward":
        parts[-1] = "<c>"
    return "/".join(parts)


def _logged_keys_of_one_step() -> set[str]:
    """Keys of one tiny-model step of every algorithm, with the optional metrics switched on."""
    from marft_algos.registry import get_algorithm, list_algorithms

    extras = {  # switches whose metrics only appear when on
        "grpo": {"dynamic_sampling": True, "beta": 0.01},
        "ippo": {"beta": 0.01},
        "marft-action": {"kl_threshold": 1e6, "beta": 0.01},
        "marft-token": {"kl_threshold": 1e6},
    }
    keys: set[str] = set()
    algos = [s.name for s in list_algorithms()]
    assert {"grpo", "ippo", "marft-action", "marft-token"} <= set(algos)
    for algo in algos:
        spec = get_algorithm(algo)
        names = {f.name for f in __import__("dataclasses").fields(spec.config_cls)}
        data = {"env_id": "arith-duo-v0", "model": "tiny-random", "num_envs": 4, "group_size": 2, "steps": 1,
                "progress": False, "plot": False, "tensorboard": False, "transcript_every": 0,
                "sampling_overrides": {"reasoner": {"max_new_tokens": 3}, "actor": {"max_new_tokens": 3}},
                **extras.get(algo, {})}
        trainer = spec.trainer_cls(spec.config_cls(**{k: v for k, v in data.items() if k in names}))
        keys |= {_doc_key(k, set(trainer.agents)) for k in trainer.train_step()}
        rec = getattr(trainer.algorithm, "recovery", None)
        if rec is not None:
            rec.close()
    return keys


def _literal_keys() -> set[str]:
    """Metric-key literals in marft_algos (catches keys that only appear on rare events)."""
    out = set()
    for path in (REPO / "marft_algos").rglob("*.py"):
        for m in _KEY_RE.finditer(path.read_text(encoding="utf-8")):
            key = m.group(1)
            last = key.rsplit("/", 1)[-1]
            if key.count("/") < 1 or "{" in last and not key.startswith("recovery/reason/") or not last:
                continue  # generic f"agent/{agent}/{name}" helpers
            out.add(_doc_key(key, set()))
    return out


def test_every_logged_metric_is_documented():
    page = (DOCS / "algorithms.md").read_text(encoding="utf-8")
    section = page[page.index("## Metrics"):]
    documented = set(re.findall(r"`((?:team|agent|rollout|perf|train|critic|recovery|value|route)/[^`\s]+)`", section))
    logged = _logged_keys_of_one_step()
    assert {"agent/<a>/kl", "rollout/groups_dropped", "agent/<a>/kl_cut", "critic/grad_norm"} <= logged
    literal = _literal_keys()
    assert {"recovery/rollback", "recovery/reason/<r>", "rollout/context_capped"} <= literal
    missing = sorted((logged | literal) - documented)
    assert not missing, f"metric keys logged but not explained in docs/algorithms.md (## Metrics): {missing}"


def test_every_config_field_is_documented():
    """Each algorithm's config dataclass: every field is named in docs/algorithms.md."""
    import dataclasses

    from marft_algos.registry import get_algorithm, list_algorithms

    page = (DOCS / "algorithms.md").read_text(encoding="utf-8")
    algos = [s.name for s in list_algorithms()]
    assert {"grpo", "ippo", "marft-action", "marft-token"} <= set(algos)
    missing = sorted({(a, f.name) for a in algos for f in dataclasses.fields(get_algorithm(a).config_cls)
                      if f"`{f.name}`" not in page})
    assert not missing, f"config fields not explained in docs/algorithms.md: {missing}"
