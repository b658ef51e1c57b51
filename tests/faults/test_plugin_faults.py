"""Plugins can't subvert the tool: an entry point that exits, raises or isn't a Plugin is a located error naming its
distribution and entry point (exit 1, never the plugin's own status), and no registry lets a plugin shadow a
built-in name (formats, callbacks, methods: through `ftune.plugins.merged`, which a new registry uses too)."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from ftune import plugins
from ftune.errors import FtuneError

PLUGIN_CODE = {
    "exits": "import sys\nsys.exit(0)\n",
    "raises": "raise RuntimeError('boom')\n",
    "not_a_plugin": "PLUGIN = 42\n",
    "shadow_chat": "from ftune.plugins import Plugin, FormatPlugin\n"
                   "PLUGIN = Plugin(formats={'chat': FormatPlugin(fields=('x',), encode='m:f')})\n",
    "shadow_lora": "from ftune.plugins import Plugin\nPLUGIN = Plugin(methods={'lora': 'x'})\n",
    "good": "from ftune.plugins import Plugin, CallbackPlugin\nPLUGIN = Plugin(callbacks={'c': CallbackPlugin('m:f')})\n",
}


def _install(root: Path, name: str) -> Path:
    """A distribution `ftune-<name>` with one entry point, as pip would install it (module + dist-info)."""
    (root / f"plug_{name}.py").write_text(PLUGIN_CODE[name])
    info = root / f"ftune_{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: ftune-{name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[ftune.plugins]\n{name} = plug_{name}:PLUGIN\n")
    return root


@pytest.fixture
def plugin_path(tmp_path, monkeypatch):
    """Install plugins into a folder on sys.path; installed() sees only those (the cache is reset around)."""
    def install(*names: str) -> None:
        for name in names:
            _install(tmp_path, name)
        eps = [ep for ep in metadata.entry_points(group=plugins.GROUP) if ep.dist and ep.dist.name.startswith("ftune-")
               and ep.name in names]
        monkeypatch.setattr(metadata, "entry_points", lambda group=None: eps if group == plugins.GROUP else [])
        plugins.installed.cache_clear()

    monkeypatch.syspath_prepend(str(tmp_path))
    plugins.installed.cache_clear()
    yield install
    for name in PLUGIN_CODE:
        sys.modules.pop(f"plug_{name}", None)
    plugins.installed.cache_clear()


@pytest.mark.parametrize(("name", "says"), [
    ("exits", "failed to load: called sys.exit(0)"),
    ("raises", "failed to load: RuntimeError: boom"),
    ("not_a_plugin", "is not an ftune.plugins.Plugin"),
])
def test_a_broken_entry_point_is_a_located_error_naming_it(plugin_path, name, says):
    plugin_path(name)
    with pytest.raises(FtuneError) as info:
        plugins.installed()
    err = info.value
    assert says in err.message and f"plugin entry point {name} = plug_{name}:PLUGIN (ftune-{name} 1.0)" in err.message
    assert err.exit_code == 1 and err.location is not None and err.location.file.endswith(f"plug_{name}.py")


@pytest.mark.parametrize(("name", "kind", "builtin"), [
    ("shadow_chat", "formats", ("text", "chat")),
    ("shadow_lora", "methods", {"lora": "ftune.methods.lora"}),
    ("good", "callbacks", ("c",)),  # a registry with a built-in `c`: the same guard, by construction
])
def test_no_registry_lets_a_plugin_shadow_a_built_in_name(plugin_path, name, kind, builtin):
    plugin_path(name)
    taken = next(iter(plugins.installed().by_kind[kind]))
    with pytest.raises(FtuneError, match=f"plugin ftune-{name} 1.0 registers {plugins.KINDS[kind]} '{taken}', "
                                         "which is built in"):
        plugins.merged(kind, builtin)
    assert plugins.merged(kind, ()) == plugins.installed().by_kind[kind]  # no clash: the plugin's names


def test_plugin_code_that_exits_where_it_runs_is_an_error(plugin_path):
    plugin_path("exits")  # a callback factory or format encoder whose module exits when the worker imports it
    with pytest.raises(FtuneError, match=r"plugin code plug_exits:PLUGIN failed to load: called sys.exit\(0\)"):
        plugins.load_object("plug_exits:PLUGIN")


def test_validate_is_no_false_green_when_a_plugin_exits_on_import(tmp_path):
    """The finding: `ftune validate invalid.yaml` exited 0 with no output when a plugin called sys.exit(0)."""
    _install(tmp_path, "exits")
    (tmp_path / "bad.yaml").write_text("name: x\nmodel: {path: m}\ntrain: {learning_rate: -1}\n")
    proc = subprocess.run([sys.executable, "-m", "ftune.cli.main", "validate", str(tmp_path / "bad.yaml")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert proc.returncode == 1, proc.stderr
    assert "plugin entry point exits = plug_exits:PLUGIN (ftune-exits 1.0) failed to load: called sys.exit(0)" \
        in proc.stderr and "Traceback" not in proc.stderr
