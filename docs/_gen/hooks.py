"""mkdocs hooks: pages generated from the code at build time.

Generated pages (never edit them by hand; they do not exist on disk):

* ``envs/index.md`` and ``envs/<family>.md``: the environment catalog, from the
  registry (:data:`marft_envs.registry`), each family's module docstring and the
  real team/space objects (built without loading any data set).
* ``cli.md``: the CLI reference, from :func:`marft_algos.cli.build_parser` and
  ``marft train --algo <name> --help`` for every registered algorithm.
* ``algorithms.md`` / ``results.md``: a short placeholder, only while the real page
  (written by its owner) is missing from ``docs/``.

Markdown pages may also contain two markers, replaced at build time:

* ``<!-- include: path/from/repo/root.py -->``: a fenced listing of that file;
* ``<!-- docstring: module.name -->``: the module's docstring, converted to Markdown;
* ``<!-- registry -->``: the output of ``marft_envs.pprint_registry()``.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import inspect
import json
import os
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_DIR = ROOT / "examples" / "third_party_env"
HELP_COLUMNS = "96"

# Entry points known to build a TextTeamEnv from (team/profiles, horizon, max_action_chars,
# reward) kwargs: their spaces are computed without making the env (no data is loaded).
TEXT_ENV_ENTRIES = (
    "marft_envs.text_env:env",
    "marft_envs.text_env:TextTeamEnv",
    "marft_envs.envs:make_code_env",
)

# Families whose task module is chosen by another kwarg (``dataset=``): its docs too.
EXTRA_TASK_DOCS: dict[str, tuple[str, ...]] = {}

PLACEHOLDERS = {
    "algorithms.md": (
        "# Algorithms\n\n!!! note\n    This page is written by the algorithms' developers and is not "
        "in this checkout yet.\n    Meanwhile: `marft list-algos` lists the algorithms and the "
        "[CLI reference](cli.md#options-of-each-algorithm) lists every setting of each one with "
        "its help text.\n"
    ),
    "results.md": (
        "# Results\n\n!!! note\n    Measured benchmark results will be published on this page; "
        "none are in this checkout yet.\n    The [quickstart](quickstart.md) prints an untrained vs "
        "trained table for your own machine.\n"
    ),
}


# --------------------------------------------------------------------------------------
# reST-flavoured docstrings -> Markdown
# --------------------------------------------------------------------------------------

_ROLE_RE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|obj|exc):`([^`]+)`")
_BORDER_RE = re.compile(r"^\s*=+(?:\s+=+)+\s*$")
_CODE_SPLIT_RE = re.compile(r"(``[^`]+?``|`[^`\n]+`)")


def _role(m: re.Match[str]) -> str:
    target = m.group(1)
    label = re.match(r"(.*?)\s*<(.+)>$", target)
    if label:
        return f"``{label.group(1)}``"
    if target.startswith("~"):
        target = target[1:].rsplit(".", 1)[-1]
    return f"``{target}``"


def _inline(text: str) -> str:
    """Roles and ``literals`` to Markdown code; ``<`` outside code escaped."""
    text = _ROLE_RE.sub(_role, text)
    # a literal ```lang in prose: shielded from the code-span split, shown as code
    text = re.sub(r"```(\w*)", lambda m: f"\x00{m.group(1)}\x00", text)
    out = []
    for part in _CODE_SPLIT_RE.split(text):
        if part.startswith("``") and part.endswith("``") and len(part) > 4:
            inner = part[2:-2]
            fence = "``" if "`" in inner else "`"
            pad = " " if "`" in inner else ""
            out.append(f"{fence}{pad}{inner}{pad}{fence}")
        elif part.startswith("`") and part.endswith("`"):
            out.append(part)
        else:
            out.append(part.replace("<", "&lt;"))
    return re.sub(r"\x00(\w*)\x00", lambda m: f"`` ```{m.group(1)} ``", "".join(out))


def _simple_table(lines: list[str]) -> list[str]:
    """A reST simple table (``====`` borders) as a Markdown table."""
    border = lines[0]
    spans = [(m.start(), m.end()) for m in re.finditer(r"=+", border)]

    def cells(line: str) -> list[str]:
        row = []
        for k, (a, _b) in enumerate(spans):
            end = spans[k + 1][0] if k + 1 < len(spans) else None
            row.append(line[a:end].strip())
        return row

    rows: list[list[str]] = []
    borders = 0
    header: list[str] | None = None
    for line in lines:
        if _BORDER_RE.match(line):
            borders += 1
            if borders == 2 and rows:
                header, rows = rows[0], []
            continue
        if not line.strip():
            continue
        row = cells(line)
        if rows and not row[0]:  # continuation line: append to the previous row
            rows[-1] = [f"{p} {c}".strip() for p, c in zip(rows[-1], row, strict=True)]
        else:
            rows.append(row)
    header = header or [""] * len(spans)
    out = ["| " + " | ".join(_inline(c) for c in header) + " |", "|" + "---|" * len(spans)]
    out += ["| " + " | ".join(_inline(c).replace("|", "\\|") for c in r) + " |" for r in rows]
    return out


def rst_to_md(doc: str) -> str:
    """Convert the reST conventions used in marft docstrings to Markdown."""
    text = (doc or "").strip("\n")
    first, _, rest = text.partition("\n")
    if first.startswith((" ", "\t")):  # e.g. a body that opens with an indented block
        lines = textwrap.dedent(text).splitlines()
    else:  # a raw docstring: the first line is never indented, the others may all be
        lines = [first, *textwrap.dedent(rest).splitlines()]
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("    ") and (i == 0 or not lines[i - 1].strip()):
            # an indented block after a blank line: a code block
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                j += 1
            block = lines[i:j]
            while block and not block[-1].strip():
                block.pop()
            out += ["```text", textwrap.dedent("\n".join(block)), "```", ""]
            i = j
            continue
        if _BORDER_RE.match(line):  # simple table: up to the third border
            j, borders = i, 0
            while j < len(lines):
                if _BORDER_RE.match(lines[j]):
                    borders += 1
                    if borders == 3:
                        break
                j += 1
            out += ["", *_simple_table(lines[i : j + 1]), ""]
            i = j + 1
            continue
        if line.rstrip().endswith("::") and not line.strip().startswith(("|", "-", "*")):
            # literal block: the following indented lines
            stripped = line.rstrip()[:-2].rstrip()
            if stripped:
                out.append(_inline(stripped) + ":")
            j = i + 1
            block: list[str] = []
            while j < len(lines) and (not lines[j].strip() or lines[j].startswith((" ", "\t"))):
                block.append(lines[j])
                j += 1
            while block and not block[-1].strip():
                block.pop()
            out += ["", "```", textwrap.dedent("\n".join(block)).strip("\n"), "```", ""]
            i = j
            continue
        if line.lstrip().startswith(">>>"):  # doctest block
            j = i
            block = []
            while j < len(lines) and lines[j].strip():
                block.append(lines[j])
                j += 1
            out += ["", "```pycon", textwrap.dedent("\n".join(block)), "```", ""]
            i = j
            continue
        # a run of plain lines: converted together (a ``literal`` may span lines)
        j = i
        while j < len(lines) and not (
            _BORDER_RE.match(lines[j])
            or lines[j].lstrip().startswith(">>>")
            or (j > i and lines[j].startswith("    ") and not lines[j - 1].strip())
            or (
                lines[j].rstrip().endswith("::")
                and not lines[j].strip().startswith(("|", "-", "*"))
            )
        ):
            j += 1
        out.append(_inline("\n".join(lines[i:j])))
        i = j
    return "\n".join(out).strip() + "\n"


def module_docstring(module: str) -> str:
    """A module's docstring, read from its source (the module is not imported)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        mod = importlib.import_module(module)
        return inspect.getdoc(mod) or ""
    return ast.get_docstring(ast.parse(Path(spec.origin).read_text(encoding="utf-8"))) or ""


