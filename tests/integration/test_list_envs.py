"""``marft list-envs`` lists third-party ids: ``--import MODULE`` and ``marft_envs`` entry points."""

from __future__ import annotations

import pytest

import marft_envs
from marft_algos.cli import main

PLUGIN = '''
import marft_envs
marft_envs.register("{id}", lambda **kw: marft_envs.make("echo-duo-v0", **kw), description="a plugin env")
'''


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for env_id in ("uxmod/Echo-v0", "uxplug/Echo-v0"):
        marft_envs.registry.pop(env_id, None)


def test_import_lists_the_modules_envs(plugin_dir, capsys):
    (plugin_dir / "ux_listed_envs.py").write_text(PLUGIN.format(id="uxmod/Echo-v0"))
    assert main(["list-envs"]) == 0
    assert "uxmod/Echo-v0" not in capsys.readouterr().out
    assert main(["list-envs", "--import", "ux_listed_envs"]) == 0
    out = capsys.readouterr().out
    assert "uxmod/Echo-v0" in out and "a plugin env" in out and "echo-duo-v0" in out


def test_import_of_a_missing_module_is_one_line_exit_2(capsys):
    assert main(["list-envs", "--import", "no_such_module_ux"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--import no_such_module_ux" in err


def test_entry_points_register_installed_envs(plugin_dir, capsys):
    (plugin_dir / "ux_plugin_envs.py").write_text(PLUGIN.format(id="uxplug/Echo-v0"))
    dist = plugin_dir / "ux_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ux-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[marft_envs]\nux = ux_plugin_envs\n")
    assert "ux" in marft_envs.load_plugins(force=True)
    assert marft_envs.spec("uxplug/Echo-v0").description == "a plugin env"
    assert main(["list-envs"]) == 0
    assert "uxplug/Echo-v0" in capsys.readouterr().out
