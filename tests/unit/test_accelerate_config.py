"""The accelerate config and launch command compiled from `distributed:`; the distributed rules."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ftune.errors import FtuneError
from ftune.plan import accelerate as ac
from ftune.recipe.rules import check
from ftune.recipe.rules import distributed as rules
from ftune.recipe.schema import Recipe

REPO = Path(__file__).resolve().parents[2]


def recipe(distributed: dict | None = None, **top) -> Recipe:
    data = {"name": "r", "model": {"path": "m"}, "data": {"train": [{"path": "d.jsonl"}]}}
    if distributed is not None:
        data["distributed"] = distributed
    data.update(top)
    return Recipe.model_validate(data)


def build(r: Recipe, device: str = "cpu", n: int = 2, recipe_dir: Path = Path(".")):
    from ftune.plan.compile import mixed_precision

    return ac.build(r, device=device, num_processes=n, recipe_dir=recipe_dir, mixed_precision=mixed_precision(r))


# ------------------------------------------------------------------------------ strategies
def test_none_is_one_process_on_cpu():
    cfg, notes = build(recipe(), n=1)
    assert cfg["distributed_type"] == "NO"
    assert cfg["num_processes"] == 1 and cfg["num_machines"] == 1 and cfg["use_cpu"] is True
    assert cfg["main_process_port"] == 0  # a free port: concurrent runs on one machine don't collide
    assert "fsdp_config" not in cfg and "deepspeed_config" not in cfg
    assert notes == []


def test_ddp_on_cpu_launches_as_multi_gpu_and_says_why():
    cfg, notes = build(recipe({"strategy": "ddp", "num_processes": 2}))
    assert cfg["distributed_type"] == "MULTI_GPU"  # MULTI_CPU would silently start one process
    assert cfg["num_processes"] == 2 and cfg["use_cpu"] is True
    assert any("MULTI_CPU" in n and "one process" in n for n in notes)


def test_ddp_on_gpu_has_no_cpu_note():
    cfg, notes = build(recipe({"strategy": "ddp", "num_processes": 8}), device="cuda", n=8)
    assert cfg["distributed_type"] == "MULTI_GPU" and cfg["num_processes"] == 8 and cfg["use_cpu"] is False
    assert notes == []


def test_fsdp_v2_defaults():
    cfg, _ = build(recipe({"strategy": "fsdp", "num_processes": 2}))
    assert cfg["distributed_type"] == "FSDP"
    assert cfg["fsdp_config"] == {
        "fsdp_version": 2,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_offload_params": False,
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_cpu_ram_efficient_loading": False,
        "fsdp_activation_checkpointing": False,
        "fsdp_sync_module_states": False,
        "fsdp_reshard_after_forward": True,
    }


def test_fsdp_options_map_to_accelerate_keys():
    fsdp = {"version": 1, "sharding_strategy": "hybrid_shard", "auto_wrap_policy": "transformer",
            "transformer_layer_cls": ["LlamaDecoderLayer", "LlamaMLP"], "cpu_offload": True,
            "state_dict_type": "full", "backward_prefetch": "none", "forward_prefetch": True,
            "activation_checkpointing": True, "mixed_precision": "bf16"}
    cfg, _ = build(recipe({"strategy": "fsdp", "fsdp": fsdp}), device="cuda", n=8)
    f = cfg["fsdp_config"]
    assert f["fsdp_version"] == 1
    assert f["fsdp_reshard_after_forward"] == "HYBRID_SHARD"
    assert f["fsdp_transformer_layer_cls_to_wrap"] == "LlamaDecoderLayer,LlamaMLP"
    assert f["fsdp_offload_params"] is True and f["fsdp_state_dict_type"] == "FULL_STATE_DICT"
    assert f["fsdp_backward_prefetch"] == "NO_PREFETCH" and f["fsdp_forward_prefetch"] is True
    assert f["fsdp_activation_checkpointing"] is True and f["fsdp_use_orig_params"] is True
    assert cfg["mixed_precision"] == "bf16"  # fsdp.mixed_precision overrides train.mixed_precision


def test_fsdp_size_policy_and_shard_grad_op_on_v2():
    cfg, _ = build(recipe({"strategy": "fsdp", "fsdp": {"auto_wrap_policy": "size", "min_num_params": 1000,
                                                        "sharding_strategy": "shard_grad_op"}}))
    f = cfg["fsdp_config"]
    assert f["fsdp_auto_wrap_policy"] == "SIZE_BASED_WRAP" and f["fsdp_min_num_params"] == 1000
    assert f["fsdp_reshard_after_forward"] is False


def test_sync_module_states_is_forced_off_on_cpu_only():
    r = recipe({"strategy": "fsdp", "fsdp": {"version": 1, "sync_module_states": True}})
    cfg, notes = build(r)
    assert cfg["fsdp_config"]["fsdp_sync_module_states"] is False
    assert any("sync_module_states forced off" in n for n in notes)
    cfg, _ = build(r, device="cuda")
    assert cfg["fsdp_config"]["fsdp_sync_module_states"] is True


def test_deepspeed_generated_and_file(tmp_path):
    cfg, _ = build(recipe({"strategy": "deepspeed", "deepspeed": {"stage": 3, "offload_params": True,
                                                                   "offload_optimizer": True}},
                          train={"gradient_accumulation_steps": 4, "max_grad_norm": 0.5}), device="cuda", n=8)
    assert cfg["distributed_type"] == "DEEPSPEED"
    assert cfg["deepspeed_config"] == {"zero_stage": 3, "offload_optimizer_device": "cpu",
                                       "offload_param_device": "cpu", "zero3_init_flag": True,
                                       "zero3_save_16bit_model": True, "gradient_accumulation_steps": 4,
                                       "gradient_clipping": 0.5}
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    cfg, _ = build(recipe({"strategy": "deepspeed", "deepspeed": {"config": "ds.json"}}), device="cuda",
                   recipe_dir=tmp_path)
    assert cfg["deepspeed_config"] == {"deepspeed_config_file": str(tmp_path / "ds.json"), "zero3_init_flag": True}


# ------------------------------------------------------------------------------ multi-node
@pytest.mark.parametrize("rank", [0, 1])
def test_two_node_job_config_and_command(rank, tmp_path):
    r = recipe({"strategy": "fsdp", "num_processes": 8, "num_machines": 2, "machine_rank": rank,
                "main_process_ip": "10.0.0.1", "main_process_port": 29555, "rdzv_backend": "c10d",
                "same_network": False})
    cfg, _ = build(r, device="cuda", n=8)
    assert cfg["num_processes"] == 16  # accelerate counts the whole job
    assert (cfg["num_machines"], cfg["machine_rank"]) == (2, rank)
    assert (cfg["main_process_ip"], cfg["main_process_port"]) == ("10.0.0.1", 29555)
    assert cfg["rdzv_backend"] == "c10d" and cfg["same_network"] is False
    cmd = ac.launch_command(tmp_path / "accelerate.yaml", tmp_path / "plan.json", python="/py")
    assert cmd == ["/py", "-m", "accelerate.commands.launch", "--quiet", "--config_file", str(tmp_path / "accelerate.yaml"),
                   "-m", "ftune.worker", str(tmp_path / "plan.json")]


def test_multi_node_default_port():
    cfg, _ = build(recipe({"strategy": "ddp", "num_machines": 2, "main_process_ip": "h0"}), device="cuda", n=4)
    assert cfg["main_process_port"] == 29500 and cfg["num_processes"] == 8


def test_accelerate_reads_our_two_node_config_as_we_mean(tmp_path):
    """accelerate's own loader turns the written file into the torchrun layout (node rank, nproc, master)."""
    from accelerate.commands.config.config_args import load_config_from_file

    for rank in (0, 1):
        r = recipe({"strategy": "ddp", "num_processes": 4, "num_machines": 2, "machine_rank": rank,
                    "main_process_ip": "10.0.0.1"})
        cfg, _ = build(r, device="cuda", n=4)
        path = tmp_path / f"acc{rank}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        loaded = load_config_from_file(str(path))
        assert str(loaded.distributed_type).endswith("MULTI_GPU")
        assert (loaded.num_processes, loaded.num_machines, loaded.machine_rank) == (8, 2, rank)
        assert loaded.main_process_ip == "10.0.0.1" and loaded.main_process_port == 29500


