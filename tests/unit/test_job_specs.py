"""`ftune launch-script kubernetes|skypilot`: the specs validate against the real schemas from PyPI (Kubeflow
Trainer's API models, SkyPilot's task schema), carry the job's shape and secrets by reference only, and bad input
is refused (located where it comes from the recipe)."""

from __future__ import annotations

import functools
import importlib.metadata

import pytest
import yaml

from ftune.cli.main import main
from ftune.launch.jobs import kubernetes, skypilot
from ftune.launch.jobs.common import Request

RECIPE = """name: My_Run
model: {path: m, hub_token: "${env:HF_TOKEN}"}
data: {train: [{path: d.jsonl}, {path: /data/extra.jsonl}]}
distributed: {strategy: fsdp, num_processes: 4}
train: {epochs: 1}
"""


@pytest.fixture
def recipe(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_TOKEN", "hf_secretvalue123")
    (tmp_path / "r.yaml").write_text(RECIPE)
    return tmp_path / "r.yaml"


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["launch-script", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def validate_trainjob(job: dict) -> None:
    """Kubeflow Trainer's generated API models (kubeflow-trainer-api): strict types, and a round trip that keeps
    every key (the models drop unknown keys silently, so a dropped key is a key the schema doesn't have)."""
    from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob

    model = TrainerV1alpha1TrainJob.from_dict(job)
    assert model.to_dict() == job


@functools.cache
def sky_schemas() -> tuple[dict, dict]:
    """SkyPilot's task and resources JSON schemas, from the installed `skypilot` package's own functions
    (`sky/utils/schemas.py`). The full package pulls a server stack (sqlalchemy, fastapi, uvicorn, click<8.2, which
    would downgrade this environment's click), so it is installed without dependencies (Makefile) and only its
    schema module is imported: `sky/__init__.py` (the client SDK) is not run, `sky.skylet.autostop_lib` (imported
    for the autostop enum, a key the spec doesn't use) is a stub, and the task's `config:` block (built from the
    server's config schema; the spec writes no `config`) is any object. Everything else is SkyPilot's schema."""
    import enum
    import importlib.util
    import os
    import sys
    import types

    spec = importlib.util.find_spec("sky")
    root = os.path.dirname(spec.origin)
    saved = {k: v for k, v in sys.modules.items() if k == "sky" or k.startswith("sky.")}
    for name, folder in (("sky", root), ("sky.skylet", f"{root}/skylet"), ("sky.utils", f"{root}/utils")):
        module = types.ModuleType(name)
        module.__path__ = [folder]
        sys.modules[name] = module
    sys.modules["sky"].__version__ = importlib.metadata.version("skypilot")

    class AutostopWaitFor(enum.Enum):
        NONE = "none"

        @classmethod
        def supported_modes(cls):
            return [m.value for m in cls]

    sys.modules["sky.skylet.autostop_lib"] = types.SimpleNamespace(AutostopWaitFor=AutostopWaitFor)
    try:
        from sky.utils import schemas

        schemas._task_config_schema = lambda: {"type": "object"}
        return schemas.get_task_schema(), schemas.get_resources_schema()
    finally:
        for name in [k for k in sys.modules if k == "sky" or k.startswith("sky.")]:
            del sys.modules[name]
        sys.modules.update(saved)


def validate_sky_task(task: dict) -> None:
    """The task against SkyPilot's task schema, its `resources` against SkyPilot's resources schema (as
    `sky.Task.from_yaml_config` checks them)."""
    import jsonschema

    task_schema, resources_schema = sky_schemas()
    jsonschema.validate(task, task_schema)
    jsonschema.validate(task.get("resources", {}), resources_schema)


# ----------------------------------------------------------------------------------------------- kubernetes
def test_trainjob_validates_and_has_the_job_shape(recipe, capsys, tmp_path):
    code, _, err = cli(capsys, "kubernetes", "r.yaml", "--nodes", "2", "--gpus-per-node", "8", "--image",
                       "ghcr.io/acme/ftune:1.0", "--pvc", "team-vol", "-o", "job.yaml", "train.epochs=2")
    assert code == 0 and "kubectl apply -f job.yaml" in err
    text = (tmp_path / "job.yaml").read_text()
    job = yaml.safe_load(text)
    validate_trainjob(job)
    assert (job["apiVersion"], job["kind"], job["metadata"]["name"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob",
                                                                         "my-run")
    spec = job["spec"]
    assert spec["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
                                  "name": "torch-distributed"}
    t = spec["trainer"]
    assert (t["image"], t["numNodes"], t["numProcPerNode"]) == ("ghcr.io/acme/ftune:1.0", 2, 8)
    assert t["resourcesPerNode"] == {"limits": {"nvidia.com/gpu": "8"}}
    assert t["command"][-5:] == ["ftune", "run", "r.yaml", "train.epochs=2", "distributed.num_processes=8"]
    assert "cd /workspace" in t["command"][2]  # the project folder on the volume
    # the secret by reference, never its value
    assert t["env"] == [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "ftune-secrets",
                                                                              "key": "HF_TOKEN"}}}]
    assert "hf_secretvalue123" not in text
    pod = spec["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    pod = pod["template"]["spec"]["template"]["spec"]
    assert pod["volumes"] == [{"name": "ftune-work", "persistentVolumeClaim": {"claimName": "team-vol"}}]
    assert pod["containers"][0]["volumeMounts"] == [{"name": "ftune-work", "mountPath": "/workspace"}]
    assert pod["terminationGracePeriodSeconds"] == 120  # SIGTERM -> each worker saves a checkpoint of its step


def test_trainjob_without_a_volume_still_validates(recipe):
    job = kubernetes.trainjob(Request("kubernetes", "r.yaml", nodes=1, image="img"))
    validate_trainjob(job)
    assert job["spec"]["trainer"]["command"][:2] == ["ftune", "run"]  # ftune is PID 1: SIGTERM reaches it
    pod = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    assert pod["template"]["spec"]["template"]["spec"] == {"terminationGracePeriodSeconds": 120}


def test_the_schema_check_catches_a_wrong_spec(recipe):
    """The validation used above fails on a key the API doesn't have and on a wrong type (it can fail)."""
    job = kubernetes.trainjob(Request("kubernetes", "r.yaml", nodes=2, image="img"))
    job["spec"]["trainer"]["numNode"] = 2
    with pytest.raises(AssertionError):
        validate_trainjob(job)
    job = kubernetes.trainjob(Request("kubernetes", "r.yaml", nodes=2, image="img"))
    job["spec"]["trainer"]["numNodes"] = "2"
    with pytest.raises(ValueError):
        validate_trainjob(job)


@pytest.mark.parametrize(("argv", "words"), [
    (["--nodes", "0", "--image", "img"], "--nodes must be at least 1 (got 0)"),
    (["--nodes", "-2", "--image", "img"], "--nodes must be at least 1 (got -2)"),
    (["--nodes", "2", "--image", "my image:1"], "--image 'my image:1': it can't be empty or contain whitespace"),
    (["--nodes", "2"], "--image is required"),
    (["--nodes", "2", "--image", "img", "--pvc", ""], "--pvc ''"),
])
def test_bad_arguments_exit_2(recipe, capsys, argv, words):
    code, out, err = cli(capsys, "kubernetes", "r.yaml", *argv)
    assert code == 2 and out == "" and words in err


@pytest.mark.parametrize("target", ["kubernetes", "skypilot"])
def test_a_secret_written_in_the_recipe_is_refused_located(recipe, tmp_path, capsys, target):
    (tmp_path / "lit.yaml").write_text(RECIPE.replace('"${env:HF_TOKEN}"', "hf_writtenhere99"))
    code, out, err = cli(capsys, target, "lit.yaml", "--nodes", "2", "--image", "img", "--accelerators", "H100:4")
    assert code == 1 and out == ""
    assert "lit.yaml:2:" in err and "model.hub_token: a secret is written in the recipe" in err
    assert "hf_writtenhere99" not in err and "${env:HF_TOKEN}" in err
    code, _, err = cli(capsys, target, "r.yaml", "--nodes", "2", "--image", "img", "model.hub_token=hf_onthecli77")
    assert code == 1 and "a secret is written" in err and "hf_onthecli77" not in err


# ----------------------------------------------------------------------------------------------- skypilot
def test_sky_task_validates_and_has_the_job_shape(recipe, capsys, tmp_path):
    code, _, err = cli(capsys, "skypilot", "r.yaml", "--nodes", "2", "--accelerators", "H100:8", "--bucket",
                       "team-runs", "-o", "task.yaml")
    assert code == 0 and "sky launch task.yaml" in err
    text = (tmp_path / "task.yaml").read_text()
    task = yaml.safe_load(text)
    validate_sky_task(task)
    assert (task["name"], task["num_nodes"], task["resources"]) == ("My_Run", 2, {"accelerators": "H100:8"})
    assert task["workdir"] == "."
    assert task["file_mounts"] == {"/data/extra.jsonl": "/data/extra.jsonl",  # absolute data paths are copied
                                   "/ftune-runs": {"name": "team-runs", "mode": "MOUNT"}}
    assert task["secrets"] == {"HF_TOKEN": None} and "hf_secretvalue123" not in text
    assert task["setup"].startswith("pip install ")
    run = task["run"]
    assert "distributed.num_processes=8" in run and "output.dir=/ftune-runs/My_Run" in run
    assert '"distributed.machine_rank=$SKYPILOT_NODE_RANK"' in run
    assert 'MAIN_IP=$(echo "$SKYPILOT_NODE_IPS" | head -n 1)' in run


def test_sky_task_run_gives_each_node_its_rank(recipe, tmp_path):
    """The run command under bash with SkyPilot's variables: each node's ftune gets its rank and node 0's address."""
    import subprocess

    task = skypilot.task(Request("skypilot", "r.yaml", nodes=2, accelerators="A100:2"))
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "ftune").write_text("#!/bin/bash\nprintf '%s\\n' \"$@\"\n")
    (stub / "ftune").chmod(0o755)
    for rank in (0, 1):
        env = {"PATH": f"{stub}:/usr/bin:/bin", "SKYPILOT_NODE_RANK": str(rank), "SKYPILOT_NUM_NODES": "2",
               "SKYPILOT_NODE_IPS": "10.1.0.7\n10.1.0.9"}
        out = subprocess.run(["bash", "-c", task["run"]], env=env, capture_output=True, text=True, check=True).stdout
        argv = out.splitlines()
        assert argv[:3] == ["run", "r.yaml", "distributed.num_processes=2"]
        assert argv[-4:] == ["distributed.num_machines=2", f"distributed.machine_rank={rank}",
                             "distributed.main_process_ip=10.1.0.7", "distributed.main_process_port=29500"]


@pytest.mark.parametrize(("argv", "code", "words"), [
    (["--nodes", "0", "--accelerators", "H100:8"], 2, "--nodes must be at least 1"),
    (["--nodes", "2", "--accelerators", "H100 8"], 2, "--accelerators 'H100 8'"),
    (["--nodes", "2", "--bucket", "my bucket"], 2, "--bucket 'my bucket'"),
])
def test_sky_bad_arguments(recipe, capsys, argv, code, words):
    got, out, err = cli(capsys, "skypilot", "r.yaml", *argv)
    assert got == code and out == "" and words in err


def test_sky_schema_check_can_fail(recipe):
    task = skypilot.task(Request("skypilot", "r.yaml", nodes=2, accelerators="H100:8"))
    task["num_node"] = 2
    with pytest.raises(Exception, match="num_node"):
        validate_sky_task(task)
