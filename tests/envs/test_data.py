"""Data loading (local JSONL, env var, Hub fallback, errors) and the GSM8K/MATH tasks."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.timing import MARGIN

from marft_envs import data as D
from marft_envs.tasks.base import GradeResult, Problem, Task
from marft_envs.tasks.gsm8k import GSM8KTask
from marft_envs.tasks.math import MathTask

EXPECTED_ROWS = {
    ("gsm8k", "train"): 7473,
    ("gsm8k", "test"): 1319,
    ("math", "train"): 7500,
    ("math", "test"): 5000,
    ("math", "test500"): 500,
}
FIELDS = {
    "gsm8k": {"question", "answer"},
    "math": {"problem", "solution", "level"},
}


@pytest.mark.parametrize(("name", "split"), sorted(EXPECTED_ROWS))
def test_load_split_local(data_dir: Path, name: str, split: str) -> None:
    rows = D.load_split(name, split, data_dir=data_dir)
    assert len(rows) == EXPECTED_ROWS[(name, split)]
    assert FIELDS[name] <= set(rows[0])
    if split == "test500":
        assert {"answer", "subject", "unique_id"} <= set(rows[0])


def test_env_var_and_argument_precedence(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(D.DATA_DIR_ENV, str(data_dir))
    assert D.resolve_data_dir() == data_dir
    assert len(D.load_split("gsm8k", "test")) == 1319
    # An explicit argument wins over the environment variable.
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "test.jsonl").write_text(
        '{"question": "1+1?", "answer": "2\\n#### 2"}\n\n', encoding="utf-8"
    )
    rows = D.load_split("gsm8k", "test", data_dir=tmp_path)
    assert rows == [{"question": "1+1?", "answer": "2\n#### 2"}]
    assert D.resolve_data_dir(tmp_path) == tmp_path


def test_cache_returns_the_same_rows(data_dir: Path) -> None:
    a = D.load_split("math", "test500", data_dir=data_dir)
    b = D.load_split("math", "test500", data_dir=str(data_dir))
    assert a is b


def test_unknown_names_are_rejected() -> None:
    with pytest.raises(ValueError, match="unknown data set"):
        D.load_split("mmlu", "test")
    with pytest.raises(ValueError, match="unknown split"):
        D.load_split("gsm8k", "test500")


def test_bad_json_names_the_line(tmp_path: Path) -> None:
    (tmp_path / "math").mkdir()
    (tmp_path / "math" / "test500.jsonl").write_text('{"problem": 1}\n{oops\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"test500.jsonl:2"):
        D.load_split("math", "test500", data_dir=tmp_path)


def test_missing_data_offline_fails_fast_naming_both_fixes(tmp_path: Path) -> None:
    """Empty data dir + HF_HUB_OFFLINE=1, in a fresh interpreter (datasets reads the
    variable at import): a quick DataNotFoundError that names both fixes."""
    code = textwrap.dedent(
        f"""
        import time
        from marft_envs.data import DataNotFoundError, load_split
        t0 = time.monotonic()
        try:
            load_split("math", "test500", data_dir={str(tmp_path)!r})
        except DataNotFoundError as exc:
            print("ELAPSED", time.monotonic() - t0)
            print(exc)
        else:
            print("NO ERROR")
        """
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    env.pop(D.DATA_DIR_ENV, None)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    ).stdout
    assert "ELAPSED" in out, out
    assert float(out.split("ELAPSED")[1].split()[0]) < 15 + MARGIN  # no network retries
    assert "data_dir" in out and "MARFT_DATA_DIR" in out  # fix 1: local files
    assert "HuggingFaceH4/MATH-500" in out and "internet" in out  # fix 2: the Hub


def test_unreachable_hub_fails_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(D.DATA_DIR_ENV, raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(D, "_hub_reachable", lambda timeout=3.0: False)
    D.clear_cache()
    with pytest.raises(D.DataNotFoundError) as info:
        D.load_split("gsm8k", "train")
    msg = str(info.value)
    assert "MARFT_DATA_DIR" in msg and "openai/gsm8k" in msg and "unreachable" in msg


def test_hub_is_used_without_local_data(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[tuple[str, str]] = []

    def fake_hub(name: str, split: str) -> list[dict]:
        calls.append((name, split))
        return [{"question": "q", "answer": "#### 1"}]

    monkeypatch.delenv(D.DATA_DIR_ENV, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(D, "_hub_reachable", lambda timeout=3.0: True)
    monkeypatch.setattr(D, "_load_hub", fake_hub)
    D.clear_cache()
    try:
        assert D.load_split("gsm8k", "train")[0]["question"] == "q"
        # A local directory that lacks the file falls back to the Hub too.
        assert D.load_split("gsm8k", "test", data_dir=tmp_path)[0]["answer"] == "#### 1"
        assert calls == [("gsm8k", "train"), ("gsm8k", "test")]
    finally:
        D.clear_cache()


# ------------------------------------------------------------------- tasks


def test_gsm8k_task(data_dir: Path) -> None:
    task = GSM8KTask("test", data_dir=data_dir)
    assert isinstance(task, Task) and task.name == "gsm8k" and len(task) == 1319
    assert "\\boxed{}" in task.instructions
    p = task.get(0)
    assert isinstance(p, Problem) and p.id == "gsm8k/test/0" and p.answer == "18"
    assert "#### 18" in p.meta["solution"]
    r = task.grade(r"... so she makes $\boxed{18}$ dollars.", p)
    assert isinstance(r, GradeResult) and r.correct and r.format_ok
    assert not task.grade("she makes 19 dollars", p).correct
    with pytest.raises(IndexError):
        task.get(1319)
    with pytest.raises(ValueError):
        GSM8KTask("test500", data_dir=data_dir)
    # Comma-grouped gold answers are normalized.
    assert all("," not in task.get(i).answer for i in range(len(task)))


def test_math_task_splits_and_gold(data_dir: Path) -> None:
    t500 = MathTask("test500", data_dir=data_dir)
    assert len(t500) == 500 and t500.name == "math" and "\\boxed{}" in t500.instructions
    p = t500.get(0)
    assert p.answer == r"\left( 3, \frac{\pi}{2} \right)" and p.meta["level"] == 2
    assert p.meta["unique_id"] == "test/precalculus/807.json" and p.id == "math/test500/0"
    assert t500.grade(r"The answer is $\boxed{(3,\pi/2)}$.", p).correct
    test = MathTask("test", data_dir=data_dir)
    assert len(test) == 5000
    assert test.get(0).answer  # the solution's boxed answer
    train = MathTask("train", data_dir=data_dir)
    assert len(train) == 7498  # two rows with an empty \boxed{} are dropped
    assert all(train.get(i).answer for i in range(0, len(train), 97))


def test_math_task_filters(data_dir: Path) -> None:
    task = MathTask("test", data_dir=data_dir, levels=[5], subjects=["Counting & Probability"])
    assert 0 < len(task) < 5000
    assert all(task.get(i).meta["level"] == 5 for i in range(len(task)))
    assert {task.get(i).meta["subject"] for i in range(len(task))} == {"Counting & Probability"}
    same = MathTask("test", data_dir=data_dir, levels=(5,), subjects=["counting_and_probability"])
    assert len(same) == len(task) and same.get(3) == task.get(3)
    # ids point into the unfiltered split
    k = int(task.get(0).id.rsplit("/", 1)[1])
    assert MathTask("test", data_dir=data_dir).get(k) == task.get(0)
    with pytest.raises(ValueError):
        MathTask("test", data_dir=data_dir, levels=[9])
    with pytest.raises(ValueError):
        MathTask("valid", data_dir=data_dir)


def test_tasks_pickle_small_and_construct_cheaply(data_dir: Path) -> None:
    for task in (
        GSM8KTask("train", data_dir=data_dir),
        MathTask("train", data_dir=data_dir, levels=[1, 2]),
    ):
        blob = pickle.dumps(task)
        assert len(blob) < 2_000  # settings only, never the data set
        clone = pickle.loads(blob)
        assert len(clone) == len(task) and clone.get(5) == task.get(5)
        assert clone.grade(clone.get(5).meta["solution"], clone.get(5)).correct
    # a new task shares the loaded rows (construction reads no file)
    for cls in (MathTask, GSM8KTask):
        assert cls("train", data_dir=data_dir).rows is cls("train", data_dir=data_dir).rows


def test_tasks_read_env_var(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(D.DATA_DIR_ENV, str(data_dir))
    assert len(GSM8KTask("test")) == 1319 and len(MathTask("test500")) == 500


# ---------------------------------------------------------------- malformed files
def _write(root: Path, name: str, split: str, data: bytes) -> Path:
    (root / name).mkdir(exist_ok=True)
    path = root / name / f"{split}.jsonl"
    path.write_bytes(data)
    return path


GOOD_GSM8K = b'{"question": "1+1?", "answer": "2\\n#### 2"}\n'


@pytest.mark.parametrize(("data", "where", "advice"), [
    (b"", "test.jsonl: the file has no rows", "one JSON object per line"),
    (b"\n  \n", "test.jsonl: the file has no rows", "'answer', 'question'"),
    (GOOD_GSM8K + b'{"question": "caf\xe9", "answer": "#### 1"}\n', "test.jsonl:2: not UTF-8",
     "re-save the file as UTF-8"),
    (GOOD_GSM8K + b"[1, 2]\n", "test.jsonl:2: a JSON list, not an object", "one JSON object per line"),
    (GOOD_GSM8K * 2 + b'{"question": "q"}\n', "test.jsonl:3: missing field(s) ['answer']",
     "every gsm8k row needs ['answer', 'question']"),
    (b'{"question": 7, "answer": "#### 7"}\n', "test.jsonl:1: field 'question' is a int", "str"),
    (GOOD_GSM8K + b'{"question": "q", "answer": "it is 42"}\n',
     "test.jsonl:2: the GSM8K answer has no final '#### <number>'", "end the worked solution"),
    (b'{"question": "q", "answer": "42 ####  "}\n', "test.jsonl:1: the GSM8K answer", "remove the row"),
])
def test_bad_gsm8k_files_name_file_and_line(tmp_path: Path, data: bytes, where: str, advice: str) -> None:
    path = _write(tmp_path, "gsm8k", "test", data)
    with pytest.raises(D.DataFormatError) as err:
        D.load_split("gsm8k", "test", data_dir=tmp_path)
    assert where in str(err.value) and advice in str(err.value) and str(path.parent) in str(err.value)


def test_bad_math_and_mbpp_files_name_file_and_line(tmp_path: Path) -> None:
    _write(tmp_path, "math", "test", b'{"problem": "p", "solution": "\\\\boxed{1}"}\n{"problem": "p"}\n')
    with pytest.raises(D.DataFormatError, match=r"math/test.jsonl:2: missing field\(s\) \['solution'\]"):
        D.load_split("math", "test", data_dir=tmp_path)
    _write(tmp_path, "mbpp", "test", b'{"text": "t", "code": "c", "test_list": "assert f()"}\n')
    with pytest.raises(D.DataFormatError, match=r"mbpp/test.jsonl:1: field 'test_list' is a str, not a list"):
        D.load_mbpp("test", data_dir=tmp_path)


def test_dataset_task_shares_rows_pickling_and_bounds(tmp_path: Path) -> None:
    _write(tmp_path, "gsm8k", "test", GOOD_GSM8K * 3)
    task = GSM8KTask("test", data_dir=tmp_path)
    assert len(task) == 3 and task.get(2).answer == "2"
    state = task.__getstate__()
    assert state["_rows"] is None and task._rows is not None  # the pickle holds no rows
    clone = pickle.loads(pickle.dumps(task))
    assert clone._rows is None and clone.get(1) == task.get(1) and clone.rows is task.rows
    for bad in (-1, 3):
        with pytest.raises(IndexError, match=r"problem index .* out of range \[0, 3\)"):
            task.get(bad)