def _split_summary(doc: str) -> tuple[str, str]:
    doc = inspect.cleandoc(doc or "")
    head, _, rest = doc.partition("\n\n")
    return " ".join(head.split()), rest


# --------------------------------------------------------------------------------------
# environment catalog
# --------------------------------------------------------------------------------------


def _ensure_example_importable() -> None:
    if importlib.util.find_spec("third_party_env") is None and EXAMPLE_DIR.is_dir():
        sys.path.insert(0, str(EXAMPLE_DIR))


def load_registry() -> dict[str, Any]:
    """The registry after importing marft_envs and the tutorial's example package."""
    import marft_envs

    _ensure_example_importable()
    with contextlib.suppress(ImportError):
        importlib.import_module("third_party_env")
    return dict(marft_envs.registry)


def _family(spec: Any) -> str:
    return (spec.namespace + "-" if spec.namespace else "") + spec.name.split("-")[0]


def _doc_module(spec: Any) -> str:
    """The module whose docstring documents ``spec``: the task's for generic text envs."""
    ep = (
        spec.entry_point
        if isinstance(spec.entry_point, str)
        else (f"{spec.entry_point.__module__}:{spec.entry_point.__qualname__}")
    )
    module = ep.split(":")[0]
    task = spec.kwargs.get("task")
    if ep == "marft_envs.envs:make_code_env":
        return "marft_envs.tasks.code"
    if ep in ("marft_envs.text_env:env", "marft_envs.text_env:TextTeamEnv") and isinstance(
        task, str
    ):
        from marft_envs.tasks import TASKS

        return TASKS.get(task, task).split(":")[0]
    return module


