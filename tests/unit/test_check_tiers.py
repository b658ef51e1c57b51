"""The located-refusal corpus through every command that checks a recipe before launch (`ftune.plan.checks`):
`validate` (recipe tier), `validate --check-paths` (+ files and data), `launch-script` (recipe tier on the flags'
job shape), `plan` and `run --dry-run` (every tier). Each refuses exactly the problems of its tiers, in the same
words, located at the same line; the light commands are called in-process here (test_light_imports checks that
they import no torch)."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from ftune.cli.main import main

RECIPE, FILES, INPUTS, ENVIRONMENT, MODEL = "recipe", "files", "inputs", "environment", "model"
COMMANDS = {  # the tiers each command runs (ftune.plan.checks.COMMANDS); INPUTS: the model folder's checks, which
    "validate": {RECIPE},  # `ftune data` runs without (its model.path may be a tokenizer folder)
    "validate --check-paths": {RECIPE, FILES, INPUTS},
    "launch-script": {RECIPE},
    "plan": {RECIPE, FILES, INPUTS, ENVIRONMENT, MODEL},
    "run --dry-run": {RECIPE, FILES, INPUTS, ENVIRONMENT, MODEL},
}

# name: (the recipe's change, [(tier, key, words of the message)])
CORPUS = {
    "one-process": ({"distributed": {"strategy": "none", "num_processes": 2}},
                    [(RECIPE, "distributed.num_processes", "num_processes is 2 but distributed.strategy is 'none'")]),
    "tp-lora": ({"distributed": {"strategy": "ddp", "num_processes": 2, "parallelism": {"tp": 2}},
                 "checkpoint": {"strategy": "no"}},
                [(RECIPE, "peft.method", "lora with tensor parallelism")]),
    "sizes": ({"distributed": {"strategy": "fsdp", "num_processes": 2, "parallelism": {"dp_shard": 4}}},
              [(RECIPE, "distributed.parallelism", "= 4, but the job has 2 process(es)")]),
    "cp-length": ({"distributed": {"strategy": "fsdp", "num_processes": 4, "parallelism": {"dp_shard": 2, "cp": 2}},
                   "data": {"max_seq_length": 30}},
                  [(RECIPE, "data.max_seq_length", "max_seq_length 30 is not a multiple of it"),
                   (ENVIRONMENT, "distributed.parallelism.cp", "context parallelism needs CUDA")]),
    "batch-split": ({"distributed": {"strategy": "ddp", "num_processes": 2}, "train": {"global_batch_size": 3}},
                    [(RECIPE, "train.global_batch_size", "3 rows per step don't split evenly over the job's 2")]),
    "auto-batch": ({"train": {"per_device_batch_size": "auto"}, "data": {"max_seq_length": 64}},
                   [(RECIPE, "train.per_device_batch_size", "per_device_batch_size auto needs the rows per")]),
    "missing-column": ({"data": {"format": "instruction"}},
                       [(FILES, "data.train[0].fields.instruction", "instruction data needs field `instruction`"),
                        (FILES, "data.train[0].fields.output", "instruction data needs field `output`")]),
    "eval-split": ({"data": {"path": "ONE_ROW", "eval": {"split": 0.5}}},
                   [(FILES, "data.eval.split", "0.5 of 1 training row holds out no row for evaluation")]),
    "no-config": ({"model": {"path": "EMPTY"}}, [(INPUTS, "model.path", "has no config.json")]),
    "reward-model": ({"train": {"objective": "grpo", "rl": {"num_generations": 2, "max_completion_length": 16, "rewards": [
        {"name": "reward_model", "path": "MODEL"}]}}, "data": {"format": "prompt"}},
                     [(FILES, "train.rl.rewards[0].path", "is not a sequence classifier")]),
    "distill-layers": ({"model": {"init_from": {"path": "MODEL", "layers": [0, 2]}},
                        "train": {"objective": "distill", "distill": {"teacher": "MODEL"}}},
                       [(FILES, "model.init_from.layers[1]", "layer 2 is out of range")]),
    "fp16-on-cpu": ({"train": {"mixed_precision": "fp16"}},
                    [(ENVIRONMENT, "train.mixed_precision", "fp16 mixed precision needs a GPU")]),
    "targets": ({"peft": {"method": "lora", "r": 4, "target_modules": ["nope_proj"]}},
                [(MODEL, "peft.target_modules", "matches no module of the model")]),
    "qat-fp8-on-cpu": ({"peft": {"method": "full"}, "quantization": {"qat": {"scheme": "fp8"}}},
                       [(ENVIRONMENT, "quantization.qat.scheme", "fp8 needs a GPU with float8 matmuls")]),
    "qat-groups": ({"peft": {"method": "full"}, "quantization": {"qat": {"scheme": "int4-weight", "group_size": 256}}},
                   [(MODEL, "quantization.qat.group_size", "group_size 256 must divide the input size")]),
}


def _write(tmp_path, model_dir, text_file, change: dict):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"say {i}"}) + "\n" for i in range(8)))
    empty = tmp_path / "empty-model"
    empty.mkdir(exist_ok=True)
    one_row = tmp_path / "one.jsonl"
    one_row.write_text(json.dumps({"text": "the only row"}) + "\n")
    data = change.get("data", {})
    source = {"path": str(prompts if data.get("format") == "prompt" else one_row if data.get("path") == "ONE_ROW"
                          else text_file)}
    if "format" in data:
        source["format"] = data["format"]
    recipe = {"name": "refused", "model": {"path": str(model_dir)},
              "data": {"train": [source], **{k: v for k, v in data.items() if k not in ("format", "path")}},
              "peft": {"method": "lora", "r": 4, "target_modules": ["q_proj"]},
              "train": {"max_steps": 1, "per_device_batch_size": 2}, "output": {"dir": str(tmp_path / "runs" / "r")}}
    for section, values in change.items():
        if section != "data":  # peft: replaced (another method has other keys)
            recipe[section] = values if section == "peft" else {**recipe.get(section, {}), **values}
    if recipe["model"]["path"] == "EMPTY":
        recipe["model"]["path"] = str(empty)
    if "init_from" in recipe["model"]:  # a student of the tiny model's layers, distilled from it
        recipe["model"]["init_from"]["path"] = recipe["train"]["distill"]["teacher"] = str(model_dir)
    for reward in recipe["train"].get("rl", {}).get("rewards", []):
        reward["path"] = str(model_dir)  # a causal LM, not a sequence classifier
    path = tmp_path / "recipe.yaml"
    text = yaml.safe_dump(recipe, sort_keys=False)
    path.write_text(text)
    return path, text


def _refusals(command: str, path, capsys) -> tuple[int, list[tuple[str, str, int]]]:
    """(exit code, [(key, message, line)]) of one command on the recipe."""
    if command.startswith("validate"):
        code = main(["validate", str(path), *command.split()[1:], "--format", "json"])
        errors = json.loads(capsys.readouterr().out)["files"][0]["errors"]
        return code, [(e["path"], e["message"], e["line"]) for e in errors]
    if command == "plan":
        code = main(["plan", str(path), "--format", "json"])
        out = capsys.readouterr().out
        errors = json.loads(out).get("errors", []) if code else []
        return code, [(e["path"], e["message"], e["line"]) for e in errors]
    argv = (["launch-script", "slurm", str(path), "--nodes", "1"] if command == "launch-script"
            else ["run", str(path), "--dry-run"])
    code = main(argv)
    err = capsys.readouterr().err
    lines = re.findall(rf"{re.escape(str(path))}:(\d+):\d+: error: (\S+): (.*)", err)
    return code, [(key, message, int(line)) for line, key, message in lines]


@pytest.mark.parametrize("name", CORPUS)
def test_each_command_refuses_exactly_the_problems_of_its_tiers(name, tmp_path, tiny_model_dir, text_data_file,
                                                                 capsys):
    change, expected = CORPUS[name]
    path, text = _write(tmp_path, tiny_model_dir, text_data_file, change)
    words: dict[str, str] = {}  # key -> the message: the same words from every command that refuses it
    lines: dict[str, int] = {}
    for command, tiers in COMMANDS.items():
        code, found = _refusals(command, path, capsys)
        want = [(key, w) for tier, key, w in expected if tier in tiers]
        assert code == (1 if want else 0), (command, found)
        assert sorted(key for key, _, _ in found) == sorted(key for key, _ in want), (command, found)
        for key, w in want:
            [(message, line)] = [(m, n) for k, m, n in found if k == key]
            assert w in message, (command, message)
            assert words.setdefault(key, message) == message, (command, message, words[key])
            assert lines.setdefault(key, line) == line, (command, key)
    assert not (tmp_path / "runs").exists()  # refused (or dry) before a run dir was written


def test_launch_script_checks_the_sizes_against_nodes_times_gpus(tmp_path, tiny_model_dir, text_data_file, capsys):
    """dp_shard 4 on 2 GPUs per node: 2 nodes make the job, 3 nodes can't, and nothing is written then."""
    path, _ = _write(tmp_path, tiny_model_dir, text_data_file, CORPUS["sizes"][0])
    out = tmp_path / "job.sh"
    assert main(["launch-script", "slurm", str(path), "--nodes", "2", "-o", str(out)]) == 0 and out.is_file()
    out.unlink()
    assert main(["launch-script", "slurm", str(path), "--nodes", "3", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "= 4, but the job has 6 process(es) (num_processes 2 x num_machines 3)" in err and not out.exists()


def test_a_vlm_folder_without_a_chat_template_is_a_files_check(tmp_path, vlm_dir):
    """Checked before launch (files tier) in the data stage's words, not found by the worker's data stage; the
    tiny LLaVA's saved processor has a template (no false refusal), a copy stripped of it is refused."""
    import shutil

    from ftune.plan import checks
    from ftune.recipe.schema import Recipe

    def found(folder):
        recipe = Recipe.model_validate({"name": "v", "model": {"path": str(folder), "task": "image-text-to-text"},
                                        "data": {"train": [{"path": "rows.jsonl", "format": "vision-chat"}]},
                                        "train": {"max_steps": 1}})
        job = checks.Job(recipe, tmp_path)
        return [(p.path, p.message) for p in checks.problems(job, checks.COMMANDS["validate --check-paths"])
                if "chat template" in p.message]

    assert found(vlm_dir) == []
    bare = tmp_path / "bare"
    shutil.copytree(vlm_dir, bare)
    for f in bare.glob("chat_template.*"):
        f.unlink()
    for name in ("processor_config.json", "tokenizer_config.json"):
        if (bare / name).is_file():
            config = json.loads((bare / name).read_text())
            config.pop("chat_template", None)
            (bare / name).write_text(json.dumps(config))
    assert found(bare) == [("model.path", f"the processor of {bare} has no chat template: vision-chat rows are "
                                          "rendered with it")]
