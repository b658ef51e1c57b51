"""A launcher's environment -> the job's shape (ftune.plan.cluster), and the compiler's use of it: values mapped
onto the accelerate launch, their sources in the plan, contradictions and missing variables located."""

from __future__ import annotations

import json

import pytest
import yaml

from ftune.errors import RecipeError
from ftune.plan.cluster import detect, first_host
from ftune.plan.compile import compile_plan
from ftune.recipe import load_recipe
from ftune.tiny import CONFIG

PET = {"PET_NNODES": "4", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": "3", "PET_MASTER_ADDR": "trainjob-node-0-0",
       "PET_MASTER_PORT": "29400"}
TORCHRUN = {"WORLD_SIZE": "3", "RANK": "2", "GROUP_RANK": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "job7"}
SLURM = {"SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "3", "SLURM_NODEID": "1", "SLURM_NTASKS": "3",
         "SLURM_JOB_NODELIST": "gpu[07-09]"}
MPI = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
       "MASTER_ADDR": "head", "MASTER_PORT": "29501"}


def _recipe(tmp_path, distributed: dict | None = None):
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(CONFIG))  # a tiny Llama the compiler's preflight can build
    data = tmp_path / "train.jsonl"
    data.write_text('{"text": "hello"}\n')
    recipe = {"name": "unit", "model": {"path": str(model)}, "data": {"train": [{"path": str(data)}]},
              "distributed": distributed or {"strategy": "ddp"},
              "train": {"max_steps": 10, "per_device_batch_size": 4},
              "output": {"dir": str(tmp_path / "runs" / "unit")}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return load_recipe(path)


def _error(tmp_path, environ, distributed=None) -> str:
    with pytest.raises(RecipeError) as err:
        compile_plan(_recipe(tmp_path, distributed), environ=environ)
    return err.value.render() if hasattr(err.value, "render") else str(err.value)


def test_no_launcher_no_cluster(tmp_path):
    assert detect({"HOME": "/root"}) == (None, [])
    plan = compile_plan(_recipe(tmp_path), environ={})
    assert plan.cluster is None and plan.world_size == 1


def test_kubeflow_pet_variables_map_onto_the_launch(tmp_path):
    plan = compile_plan(_recipe(tmp_path), environ=PET, gpus=2)
    cfg = plan.launch.accelerate_config
    assert (cfg["num_machines"], cfg["machine_rank"], cfg["num_processes"]) == (4, 3, 8)
    assert (cfg["main_process_ip"], cfg["main_process_port"]) == ("trainjob-node-0-0", 29400)
    assert plan.world_size == 8 and plan.num_processes == 2
    assert plan.cluster.sources == {"distributed.num_machines": "PET_NNODES=4",
                                    "distributed.num_processes": "PET_NPROC_PER_NODE=2",
                                    "distributed.machine_rank": "PET_NODE_RANK=3",
                                    "distributed.main_process_ip": "PET_MASTER_ADDR=trainjob-node-0-0",
                                    "distributed.main_process_port": "PET_MASTER_PORT=29400"}
    # node 3's inputs live beside node 0's in the shared run dir
    assert plan.launch.command[-1].endswith("/runs/unit/nodes/node3/plan.json")


def test_pet_nproc_auto_leaves_the_recipe_to_decide(tmp_path):
    plan = compile_plan(_recipe(tmp_path, {"strategy": "ddp", "num_processes": "auto"}),
                        environ={**PET, "PET_NPROC_PER_NODE": "auto"}, gpus=4)
    assert plan.num_processes == 4 and plan.world_size == 16
    assert "distributed.num_processes" not in plan.cluster.sources


def test_torchrun_variables_one_ftune_per_node(tmp_path):
    plan = compile_plan(_recipe(tmp_path), environ=TORCHRUN)
    cfg = plan.launch.accelerate_config
    assert (cfg["num_machines"], cfg["machine_rank"], cfg["main_process_ip"]) == (3, 2, "10.0.0.5")
    # torchrun's agent holds MASTER_PORT for its own store: ftune's launch takes the next one, and says so
    assert cfg["main_process_port"] == 29501
    assert "torchrun's own rendezvous store" in plan.cluster.sources["distributed.main_process_port"]
    assert plan.cluster.launcher == "torchrun"


def test_slurm_variables_and_the_first_host(tmp_path):
    plan = compile_plan(_recipe(tmp_path), environ=SLURM)
    cfg = plan.launch.accelerate_config
    assert (cfg["num_machines"], cfg["machine_rank"], cfg["main_process_ip"], cfg["main_process_port"]) == \
        (3, 1, "gpu07", 29500)
    assert plan.cluster.sources["distributed.main_process_ip"] == "SLURM_JOB_NODELIST=gpu[07-09] (first host: gpu07)"
    # MASTER_ADDR / MASTER_PORT exported by the job script win over the node list
    plan = compile_plan(_recipe(tmp_path), environ={**SLURM, "MASTER_ADDR": "ib-gpu07", "MASTER_PORT": "31000"})
    assert (plan.launch.accelerate_config["main_process_ip"], plan.launch.accelerate_config["main_process_port"]) \
        == ("ib-gpu07", 31000)


def test_mpi_variables(tmp_path):
    cfg = compile_plan(_recipe(tmp_path), environ=MPI).launch.accelerate_config
    assert (cfg["num_machines"], cfg["machine_rank"], cfg["main_process_ip"], cfg["main_process_port"]) == \
        (2, 1, "head", 29501)


@pytest.mark.parametrize(("nodelist", "host"), [("gpu[07-09,12],cpu1", "gpu07"), ("node1,node2", "node1"),
                                                ("a[3]", "a3"), ("rack1-n[001-004]-ib", "rack1-n001-ib")])
def test_first_host_of_a_slurm_node_list(nodelist, host):
    assert first_host(nodelist) == host


def test_the_innermost_launcher_wins():
    # torchrun started inside a Kubeflow pod: its own variables describe what it started
    found, problems = detect({**PET, **TORCHRUN})
    assert problems == [] and found.launcher == "torchrun"
    found, _ = detect({**SLURM, **MPI})
    assert found.launcher == "mpi"


@pytest.mark.parametrize(("environ", "key", "words"), [
    ({**PET, "PET_NNODES": ""}, "distributed.num_machines", "PET_NNODES is missing or empty"),
    ({k: v for k, v in PET.items() if k != "PET_MASTER_ADDR"}, "distributed.main_process_ip",
     "PET_MASTER_ADDR is missing"),
    ({**PET, "PET_NODE_RANK": "4"}, "distributed.machine_rank", "PET_NODE_RANK=4 is out of range for PET_NNODES=4"),
    ({**PET, "PET_NNODES": "two"}, "distributed.num_machines", "PET_NNODES='two' is not a whole number"),
    ({**PET, "PET_NNODES": "1:4"}, "distributed.num_machines", "elastic node range"),
    ({k: v for k, v in SLURM.items() if k != "SLURM_NODEID"} | {"SLURM_NNODES": "3"}, "distributed.machine_rank",
     "SLURM_NODEID is missing"),
    ({**SLURM, "SLURM_NTASKS": "6"}, "distributed.num_processes", "SLURM_NTASKS=6 tasks for SLURM_JOB_NUM_NODES=3"),
    ({**TORCHRUN, "LOCAL_WORLD_SIZE": "8"}, "distributed.num_processes", "started 8 copies of `ftune run`"),
    ({**TORCHRUN, "RANK": "5", "GROUP_RANK": "5"}, "distributed.machine_rank", "RANK=5 is out of range"),
    ({k: v for k, v in MPI.items() if k != "MASTER_ADDR"}, "distributed.main_process_ip", "MASTER_ADDR is missing"),
])
def test_missing_or_contradictory_variables_are_located(tmp_path, environ, key, words):
    found, problems = detect(environ)
    assert found is None
    assert [p.path for p in problems] == [key]
    assert words in problems[0].message
    text = _error(tmp_path, environ)
    assert words in text and "recipe.yaml:" in text  # located in the recipe file


def test_recipe_contradicting_the_environment_is_located(tmp_path):
    text = _error(tmp_path, PET, {"strategy": "ddp", "num_machines": 2, "main_process_ip": "x"})
    assert "recipe.yaml:" in text
    assert "the recipe says distributed.num_machines: 2" in text and "PET_NNODES=4" in text


def test_an_agreeing_recipe_key_is_fine(tmp_path):
    plan = compile_plan(_recipe(tmp_path, {"strategy": "ddp", "num_processes": 2}), environ=PET, gpus=2)
    assert plan.world_size == 8


def test_a_multi_node_environment_needs_a_strategy(tmp_path):
    text = _error(tmp_path, PET, {"strategy": "none"})
    assert "distributed.strategy is 'none'" in text and "4 node(s)" in text


def test_one_node_environment_keeps_a_free_local_port(tmp_path):
    one = {"SLURM_JOB_ID": "5", "SLURM_JOB_NUM_NODES": "1", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "n1"}
    cfg = compile_plan(_recipe(tmp_path), environ=one).launch.accelerate_config
    assert cfg["num_machines"] == 1 and cfg["main_process_port"] == 0 and "main_process_ip" not in cfg


def test_nodes_share_one_run_dir(tmp_path):
    """Node 1 never refuses the run node 0 owns (its own lock and inputs in nodes/node1/), in either start order;
    two copies of one node are refused."""
    from ftune.errors import FtuneError
    from ftune.launch.lock import claim
    from ftune.rundir import RunDir

    run = RunDir(tmp_path / "shared" / "run")
    node1, created1 = claim(run, "run", 1)  # node 1 first: it creates the folder and the marker
    assert created1 is None and run.is_owned()
    assert (run.root / "nodes" / "node1" / ".ftune.lock").is_file() and not run.lock.exists()
    node0, _ = claim(run, "run", 0)
    assert run.lock.is_file()
    with pytest.raises(FtuneError) as err:
        claim(run, "run", 1)
    assert err.value.exit_code == 5 and "(node 1)" in err.value.message
    node0.release()
    node1.release()


def test_a_two_machine_recipe_runs_under_kubeflow(tmp_path, monkeypatch, capsys):
    """The launcher's environment is applied before the rules read the job's shape: `num_machines: 2` without
    main_process_ip plans under PET_NNODES=2 (PET_MASTER_ADDR gives the address); PET_NNODES=4 contradicts the
    recipe, and the refusal names both the key and the variable."""
    from ftune.cli.main import main

    two = {"strategy": "ddp", "num_processes": 1, "num_machines": 2}
    loaded = _recipe(tmp_path, two)  # loads: the address is the launcher's to give
    pod = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "trainjob-node-0-0",
           "PET_MASTER_PORT": "29400"}
    for name, value in pod.items():
        monkeypatch.setenv(name, value)
    assert main(["run", str(tmp_path / "recipe.yaml"), "--dry-run", "--format", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["world_size"] == 2 and plan["launch"]["accelerate_config"]["main_process_ip"] == "trainjob-node-0-0"
    assert plan["launch"]["accelerate_config"]["machine_rank"] == 1
    with pytest.raises(RecipeError) as err:
        compile_plan(loaded, environ={**pod, "PET_NNODES": "4"})
    [problem] = err.value.problems
    text = (tmp_path / "recipe.yaml").read_text().splitlines()
    assert problem.path == "distributed.num_machines" and text[problem.location.line - 1].strip() == "num_machines: 2"
    assert problem.message.startswith("the recipe says distributed.num_machines: 2, but the Kubeflow Trainer (PET_*) "
                                      "environment says PET_NNODES=4")
    for name in pod:  # outside the launcher the recipe's shape is its own: it needs machine 0's address
        monkeypatch.delenv(name)
    assert main(["run", str(tmp_path / "recipe.yaml"), "--dry-run"]) == 1
    assert "a 2-machine job needs the address of machine 0" in capsys.readouterr().err
