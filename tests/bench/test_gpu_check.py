"""benchmarks/gpu_check.py on a CPU: the table, the skip rows, the arguments, isolation, and a
``--cpu-dry-run`` that runs the training, hf-engine, FSDP2 (2 gloo ranks) and TRL (without
vllm) paths on tiny-random (issue 31).

What needs CUDA (bf16, the vllm engine, TRL with use_vllm, rollout workers on a second GPU) is
not run here; those rows must say why they were skipped.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
import torch

from tests.helpers.bench import load_benchmark

REPO = Path(__file__).resolve().parents[2]
# a hung child fails its row (--timeout) before pytest's own 600 s limit ends the test
SMALL = ["--steps", "2", "--warmup", "1", "--num-envs", "2", "--group-size", "2", "--max-new-tokens", "4", "--batch", "4", "--timeout", "500"]
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU behaviour (a GPU machine runs the real checks)")


@pytest.fixture(scope="module")
def gc() -> ModuleType:
    return load_benchmark("gpu_check")


def _rows(out: Path) -> dict[str, dict]:
    return {r["path"]: r for r in json.loads((out / "gpu_check.json").read_text())["rows"]}


# ------------------------------------------------------------------------------ the table
def test_table_has_every_column_and_a_dash_where_nothing_was_measured(gc: ModuleType) -> None:
    rows = [gc.row("engine hf", "ok", "batch 4", 123.456, 7.0, 1.5, batch=4),
            gc.row("fsdp2", "skip", "needs 2 | more GPUs\nreally")]
    lines = gc.markdown(rows).splitlines()
    assert lines[0] == "| path | status | tokens/s | samples/s | peak GPU memory GiB | reason / detail |"
    assert lines[2] == "| engine hf | ok | 123 | 7 | 1.5 | batch 4 |"
    assert lines[3] == "| fsdp2 | skip | - | - | - | needs 2 / more GPUs really |"  # one row, one line
    assert rows[0]["batch"] == 4  # details reach the JSON


def test_a_row_status_is_ok_skip_or_fail(gc: ModuleType) -> None:
    with pytest.raises(ValueError, match="ok, skip or fail"):
        gc.row("x", "passed")


# -------------------------------------------------------------------------- skip reasons
def test_without_cuda_every_check_is_a_skip_that_says_why(gc: ModuleType) -> None:
    for check in gc.CHECKS:
        why = gc.skip_reason(check, cuda_devices=0, dry_run=False, has=lambda m: True, async_workers=lambda: True)
        assert why and "no CUDA" in why and "--cpu-dry-run" in why


def test_async_workers_are_not_available_without_the_setting(gc: ModuleType) -> None:
    for cuda, dry in ((0, False), (2, False), (0, True)):
        why = gc.skip_reason("async", cuda_devices=cuda, dry_run=dry, async_workers=lambda: False)
        assert why and why.startswith("not available") and "rollout_workers" in why
    assert gc.skip_reason("async", cuda_devices=2, dry_run=False, async_workers=lambda: True) is None


def test_one_gpu_skips_what_needs_two(gc: ModuleType) -> None:
    assert "second GPU" in gc.skip_reason("async", cuda_devices=1, dry_run=False, async_workers=lambda: True)
    assert "2 or more GPUs" in gc.skip_reason("fsdp", cuda_devices=1, dry_run=False)
    assert gc.skip_reason("fsdp", cuda_devices=2, dry_run=False) is None
    assert gc.skip_reason("train", cuda_devices=1, dry_run=False) is None
    assert gc.skip_reason("engines", cuda_devices=1, dry_run=False) is None  # vllm missing: its own row says so


def test_missing_packages_are_named_with_the_install_command(gc: ModuleType) -> None:
    assert "pip install 'marft[bench]'" in gc.skip_reason("trl", cuda_devices=1, dry_run=False, has=lambda m: False)
    assert "pip install 'marft[bench]'" in gc.skip_reason("trl", cuda_devices=0, dry_run=True, has=lambda m: False)
    # without vllm TRL generates with transformers: the peer of marft's hf engine, not a skip
    assert gc.skip_reason("trl", cuda_devices=1, dry_run=False, has=lambda m: m == "trl") is None
    assert gc.skip_reason("trl", cuda_devices=1, dry_run=False, has=lambda m: True) is None


def test_the_dry_run_runs_every_check_on_the_cpu(gc: ModuleType) -> None:
    runs = {c for c in gc.CHECKS if gc.skip_reason(c, cuda_devices=0, dry_run=True, has=lambda m: m == "trl",
                                                   async_workers=lambda: True) is None}
    assert runs == set(gc.CHECKS)  # vllm is not needed: its parts are skipped inside the checks


@pytest.mark.parametrize(("agree", "swapped", "control", "status", "says"), [
    (1.0, 0.1, 0.1, "ok", "greedy agreement with hf 100%"),
    (0.4, 0.1, 0.1, "fail", "does not reproduce the hf engine"),
    (0.9, 0.9, 0.2, "fail", "does not serve each role its own adapter"),  # as close to the wrong adapters as to the right
    (1.0, 1.0, 1.0, "ok", "roles not told apart; raise --adapter-scale"),
])
def test_the_vllm_verdict_needs_each_role_served_its_own_adapter(gc: ModuleType, agree: float, swapped: float,
                                                                 control: float, status: str, says: str) -> None:
    got, why = gc._vllm_verdict(agree, swapped, control)
    assert got == status and says in why


# ----------------------------------------------------------------------------- arguments
def test_arguments_and_their_defaults(gc: ModuleType) -> None:
    a = gc.parse_args([])
    assert a.model == "smollm2-135m" and a.checks == list(gc.CHECKS) and not a.cpu_dry_run
    assert gc.parse_args(["--cpu-dry-run"]).model == "tiny-random"
    assert gc.parse_args(["--cpu-dry-run", "--model", "HuggingFaceTB/SmolLM2-135M-Instruct"]).model.endswith("Instruct")
    assert gc.parse_args(["--checks", "trl, engines"]).checks == ["trl", "engines"]


@pytest.mark.parametrize(("argv", "says"), [
    (["--checks", "train,warp"], "unknown check(s) warp; choose from train, engines, fsdp, async, trl"),
    (["--checks", ","], "unknown check(s) (none given)"),
    (["--steps", "0"], "--steps must be >= 1"),
    (["--num-envs", "6", "--group-size", "4"], "must be a multiple of --group-size"),
    (["--gpu-memory-utilization", "1.5"], "must be in (0, 1)"),
    (["--warmup", "-1"], "--warmup must be >= 0"),
])
def test_bad_arguments_say_what_to_give(gc: ModuleType, argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        gc.parse_args(argv)
    assert says in capsys.readouterr().err


def test_warm_up_steps_are_left_out_of_the_timing_but_the_last_step_always_counts(gc: ModuleType) -> None:
    assert gc.parse_args([]).warmup == 2 and gc.parse_args([]).steps == 5
    assert gc._timed([1, 2, 3, 4, 5], 2) == [3, 4, 5]
    assert gc._timed([1, 2], 2) == [2] and gc._timed([1], 0) == [1]


def test_the_error_line_of_a_failed_child_is_the_reason(gc: ModuleType) -> None:
    text = "marft train (rank 0): error: num_envs=2 ... set num_envs to a multiple of 4\nTraceback\n  File x\nChildFailedError:\n  tail"
    assert gc._last_line(text) == "marft train (rank 0): error: num_envs=2 ... set num_envs to a multiple of 4"
    assert gc._last_line("Traceback\n  File x\ntorch.OutOfMemoryError: CUDA out of memory\n  note") == \
        "torch.OutOfMemoryError: CUDA out of memory"
    assert gc._last_line("a\nValueError: bad model\n") == "ValueError: bad model"
    assert gc._last_line("") == "(no output)"


# ------------------------------------------------------------------------ whole runs, CPU
@no_cuda
def test_without_cuda_a_plain_run_is_all_skip_rows(gc: ModuleType, tmp_path: Path) -> None:
    assert gc.main(["--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "gpu_check.json").read_text())["rows"]
    assert len(rows) == len(gc.CHECKS) and {r["status"] for r in rows} == {"skip"}
    saved = json.loads((tmp_path / "gpu_check.json").read_text())
    assert saved["devices"] == [] and saved["baseline_gpu_gib"] is None
    assert "| skip |" in (tmp_path / "gpu_check.md").read_text()


@no_cuda
def test_cpu_dry_run_exercises_training_and_the_hf_engine(gc: ModuleType, tmp_path: Path) -> None:
    assert gc.main(["--cpu-dry-run", "--checks", "train,engines", *SMALL, "--out", str(tmp_path)]) == 0
    rows = _rows(tmp_path)
    for path in ("train grpo fp32", "train marft-action fp32", "engine hf"):
        r = rows[path]
        assert r["status"] == "ok" and r["tokens_s"] > 0 and r["samples_s"] > 0, r
        assert r["peak_gpu_gib"] is None  # no GPU: not measured, not 0
    assert rows["train grpo fp32"]["timed_steps"] == 1  # --warmup 1: the first step is untimed
    assert 0.0 <= rows["engine hf"]["roles_swapped_agreement"] <= 1.0  # the control the vllm verdict reads
    assert rows["engine vllm (per-role LoRA)"]["status"] == "skip"
    assert "needs CUDA" in rows["engine vllm (per-role LoRA)"]["reason"]
    saved = json.loads((tmp_path / "gpu_check.json").read_text())
    assert saved["args"]["cpu_dry_run"] and saved["devices"] == [] and saved["versions"]["torch"]


@no_cuda
def test_cpu_dry_run_exercises_the_trl_peer_without_vllm(gc: ModuleType, tmp_path: Path) -> None:
    pytest.importorskip("trl")
    assert gc.main(["--cpu-dry-run", "--checks", "trl", *SMALL, "--out", str(tmp_path)]) == 0
    (r,) = _rows(tmp_path).values()
    assert r["path"] == "TRL GRPOTrainer (dry run: CPU, no vllm)" and r["status"] == "ok", r
    assert r["tokens_s"] > 0 and r["samples_s"] > 0 and r["peak_gpu_gib"] is None


@no_cuda
@pytest.mark.slow  # ~60 s; FSDP2 on 2 gloo ranks runs in CI in tests/algos/test_distributed.py
def test_cpu_dry_run_fsdp2_on_two_gloo_ranks(gc: ModuleType, tmp_path: Path) -> None:
    assert gc.main(["--cpu-dry-run", "--checks", "fsdp", *SMALL, "--out", str(tmp_path)]) == 0
    (r,) = _rows(tmp_path).values()
    assert r["status"] == "ok" and r["world_size"] == 2 and r["tokens_s"] > 0, r
    assert r["num_envs"] == 4  # rounded up to whole groups on every rank


@no_cuda
def test_one_failing_check_does_not_stop_the_others(gc: ModuleType, tmp_path: Path) -> None:
    """A bad model fails both checks, each with its own reason, and the run still writes its table."""
    missing = tmp_path / "no-such-model"
    assert gc.main(["--cpu-dry-run", "--checks", "train,engines", *SMALL, "--model", str(missing),
                    "--out", str(tmp_path / "out")]) == 1
    rows = json.loads((tmp_path / "out" / "gpu_check.json").read_text())["rows"]
    assert [r["status"] for r in rows] == ["fail", "fail", "fail"]  # grpo, marft-action, engines
    assert all("no-such-model" in r["reason"] and "does not exist" in r["reason"] for r in rows), rows


@no_cuda
def test_a_check_past_its_time_limit_is_a_fail_row(gc: ModuleType, tmp_path: Path) -> None:
    assert gc.main(["--cpu-dry-run", "--checks", "engines,async", *SMALL, "--timeout", "0.5", "--out", str(tmp_path)]) == 1
    rows = json.loads((tmp_path / "gpu_check.json").read_text())["rows"]
    assert rows[0]["status"] == "fail" and "timed out after" in rows[0]["reason"]
    assert len(rows) == 2 and rows[1]["path"].startswith("async")  # the next check still got its row


def test_gpu_memory_is_none_without_cuda(gc: ModuleType) -> None:
    if torch.cuda.is_available():
        pytest.skip("CPU behaviour")
    with gc.GpuMemory() as mem:
        assert mem.mark() is None