# ------------------------------------------------------------------------------ team file merge
def test_team_file_merge_recipe_explicit_keys_win(tmp_path):
    team = {"compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_GPU", "num_processes": 4,
            "main_process_port": 31000, "dynamo_config": {"dynamo_backend": "INDUCTOR"},
            "fsdp_config": {"fsdp_state_dict_type": "FULL_STATE_DICT", "fsdp_offload_params": True,
                            "fsdp_activation_checkpointing": True}}
    (tmp_path / "team.yaml").write_text(yaml.safe_dump(team))
    r = recipe({"strategy": "fsdp", "num_processes": 2, "accelerate_config": "team.yaml",
                "fsdp": {"state_dict_type": "sharded"}})
    cfg, notes = build(r, recipe_dir=tmp_path)
    assert cfg["distributed_type"] == "FSDP" and cfg["num_processes"] == 2  # structural: the recipe's
    assert cfg["dynamo_config"] == {"dynamo_backend": "INDUCTOR"}  # a key ftune doesn't set: kept
    assert cfg["main_process_port"] == 31000  # the recipe left it unset: the team's value
    f = cfg["fsdp_config"]
    assert f["fsdp_state_dict_type"] == "SHARDED_STATE_DICT"  # explicit in the recipe: the recipe wins
    assert f["fsdp_offload_params"] is True  # recipe default: the team's value
    text = "\n".join(notes)
    assert "distributed_type: team file has 'MULTI_GPU', recipe (distributed.distributed_type) sets 'FSDP'" in text
    assert "fsdp_config.fsdp_state_dict_type: team file has 'FULL_STATE_DICT'" in text and "recipe wins" in text
    assert "fsdp_config.fsdp_offload_params: taken from the team file (True)" in text
    assert "main_process_port: taken from the team file (31000)" in text


