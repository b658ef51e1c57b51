"""`output.report_to`: every tracker transformers reports to, by its name; an unknown name is refused by the loader
(did you mean), a tracker whose package is missing by the compiler, located, with the line that installs it."""

from __future__ import annotations

import importlib.util
import textwrap

import pytest

from ftune.errors import RecipeError
from ftune.recipe import load_recipe
from ftune.recipe.trackers import TRACKERS

BASE = """\
name: t
model: {path: models/tiny, dtype: float32}
data: {train: [{path: train.jsonl}]}
train: {max_steps: 10}
"""


def write(tmp_path, body: str):
    path = tmp_path / "r.yaml"
    path.write_text(textwrap.dedent(body))
    return path


def test_the_trackers_are_the_ones_transformers_reports_to():
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    assert set(TRACKERS) <= set(INTEGRATION_TO_CALLBACK)
    # kubeflow registers itself inside a Kubeflow TrainJob: not a tracker a recipe names
    assert set(INTEGRATION_TO_CALLBACK) - set(TRACKERS) == {"kubeflow"}


def test_an_unknown_tracker_is_refused_with_the_name_it_meant(tmp_path):
    with pytest.raises(RecipeError) as err:
        load_recipe(write(tmp_path, BASE + "output: {report_to: [tensorboard, mlfow]}\n"))
    [p] = err.value.problems
    assert (p.path, p.location.line) == ("output.report_to[1]", 5)
    assert "did you mean 'mlflow'" in p.message and "swanlab" in p.hint


@pytest.mark.parametrize("name,install", [("swanlab", "pip install swanlab"),
                                          ("azure_ml", "pip install azureml-core"),
                                          ("mlflow", "pip install mlflow-skinny")])
def test_a_tracker_without_its_package_is_refused_before_launch_with_the_install_line(monkeypatch, tmp_path, name,
                                                                                       install):
    from ftune.plan.compile import compile_plan

    real = importlib.util.find_spec
    gone = set(TRACKERS[name].modules)
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda mod, *a: None if mod in gone or mod.split(".")[0] in gone else real(mod, *a))
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, BASE + f"output:\n  report_to: [tensorboard, {name}]\n")
    with pytest.raises(RecipeError) as err:
        compile_plan(load_recipe(path), check_inputs=False)
    [p] = [p for p in err.value.problems if p.path.startswith("output")]
    assert (p.path, p.location.line) == ("output.report_to[1]", 6)
    assert p.message == f"report_to '{name}' needs {', '.join(TRACKERS[name].modules)}, which is not installed"
    assert p.hint.startswith(install)