class _ProbeTask:
    """A data-free stand-in task: lets us build the real env object to read its spaces."""

    name = "probe"
    instructions = ""

    def __len__(self) -> int:
        return 1


def _probe_env(spec: Any) -> tuple[Any, str | None]:
    """``(env or None, note)``: an env object whose team and spaces match ``spec``."""
    from marft_envs import TextTeamEnv
    from marft_envs.tasks.base import Problem, Task

    ep = spec.entry_point if isinstance(spec.entry_point, str) else ""
    if ep in TEXT_ENV_ENTRIES:

        class Probe(_ProbeTask, Task):
            def get(self, index: int) -> Problem:
                return Problem(id="probe/0", question="", answer="")

            def grade(self, response, problem):  # pragma: no cover - never called
                raise NotImplementedError

        kw = spec.kwargs
        env = TextTeamEnv(
            Probe(),
            kw.get("team", kw.get("profiles", "duo")),
            horizon=kw.get("horizon", 1),
            max_action_chars=kw.get("max_action_chars", 4096),
            reward=kw.get("reward")
            or ({"outcome": 0.0, "partial": 1.0} if kw.get("reward_mode") == "fraction" else None),
        )
        return env, None
    try:
        import marft_envs

        return marft_envs.make(spec.id), None
    except Exception as e:  # a third-party env that needs data or a service
        return None, f"not instantiated at build time ({type(e).__name__})"


def _code(x: Any) -> str:
    s = str(x)
    return f"`` {s} ``" if "`" in s else f"`{s}`"


def _topology_md(topology: Any) -> tuple[str, str]:
    """``(kind, D edges)`` of a topology, for the catalog tables."""
    d = topology.to_dict()
    kind = d.get("type", type(topology).__name__)
    if kind == "chain":
        kind = (
            "chain"
            + ("" if d.get("full", True) else " (predecessor only)")
            + ": "
            + " → ".join(d["agents"])
        )
    elif kind == "dag":
        kind = "DAG; act in order " + " → ".join(topology.topological_order())
    elif kind == "routed":
        kind = (
            f"routed: {d['orchestrator']} → one of {', '.join(d['specialists'])}"
            + (f" → {d['finisher']}" if d.get("finisher") else "")
            + f" (default {d['default']})"
        )
    elif kind == "independent":
        kind = "independent (no agent sees another): " + ", ".join(d["agents"])
    edges = [f"{a}→{b}" for a, bs in topology.graph().items() for b in bs]
    return kind, ", ".join(edges) if edges else "none"


def _signature_md(func: Any) -> str:
    """``name=default, ...`` of a callable (annotations left out: they are strings here)."""
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return "..."
    params = []
    for p in sig.parameters.values():
        if p.name == "self":
            continue
        if p.kind is p.VAR_KEYWORD:
            params.append(f"**{p.name}")
        elif p.kind is p.VAR_POSITIONAL:
            params.append(f"*{p.name}")
        elif p.default is p.empty:
            params.append(p.name)
        else:
            params.append(f"{p.name}={p.default!r}")
    return ", ".join(params)


def _arguments(spec: Any) -> list[str]:
    """Keyword arguments ``make(id, **kwargs)`` accepts, from the real signatures."""
    from marft_envs.registration import load_entry_point

    out = []
    ep = spec.entry_point if isinstance(spec.entry_point, str) else ""
    try:
        func = load_entry_point(spec.entry_point)
    except Exception:
        return out
    if ep in ("marft_envs.text_env:env", "marft_envs.text_env:TextTeamEnv"):
        from marft_envs import TextTeamEnv

        out.append(
            f"environment: `TextTeamEnv({_signature_md(TextTeamEnv.__init__)})` "
            "(see the [overview](index.md#common-to-all-text-team-environments))"
        )
        task = spec.kwargs.get("task")
        if isinstance(task, str):
            from marft_envs.tasks import resolve_task_class

            cls = resolve_task_class(task)
            out.append(f"task: `{cls.__name__}({_signature_md(cls.__init__)})`")
    else:
        name = getattr(func, "__qualname__", getattr(func, "__name__", "entry point"))
        out.append(f"entry point: `{name}({_signature_md(func)})`")
    return out