def test_team_file_fsdp_block_dropped_for_ddp(tmp_path):
    (tmp_path / "team.yaml").write_text(yaml.safe_dump({"distributed_type": "FSDP", "fsdp_config": {"x": 1}}))
    cfg, notes = build(recipe({"strategy": "ddp", "accelerate_config": "team.yaml"}), recipe_dir=tmp_path)
    assert "fsdp_config" not in cfg and cfg["distributed_type"] == "MULTI_GPU"
    assert any("fsdp_config dropped" in n for n in notes)


def test_team_file_missing_or_bad(tmp_path):
    with pytest.raises(FtuneError, match="accelerate config not found"):
        build(recipe({"strategy": "ddp", "accelerate_config": "nope.yaml"}), recipe_dir=tmp_path)
    (tmp_path / "bad.yaml").write_text("- a list\n")
    with pytest.raises(FtuneError, match="is not a mapping"):
        build(recipe({"strategy": "ddp", "accelerate_config": "bad.yaml"}), recipe_dir=tmp_path)


# ------------------------------------------------------------------------------ processes
def test_resolve_num_processes_without_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    from ftune.recipe.schema import DistributedSection

    assert ac.resolve_num_processes(DistributedSection(strategy="ddp", num_processes="auto")) == (1, "cpu")
    assert ac.resolve_num_processes(DistributedSection(strategy="ddp", num_processes=3)) == (3, "cpu")
    assert ac.resolve_num_processes(DistributedSection()) == (1, "cpu")


def test_module_is_light():
    code = "import sys, ftune.plan.accelerate, ftune.recipe.rules.distributed; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


# ------------------------------------------------------------------------------ rules
def paths(r: Recipe) -> dict[str, str]:
    """The loader's rules and the job-shape rules (`rules.JOB_RULES`, in the checks' recipe tier)."""
    return {v.path: v.message for v in [*check(r), *(p for rule in rules.JOB_RULES for p in rule(r))]}


