"""Cluster variables are validated like recipe keys (issue #37): ports 1-65535, counts from 1 to their bound
(`MAX_NODES`, `MAX_PROCESSES_PER_NODE`), addresses host names or IPs, Slurm node lists parsed or refused, each
problem naming the variable at its recipe key. A hypothesis fuzz draws every variable of every launcher: `detect`
never raises, and whatever it accepts is in range. `data.num_proc` is capped at the cores, with a warning."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftune.plan.cluster import MAX_PORT, detect, first_host, is_address
from ftune.recipe.schema import MAX_NODES, MAX_PROCESSES_PER_NODE
from tests.unit.test_cluster_env import MPI, PET, SLURM, TORCHRUN, _recipe

EXAMPLES = int(os.environ.get("FTUNE_FUZZ_EXAMPLES", "60"))


def _problems(env: dict) -> dict[str, str]:
    cluster, problems = detect(env)
    assert cluster is None or not problems
    return {p.path: p.message for p in problems}


@pytest.mark.parametrize(("env", "key", "says"), [
    (PET | {"PET_MASTER_PORT": "99999"}, "distributed.main_process_port",
     "PET_MASTER_PORT='99999' is not a whole number from 1 to 65535"),
    (PET | {"PET_NPROC_PER_NODE": "-3"}, "distributed.num_processes",
     "PET_NPROC_PER_NODE='-3' is not a whole number from 1 to 1024"),
    (PET | {"PET_NNODES": "1e20"}, "distributed.num_machines", "PET_NNODES='1e20' is not a whole number"),
    (PET | {"PET_NNODES": "99999999999999999999"}, "distributed.num_machines",
     "PET_NNODES='99999999999999999999' is not a whole number from 1 to 65536"),
    (PET | {"PET_NNODES": "1_000"}, "distributed.num_machines", "PET_NNODES='1_000' is not a whole number"),
    (PET | {"PET_NODE_RANK": "٣"}, "distributed.machine_rank", "PET_NODE_RANK='٣' is not a whole number"),
    (PET | {"PET_MASTER_ADDR": "h;rm -rf /"}, "distributed.main_process_ip",
     "PET_MASTER_ADDR='h;rm -rf /' is not a host name or an IP address"),
    (TORCHRUN | {"MASTER_PORT": "65535"}, "distributed.main_process_port",  # torchrun's own store takes it: +1
     "MASTER_PORT='65535' is not a whole number from 1 to 65534"),
    (MPI | {"MASTER_ADDR": "$(reboot)"}, "distributed.main_process_ip", "MASTER_ADDR='$(reboot)' is not a host name"),
    (SLURM | {"SLURM_JOB_NODELIST": "gpu[07-"}, "distributed.main_process_ip",
     "SLURM_JOB_NODELIST='gpu[07-' is not a Slurm host list"),
    (SLURM | {"SLURM_JOB_NODELIST": "gpu[09-07]"}, "distributed.main_process_ip", "is not a Slurm host list"),
    (SLURM | {"SLURM_JOB_NODELIST": "a b"}, "distributed.main_process_ip", "is not a Slurm host list"),
    (SLURM | {"MASTER_ADDR": "x\ny"}, "distributed.main_process_ip", "MASTER_ADDR='x\\ny' is not a host name"),
])
def test_out_of_range_variables_are_refused_naming_the_variable(env, key, says):
    problems = _problems(env)
    assert key in problems and says in problems[key], problems


@pytest.mark.parametrize(("nodelist", "first"), [("gpu[07-09,12],cpu1", "gpu07"), ("node1", "node1"),
                                                 ("rack[1-2]-n[01-04]", "rack1-n01"), ("a.cluster,b", "a.cluster")])
def test_host_lists_parse(nodelist, first):
    assert first_host(nodelist) == first


@pytest.mark.parametrize("address", ["10.0.0.5", "fe80::1", "[fe80::1]", "trainjob-node-0-0", "gpu07.cluster.local",
                                     "node_1"])
def test_addresses(address):
    assert is_address(address)
    assert not is_address(address + " ;id")


VARIABLES = sorted({*PET, *TORCHRUN, *SLURM, *MPI, "SLURM_NTASKS_PER_NODE", "SLURM_NODELIST"})
VALUES = st.sampled_from(["0", "1", "2", "65535", "65536", "99999999999999999999", "-3", "1e20", "auto", "",
                          " 7 ", "h;rm -rf /", "gpu[07-", "gpu[07-09]", "10.0.0.1", "x\ny", "٣", "1_0", "+4"]) \
    | st.text(max_size=12)


@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(env=st.dictionaries(st.sampled_from(VARIABLES), VALUES, max_size=8))
def test_fuzzed_cluster_variables_are_refused_or_in_range(env):
    cluster, problems = detect(env)
    assert all(p.path.startswith("distributed.") and p.message for p in problems)
    if cluster is None:
        return
    assert 1 <= cluster.num_machines <= MAX_NODES and 0 <= cluster.machine_rank < cluster.num_machines
    assert cluster.num_processes is None or 1 <= cluster.num_processes <= MAX_PROCESSES_PER_NODE
    assert cluster.main_process_port is None or 1 <= cluster.main_process_port <= MAX_PORT
    assert cluster.main_process_ip is None or is_address(cluster.main_process_ip)


def test_a_huge_node_count_in_the_recipe_is_refused(tmp_path):
    from ftune.errors import RecipeError

    with pytest.raises(RecipeError) as err:
        _recipe(tmp_path, {"strategy": "ddp", "num_machines": 99999999999999999999, "num_processes": 5000})
    assert sorted(p.path for p in err.value.problems) == ["distributed.num_machines", "distributed.num_processes"]


def test_num_proc_is_capped_at_the_cores_with_a_warning(tmp_path, monkeypatch):
    from ftune.plan import compile as compile_module
    from ftune.plan.compile import compile_plan

    monkeypatch.setattr(compile_module, "usable_cores", lambda: 2)
    from ftune.recipe import load_recipe

    (tmp_path / "r.yaml").write_text("name: np\nmodel: {path: m}\ndata: {train: [{path: d.jsonl}], num_proc: 1000}\n"
                                     f"train: {{max_steps: 1}}\noutput: {{dir: {tmp_path / 'run'}}}\n")
    loaded = load_recipe(tmp_path / "r.yaml")  # a model folder that isn't there: no preflight (torch) to run
    plan = compile_plan(loaded, check_inputs=False)
    assert plan.recipe.data.num_proc == 2
    (warning,) = [w for w in plan.warnings if "num_proc" in w]
    assert "warning: data.num_proc: 1000 is more than this machine's 2 usable CPU cores" in warning
    assert compile_plan(loaded, check_inputs=False, gpus=8).recipe.data.num_proc == 1000  # planned for elsewhere