def _reward_md(env: Any) -> str:
    cfg = getattr(env, "reward_config", None)
    if cfg is None:
        return "see the family description"
    nonzero = {k: v for k, v in cfg.to_dict().items() if v}
    return ", ".join(f"{k} {v:g}" for k, v in nonzero.items()) or "all weights 0"


def _id_section(spec: Any, all_specs: dict[str, Any]) -> list[str]:
    from marft_envs.registration import PETTINGZOO_NAMESPACE

    env, note = _probe_env(spec)
    ep = spec.entry_point if isinstance(spec.entry_point, str) else repr(spec.entry_point)
    rows: list[tuple[str, str]] = [
        ("description", _inline(spec.description).replace("|", "/") or "—")
    ]
    rows.append(("make", _code(f'marft_envs.make("{_make_id(spec)}")')))
    rows.append(("entry point", _code(ep)))
    rows.append(("registered kwargs", _code(json.dumps(spec.kwargs)) if spec.kwargs else "none"))
    if env is not None:
        team = getattr(env, "team", None)
        agents = list(env.possible_agents)
        rows.append(("agents", ", ".join(_code(a) for a in agents)))
        if team is not None:
            kind, edges = _topology_md(team.topology)
            rows.append(("topology", kind))
            rows.append(("D (who sees whose action)", edges))
            rows.append(("graded agent(s)", ", ".join(_code(a) for a in team.answer_agents)))
            rows.append(("team", _code(team.name)))
        rows.append(("action space", _code(repr(env.action_space(agents[0])))))
        rows.append(("observation space", _code(repr(env.observation_space(agents[0])))))
        rows.append(("reward weights", _reward_md(env)))
    else:
        rows.append(("agents, spaces", note or "—"))
    versions = sorted(
        s.id for s in all_specs.values() if s.namespace == spec.namespace and s.name == spec.name
    )
    rows.append(("registered versions", ", ".join(_code(v) for v in versions)))
    rows.append(("PettingZoo id", _code(f"{PETTINGZOO_NAMESPACE}/{spec.id.split('/')[-1]}")))
    out = [f"### `{spec.id}`", "", "| | |", "|---|---|"]
    out += [f"| {k} | {v} |" for k, v in rows]
    return out + [""]


def _make_id(spec: Any) -> str:
    ep = spec.entry_point if isinstance(spec.entry_point, str) else ""
    module = ep.split(":")[0]
    if module and not module.startswith("marft_envs"):
        return f"{module.split('.')[0]}:{spec.id}"
    return spec.id