@pytest.mark.parametrize(
    ("distributed", "top", "path", "text"),
    [
        ({"strategy": "ddp", "num_machines": 2}, {}, "distributed.main_process_ip", "2-machine job needs"),
        ({"strategy": "ddp", "num_machines": 2, "machine_rank": 2, "main_process_ip": "h"}, {},
         "distributed.machine_rank", "machine_rank 2 is out of range for num_machines 2"),
        ({"strategy": "none", "num_processes": 4}, {}, "distributed.num_processes", "strategy is 'none'"),
        ({"strategy": "fsdp"}, {"quantization": {"bits": 8}}, "quantization.bits", "8-bit quantization"),
        ({"strategy": "fsdp", "fsdp": {"sharding_strategy": "hybrid_shard"}}, {},
         "distributed.fsdp.sharding_strategy", "needs FSDP version 1"),
        ({"strategy": "fsdp", "fsdp": {"auto_wrap_policy": "size", "transformer_layer_cls": ["X"]}}, {},
         "distributed.fsdp.transformer_layer_cls", "only used by auto_wrap_policy 'transformer'"),
        ({"strategy": "deepspeed", "deepspeed": {"stage": 2, "offload_params": True}}, {},
         "distributed.deepspeed.offload_params", "needs ZeRO stage 3"),
        ({"strategy": "deepspeed", "deepspeed": {"config": "ds.json", "stage": 3}}, {},
         "distributed.deepspeed.stage", "used as is"),
    ],
)
def test_rules(distributed, top, path, text):
    found = paths(recipe(distributed, **top))
    assert path in found, found
    assert text in found[path]


def test_valid_recipes_pass_rules():
    for d in ({"strategy": "ddp", "num_processes": 2},
              {"strategy": "fsdp", "fsdp": {"version": 1}},  # full fine-tuning below: v1 allowed
              {"strategy": "ddp", "num_machines": 2, "machine_rank": 1, "main_process_ip": "h"}):
        assert not [k for k in paths(recipe(d, peft={"method": "full"})) if k.startswith("distributed")]


def test_environment_checks(monkeypatch, tmp_path):
    from ftune.plan.checks import environment

    def found(r, device, n):
        return {p.path: p.message for p in environment.devices(r, device, n)}

    monkeypatch.setattr(environment.importlib.util, "find_spec", lambda name: None)
    assert "needs the deepspeed package" in found(recipe({"strategy": "deepspeed"}), "cpu", 2)["distributed.strategy"]
    monkeypatch.setattr(ac, "visible_gpus", lambda: 2)
    assert (found(recipe({"strategy": "ddp", "num_processes": 4}), "cuda", 4)["distributed.num_processes"]
            == "num_processes is 4 but this machine sees 2 GPU(s)")
    got = found(recipe({"strategy": "fsdp", "fsdp": {"cpu_ram_efficient_loading": True},
                        "accelerate_config": "x.yaml"}), "cpu", 2)
    assert "needs GPUs" in got["distributed.fsdp.cpu_ram_efficient_loading"]
    from ftune.plan.checks.paths import missing_configs  # the files tier (ftune.plan.checks), not this machine's

    [missing] = missing_configs(recipe({"strategy": "fsdp", "accelerate_config": "x.yaml"}), tmp_path)
    assert missing.path == "distributed.accelerate_config" and "accelerate config not found" in missing.message


# ------------------------------------------------------------------------------ compiled TrainingArguments
def trainer(r: Recipe, device: str, n: int) -> dict:
    from ftune.plan.compile import mixed_precision
    from ftune.plan.trainer import training_arguments
    from ftune.rundir import RunDir

    cfg, _ = build(r, device=device, n=n)
    return training_arguments(r, run=RunDir(Path("/tmp/run")), device=device, world_size=n,
                              mixed_precision=mixed_precision(r), accelerate_config=cfg)


