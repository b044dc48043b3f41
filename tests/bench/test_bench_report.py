"""benchmarks/_common.py's staged report and option parsers (issue 26: rag.py and
sft_warmstart.py wrote the same CSV/JSON/Markdown stage and parsed --env-kwargs the same
way; rag.py and default_memory.py parsed --set the same way; algo_steps.py and headline.py
built an algorithm's config from shared settings the same way)."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # `benchmarks` importable, as the scripts do

from benchmarks._common import StagedReport, algo_config, json_option, set_values  # noqa: E402


def test_staged_report_writes_every_table_and_the_markdown_in_csv_order(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(model="m", seed=0)
    report = StagedReport(tmp_path, "demo", args, {"b": ("demo_b.csv", ["y"]), "a": ("demo_a.csv", ["x"])},
                          lambda wall_s: f"Model m; wall {wall_s >= 0}.")
    assert report.tables == {"b": [], "a": []}
    report.tables["a"].append({"x": 1})
    report.tables["b"] += [{"y": "p"}, {"y": "q"}]
    report.stage("first")
    assert capsys.readouterr().out.startswith("[demo] first done at ")
    with (tmp_path / "demo_b.csv").open() as f:
        assert [r["y"] for r in csv.DictReader(f)] == ["p", "q"]
    data = json.loads((tmp_path / "demo.json").read_text())
    assert list(data)[:3] == ["args", "b", "a"] and data["args"] == {"model": "m", "seed": 0}
    assert data["a"] == [{"x": 1}] and data["wall_s"] >= 0 and "torch" in data["versions"]
    md = (tmp_path / "demo.md").read_text()
    header, table_b, table_a = md.rstrip("\n").split("\n\n")
    assert header == "Model m; wall True." and "| y |" in table_b and "| x |" in table_a
    assert report.markdown(1.0) == md


def test_json_option_parses_or_exits_with_an_example() -> None:
    assert json_option("--env-kwargs", '{"k": 3}', "{}") == {"k": 3}
    with pytest.raises(SystemExit, match=r"--env-kwargs is not JSON \(.*\); e.g. --env-kwargs '\{\"hops\": \[1\]\}'"):
        json_option("--env-kwargs", "{hops: 1}", '{"hops": [1]}')


def test_set_values_parses_json_or_keeps_text_and_rejects_an_item_without_equals() -> None:
    # rag.py and default_memory.py each parsed --set this way; default_memory took "lr" as {"lr": ""}
    assert set_values(["lr=1e-4", "mode=lora", 'sampling_overrides={"a": {"temperature": 0.5}}', "note=a=b"]) == {
        "lr": 1e-4, "mode": "lora", "sampling_overrides": {"a": {"temperature": 0.5}}, "note": "a=b"}
    with pytest.raises(SystemExit, match=r"--set takes KEY=VALUE, got 'lr'"):
        set_values(["lr"])


def test_algo_config_keeps_the_fields_the_algorithm_has_and_applies_sets() -> None:
    # algo_steps.py and headline.py each filtered shared settings and applied --set this way
    from marft_algos.config import ConfigError

    spec, config = algo_config("grpo", {"env_id": "echo-duo-v0", "group_size": 2, "lr": 0.5}, ["lr=0.001"])
    assert spec.name == "grpo" and (config.group_size, config.lr) == (2, 0.001)
    _, ippo = algo_config("ippo", {"env_id": "echo-duo-v0", "group_size": 2}, ["group_size=3", "seed=7"], skip_unknown_sets=True)
    assert not hasattr(ippo, "group_size") and ippo.seed == 7
    with pytest.raises(ConfigError, match="group_size"):
        algo_config("ippo", {"env_id": "echo-duo-v0"}, ["group_size=3"])