def catalog_pages() -> dict[str, str]:
    """``{src_uri: markdown}`` of the environment catalog."""
    specs = load_registry()
    families: dict[str, list[Any]] = {}
    for env_id in sorted(specs):
        families.setdefault(_family(specs[env_id]), []).append(specs[env_id])

    import marft_envs.envs

    builtin_pages: dict[str, str] = dict(getattr(marft_envs.envs, "FAMILIES", {}))
    pages: dict[str, str] = {}
    index_rows = []
    for fam, fam_specs in families.items():
        doc_mod = _doc_module(fam_specs[0])
        summary, body = _split_summary(module_docstring(doc_mod))
        third_party = _make_id(fam_specs[0]) != fam_specs[0].id
        family_page = builtin_pages.get(fam) if not third_party else None
        source = (
            f"`marft_envs.envs.FAMILIES[{fam!r}]`, the docstring of `{doc_mod}`"
            if family_page
            else f"the docstring of `{doc_mod}`"
        )
        lines = [f"# {_inline(summary).rstrip('.')} (`{fam}`)", ""]
        lines += [
            f"*Generated at build time from {source} and the registry entries of "
            f"{len(fam_specs)} environment id(s).*",
            "",
        ]
        if family_page:
            lines += [rst_to_md(family_page), f"## Task: `{doc_mod}`", ""]
        for extra in EXTRA_TASK_DOCS.get(fam, ()) if not third_party else ():
            body += f"\n\n## Task: `{extra}`\n\n" + module_docstring(extra)
        if third_party:
            pkg = _make_id(fam_specs[0]).split(":")[0]
            lines += [
                '!!! note "Third-party example"',
                f"    Not part of marft: the package `{pkg}` from "
                "[the tutorial](../tutorial/third-party-env.md) registers these ids when it is "
                f'imported; `marft_envs.make("{pkg}:<id>")` imports it first.',
                "",
            ]
        lines += [
            rst_to_md(body),
            "## Arguments",
            "",
            "`marft_envs.make(id, **kwargs)` passes `kwargs` (over the registered ones) to "
            "the entry point; these are the real signatures:",
            "",
        ]
        lines += [f"- {line}" for line in _arguments(fam_specs[0])]
        lines += ["", "## Registered ids", ""]
        for spec in fam_specs:
            lines += _id_section(spec, specs)
            env, _ = _probe_env(spec)
            agents = ", ".join(env.possible_agents) if env is not None else "?"
            topo = (
                env.team.topology.to_dict().get("type", "?")
                if env is not None and hasattr(env, "team")
                else "?"
            )
            index_rows.append(
                f"| [`{spec.id}`]({fam}.md#{_anchor(spec.id)}) | {agents} | {topo} | "
                f"{(spec.description or '').replace('|', '/')} |"
            )
        pages[f"envs/{fam}.md"] = "\n".join(lines).rstrip() + "\n"

    summary, body = _split_summary(module_docstring("marft_envs.text_env"))
    index = [
        "# Environment catalog",
        "",
        f"*Generated at build time from the registry ({len(specs)} ids) and the environments' "
        "docstrings. `marft list-envs` prints the ids marft registers itself; third-party ids "
        "are registered when their package is imported.*",
        "",
        "| id | agents | topology | description |",
        "|---|---|---|---|",
        *index_rows,
        "",
        "Every id is made with `marft_envs.make(id, **kwargs)`; keyword arguments override the "
        "registered ones. Ids from third-party packages are made with "
        '`marft_envs.make("package:id")`, which imports the package first.',
        "",
        "## Common to all text team environments",
        "",
        f"*From the docstring of `marft_envs.text_env`:* {_inline(summary)}",
        "",
        rst_to_md(body),
    ]
    pages["envs/index.md"] = "\n".join(index).rstrip() + "\n"
    return pages


def _anchor(env_id: str) -> str:
    # the toc extension's slug of a heading "`arith-duo-v0`"
    return re.sub(r"[^\w\- ]", "", env_id).strip().lower().replace(" ", "-")


# --------------------------------------------------------------------------------------
# CLI reference
# --------------------------------------------------------------------------------------


def _subcommands(parser: Any) -> dict[str, tuple[Any, str]]:
    import argparse

    for action in parser._actions:  # argparse keeps sub-parsers in a private action
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return {name: (p, helps.get(name, "")) for name, p in action.choices.items()}
    return {}