def test_trainer_kwargs_ddp_fsdp_deepspeed():
    one = trainer(recipe(), "cpu", 1)
    assert (one["use_cpu"], one["bf16"], one["fp16"]) == (True, False, False) and "ddp_backend" not in one
    ddp = trainer(recipe({"strategy": "ddp", "num_processes": 2}), "cpu", 2)
    assert ddp["ddp_backend"] == "gloo" and ddp["use_cpu"] is True and "fsdp" not in ddp
    fsdp = trainer(recipe({"strategy": "fsdp", "fsdp": {
        "transformer_layer_cls": ["LlamaDecoderLayer"], "activation_checkpointing": True}},
        train={"max_steps": 1, "gradient_checkpointing": True}), "cpu", 2)
    assert fsdp["fsdp"] is True and fsdp["activation_checkpointing"] is False  # FSDP-native AC instead
    assert fsdp["fsdp_config"]["version"] == 2
    assert fsdp["fsdp_config"]["transformer_layer_cls_to_wrap"] == ["LlamaDecoderLayer"]
    assert fsdp["fsdp_config"]["auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    assert fsdp["fsdp_config"]["sync_module_states"] is False and fsdp["fsdp_config"]["cpu_offload"] is False
    ds = trainer(recipe({"strategy": "deepspeed", "deepspeed": {"stage": 3, "offload_optimizer": True}}), "cuda", 8)
    zero = ds["deepspeed"]["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_optimizer"]["device"] == "cpu"
    assert zero["stage3_gather_16bit_weights_on_model_save"] is True
    assert ds["deepspeed"]["train_micro_batch_size_per_gpu"] == "auto" and "ddp_backend" not in ds
    assert ds["use_cpu"] is False


def test_one_precision_for_accelerate_and_the_trainer():
    r = recipe({"strategy": "fsdp", "fsdp": {"mixed_precision": "bf16"}}, train={"max_steps": 1})
    cfg, _ = build(r)
    kwargs = trainer(r, "cpu", 2)
    assert cfg["mixed_precision"] == "bf16" and kwargs["bf16"] is True and kwargs["fp16"] is False


def test_fsdp_trainer_kwargs_make_valid_training_arguments(tmp_path):
    from transformers import TrainingArguments

    for version in (1, 2):
        kwargs = trainer(recipe({"strategy": "fsdp", "fsdp": {"version": version}}, peft={"method": "full"}),
                         "cpu", 2)
        kwargs.pop("ddp_backend")  # a backend makes TrainingArguments join a process group; none here
        args = TrainingArguments(**(kwargs | {"output_dir": str(tmp_path)}))
        plugin = args.fsdp_plugin_args
        assert plugin["fsdp_version"] == version
        assert plugin["auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
        assert plugin["state_dict_type"] == "SHARDED_STATE_DICT"
        if version == 1:
            assert plugin["sync_module_states"] is False and plugin["use_orig_params"] is True
            assert plugin["reshard_after_forward"] == "full_shard"


def test_wrap_classes_checked_against_the_model(tiny_model_dir):
    from ftune.models.meta import build_meta_model
    from ftune.plan.checks.preflight import wrap_class_problems

    def problems(fsdp):
        r = recipe({"strategy": "fsdp", "fsdp": fsdp}, model={"path": str(tiny_model_dir)})
        return [(p.path, p.message, p.hint) for p in wrap_class_problems(r, build_meta_model(r))]

    assert problems({}) == []  # the model's _no_split_modules (LlamaDecoderLayer)
    assert problems({"transformer_layer_cls": ["LlamaDecoderLayer"]}) == []
    [(path, message, hint)] = problems({"transformer_layer_cls": ["LlamaDecoderLayer", "GPT2Block"]})
    assert path == "distributed.fsdp.transformer_layer_cls"
    assert message == "wrap class GPT2Block not found in LlamaForCausalLM"
    assert "LlamaDecoderLayer" in hint
    assert problems({"auto_wrap_policy": "size"}) == []


def test_compile_refuses_what_this_machine_cannot_run(monkeypatch, tmp_path):
    from ftune.errors import RecipeError
    from ftune.plan.checks import environment
    from ftune.plan.compile import compile_plan
    from ftune.recipe import load_recipe

    real = environment.importlib.util.find_spec
    monkeypatch.setattr(environment.importlib.util, "find_spec", lambda name: None if name == "deepspeed" else real(name))
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "model": {"path": "m"}, "data": {"train": [{"path": "d.jsonl"}]},
                                    "train": {"max_steps": 1},
                                    "distributed": {"strategy": "deepspeed", "accelerate_config": "team.yaml"}}))
    with pytest.raises(RecipeError) as err:
        compile_plan(load_recipe(path), check_inputs=False)
    text = err.value.render()
    assert "r.yaml:6:3: error: distributed.strategy: strategy 'deepspeed' needs the deepspeed package" in text
    assert "pip install 'ftune[deepspeed]'" in text
    assert "distributed.accelerate_config: accelerate config not found" in text
    assert "2 errors" in text


