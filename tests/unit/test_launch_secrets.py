"""A secret given as an override reaches the workers through their environment, and no file in the run dir."""

from __future__ import annotations

import yaml

from ftune.launch import launcher
from ftune.plan.compile import compile_plan
from ftune.recipe import load_recipe


def test_override_secret_reaches_the_worker_env_only(tmp_path, monkeypatch):
    seen = {}

    class Proc:
        def wait(self, timeout=None):
            return 0

    real = launcher.subprocess.Popen

    def popen(command, *args, **kwargs):
        if "ftune.worker" not in command:  # platform/git probes: the real thing
            return real(command, *args, **kwargs)
        seen.update(kwargs["env"])
        return Proc()

    monkeypatch.setattr(launcher.subprocess, "Popen", popen)
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "model": {"path": "m"}, "data": {"train": [{"path": "d.jsonl"}]},
                                    "train": {"max_steps": 1}, "output": {"dir": str(tmp_path / "run")}}))
    loaded = load_recipe(path, ["model.hub_token=hf_supersecretvalue"])
    plan = compile_plan(loaded, check_inputs=False)
    assert launcher.launch(plan, loaded.resolved_yaml(), secret_env=loaded.secret_env) == 0
    env_var = plan.secrets["model.hub_token"]
    assert seen[env_var] == "hf_supersecretvalue"
    for file in (tmp_path / "run").rglob("*"):
        if file.is_file():
            assert "hf_supersecretvalue" not in file.read_text(errors="replace"), file