def cli_page() -> str:
    """The CLI reference from the real parsers."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        from marft_algos import cli

        parser = cli.build_parser()
        subs = _subcommands(parser)
        module_summary, module_body = _split_summary(inspect.getdoc(cli) or "")
        lines = [
            "# CLI reference",
            "",
            "*Generated at build time from the real parsers "
            "(`marft_algos.cli.build_parser()`) and, for the options of each algorithm, from "
            "the config dataclasses that `marft train` builds its flags from.*",
            "",
            _inline(module_summary),
            "",
            rst_to_md(module_body),
            "",
            "| command | what it does |",
            "|---|---|",
            *[f"| [`marft {name}`](#marft-{name}) | {hlp} |" for name, (_p, hlp) in subs.items()],
            "",
            "```text",
            parser.format_help().rstrip(),
            "```",
            "",
        ]
        for name, (sub, hlp) in subs.items():
            lines += [f"## marft {name}", "", hlp[:1].upper() + hlp[1:] + ".", ""]
            lines += ["```text", sub.format_help().rstrip(), "```", ""]
            if name == "train":
                lines += _algo_help()
        return "\n".join(lines).rstrip() + "\n"
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def _algo_help() -> list[str]:
    """One table per registered algorithm: the config fields that ``marft train`` turns into flags."""
    import dataclasses
    import typing

    try:
        from marft_algos.registry import list_algorithms

        algos = list_algorithms()
    except Exception as e:  # the trainer stack failed to import: say so in the page
        return [
            f"!!! warning\n    Algorithm options could not be generated: {type(e).__name__}: {e}",
            "",
        ]
    out = [
        "### Options of each algorithm",
        "",
        "Every field of the algorithm's config dataclass is a flag of `marft train` "
        "(`--group-size 8`) and a `--set` key (`--set group_size=8`; dotted keys go into dict "
        "settings: `--set sampling_overrides.actor.temperature=0.7`). Precedence: defaults < "
        "`--config` < flags < `--set`. `marft train --algo <name> --help` prints the same list. "
        "The tables below are generated from the config dataclasses; the "
        "[algorithms page](algorithms.md) explains the estimators and losses.",
        "",
    ]
    for spec in algos:
        cls = spec.config_cls
        hints = typing.get_type_hints(cls)
        out += [
            f"#### `--algo {spec.name}`",
            "",
            f"{(spec.description or '').rstrip('.')}. Config class: "
            f"`{cls.__module__}.{cls.__name__}`.",
            "",
            "| flag | type | default | help |",
            "|---|---|---|---|",
        ]
        rows = [(f, f.name, hints) for f in dataclasses.fields(cls)]
        while rows:
            f, name, types = rows.pop(0)
            if f.default is not dataclasses.MISSING:
                default = json.dumps(f.default)
            elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
                value = f.default_factory()  # type: ignore[misc]
                if dataclasses.is_dataclass(value):  # a nested part: one flag per setting
                    sub_hints = typing.get_type_hints(type(value))
                    rows[:0] = [(g, f"{name}_{g.name}", sub_hints) for g in dataclasses.fields(value) if g.name != "enabled"]
                    value = getattr(value, "enabled", None) if hasattr(value, "enabled") else dataclasses.asdict(value)
                default = json.dumps(value)
            else:
                default = "required"
            flag = "--" + name.replace("_", "-")
            typ = re.sub(
                r"\btyping\.", "", str(types[f.name]).replace("<class '", "").replace("'>", "")
            )
            hlp = str(f.metadata.get("help", "")).replace("|", "\\|")
            out.append(f"| `{flag}` | `{typ}` | `{default}` | {_inline(hlp)} |")
        out.append("")
    return out


# --------------------------------------------------------------------------------------
# markers and mkdocs events
# --------------------------------------------------------------------------------------

_MARKER_RE = re.compile(r"<!--\s*(include|docstring|registry)\s*:?\s*([^\s>]*)\s*-->")


def expand_markers(markdown: str) -> str:
    def repl(m: re.Match[str]) -> str:
        kind, arg = m.group(1), m.group(2)
        if kind == "include":
            path = ROOT / arg
            lang = {".py": "python", ".toml": "toml", ".json": "json", ".sh": "bash"}.get(
                path.suffix, "text"
            )
            return (
                f"```{lang}\n# {arg}\n{path.read_text(encoding='utf-8').rstrip()}\n```"
                if lang in ("python", "toml", "bash")
                else f"```{lang}\n{path.read_text(encoding='utf-8').rstrip()}\n```"
            )
        if kind == "docstring":
            return rst_to_md(module_docstring(arg))
        import marft_envs

        return "```text\n" + (marft_envs.pprint_registry(disable_print=True) or "") + "\n```"

    return _MARKER_RE.sub(repl, markdown)


_CATALOG: dict[str, str] = {}


def on_config(config: Any) -> Any:
    """Build the catalog once and expand its nav entry into one page per env family."""
    _CATALOG.clear()
    _CATALOG.update(catalog_pages())
    section = [{"Overview": "envs/index.md"}] + [
        {uri[len("envs/") : -len(".md")]: uri} for uri in _CATALOG if uri != "envs/index.md"
    ]
    nav = config.get("nav") or []
    for k, item in enumerate(nav):
        if isinstance(item, dict) and list(item.values()) == ["envs/index.md"]:
            nav[k] = {next(iter(item)): section}
    return config


def on_files(files: Files, config: Any) -> Files:
    """Add the generated pages (and placeholders for missing owner-written pages)."""
    pages = dict(_CATALOG) or catalog_pages()
    pages["cli.md"] = cli_page()
    for name, text in PLACEHOLDERS.items():
        if files.get_file_from_path(name) is None:
            pages[name] = text
    for src_uri, content in pages.items():
        existing = files.get_file_from_path(src_uri)
        if existing is not None:
            files.remove(existing)
        files.append(File.generated(config, src_uri, content=content))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return expand_markers(markdown)