@pytest.mark.parametrize("rank", [0, 1])
def test_dry_run_prints_two_node_config_and_command(rank, tmp_path, tiny_model_dir, text_data_file, capsys,
                                                    monkeypatch):
    from ftune.cli.main import main

    monkeypatch.setenv("COLUMNS", "400")
    r = {"name": "two-nodes", "model": {"path": str(tiny_model_dir)},
         "data": {"train": [{"path": str(text_data_file)}]}, "peft": {"method": "full"}, "train": {"max_steps": 2},
         "distributed": {"strategy": "fsdp", "num_processes": 2, "num_machines": 2, "main_process_ip": "10.0.0.1"},
         "output": {"dir": str(tmp_path / "run")}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(r))
    assert main(["run", str(path), f"distributed.machine_rank={rank}", "--dry-run"]) == 0
    out = capsys.readouterr().out
    plan_text, _, launch = out.partition("launch:")
    plan = json.loads(plan_text)
    cfg = plan["launch"]["accelerate_config"]
    assert (cfg["distributed_type"], cfg["num_processes"], cfg["num_machines"]) == ("FSDP", 4, 2)
    assert (cfg["machine_rank"], cfg["main_process_ip"], cfg["main_process_port"]) == (rank, "10.0.0.1", 29500)
    assert plan["world_size"] == 4
    run_dir = tmp_path / "run"
    inputs = run_dir if rank == 0 else run_dir / "nodes" / "node1"  # node 1 beside node 0 in the shared run dir
    assert launch.split() == [sys.executable, "-m", "accelerate.commands.launch", "--quiet", "--config_file",
                              str(inputs / "accelerate.yaml"), "-m", "ftune.worker", str(inputs / "plan.json")]
    assert not run_dir.exists()  # a dry run writes nothing


def test_cpu_fsdp_shim_only_for_fsdp_without_cuda(monkeypatch):
    import torch

    from ftune.worker import distributed as stage

    applied, mesh = [], []
    monkeypatch.setattr(stage, "apply_cpu_fsdp_shim", lambda: applied.append(True))
    monkeypatch.setattr(stage, "apply_cpu_parallelism_shim", lambda: mesh.append(True))

    class P:
        def __init__(self, strategy, device, parallelism=None):
            self.recipe, self.device, self.parallelism = recipe({"strategy": strategy}), device, parallelism

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    stage.prepare(P("ddp", "cpu"))
    stage.prepare(P("fsdp", "cuda"))
    assert applied == []
    stage.prepare(P("fsdp", "cpu"))
    assert applied == [True] and mesh == []
    from ftune.plan.parallelism import Parallel

    stage.prepare(P("ddp", "cpu", Parallel(tp=2)))  # ParallelismConfig accepts CPU processes: only then
    stage.prepare(P("ddp", "cuda", Parallel(tp=2)))
    assert mesh == [True] and applied == [True]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    stage.prepare(P("fsdp", "cpu"))
    stage.prepare(P("ddp", "cpu", Parallel(tp=2)))
    assert applied == [True] and mesh == [True]


def test_fsdp_checkpointing_with_an_adapter_saves_full_adapter_checkpoints():
    ac_lora = recipe({"strategy": "fsdp", "fsdp": {"activation_checkpointing": True}})
    cfg, notes = build(ac_lora)
    assert cfg["fsdp_config"]["fsdp_state_dict_type"] == "FULL_STATE_DICT"
    assert any("sharded adapter checkpoint would hold no tensors" in n for n in notes)
    cfg, notes = build(recipe({"strategy": "fsdp", "fsdp": {"activation_checkpointing": True}},
                              peft={"method": "full"}))
    assert cfg["fsdp_config"]["fsdp_state_dict_type"] == "SHARDED_STATE_DICT" and notes[:-1] == []
