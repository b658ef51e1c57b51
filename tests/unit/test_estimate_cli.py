"""`ftune plan` through the CLI: shipped recipes, errors, data and steps, output formats."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from ftune.cli.main import main
from ftune.cli.plan import summarize_names
from ftune.estimate.data import count_data

REPO = Path(__file__).resolve().parents[2]


def plan_json(capsys, *args: str) -> dict:
    code = main(["plan", *args, "--format", "json"])
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


def test_shipped_lora_recipe_plans_offline(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    out = plan_json(capsys, "recipes/llama7b-lora.yaml", "--gpu-memory", "80GiB")
    est = out["estimate"]
    assert (est["params_trainable"], est["params_total"]) == (4_194_304, 6_742_609_920)
    assert est["config_source"] == "catalog meta-llama--Llama-2-7b-hf.json"
    assert est["fsdp"]["units"] == 33 and est["fsdp"]["shard_ranks"] == 8
    assert est["device_memory"] == 80 * 1024**3 and est["fits"] is True
    assert out["effective_batch_size"] == 4 * 8 * 8
    assert out["launch"]["command"][1:5] == ["-m", "accelerate.commands.launch", "--quiet", "--config_file"]
    assert out["data"] is None  # data/alpaca.jsonl is not here


def test_text_output_shows_every_section(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert main(["plan", "recipes/llama7b-qlora.yaml", "--gpu-memory", "24GB"]) == 0
    text = capsys.readouterr().out
    for expected in ("parameters", "6,778,392,576 total", "39,976,960 trainable", "model.layers.*.mlp.down_proj x32",
                     "memory per device", "nf4", "paged AdamW 8-bit", "verdict      fits", "accelerate.commands.launch"):
        assert expected in text, expected


def test_target_modules_matching_nothing_is_a_located_error(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    code = main(["plan", "recipes/llama7b-lora.yaml", "peft.target_modules=[query,value]"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("<override>: error: peft.target_modules: (query, value) matches no module of the model")
    assert "hint: the model's linear layers are: down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj" in err


def test_too_small_gpu_does_not_fit_and_suggests(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    out = plan_json(capsys, "recipes/llama7b-full-fsdp.yaml", "distributed.strategy=none", "~distributed.fsdp",
                    "distributed.num_processes=1", "--gpu-memory", "40GiB")
    est = out["estimate"]
    # bf16 full fine-tune on one GPU: weights 2 + gradients 2 + AdamW states 4 + update scratch 2 bytes/param
    n = 6_738_415_616
    # + one fp32 `step` per parameter tensor, + two 32 MiB cuBLAS workspaces
    assert est["total_bytes"] == 10 * n + 4 * 291 + 2 * 32 * 1024**2
    assert est["fits"] is False and est["peak_phase"] == "update"
    assert est["suggestions"][0].startswith("shard over 8 processes (distributed.strategy: fsdp, num_processes: 8)")
    assert any(s.startswith("use train.optimizer: adamw_8bit") for s in est["suggestions"])


def test_freeze_matching_nothing_points_at_the_recipe_line(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert main(["plan", "recipes/llama7b-freeze.yaml", "peft.trainable=[nothing_like_this]"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("<override>: error: peft.trainable: matches no parameter of the model (291 parameters)")
    assert "hint: parameter names look like: model.embed_tokens.weight" in err


def test_bad_gpu_memory_is_a_usage_error(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert main(["plan", "recipes/llama7b-lora.yaml", "--gpu-memory", "lots"]) == 1
    assert "cannot read --gpu-memory 'lots'" in capsys.readouterr().err


def write_recipe(tmp_path, model_dir, data_file, **train) -> Path:
    recipe = {
        "name": "tiny",
        "model": {"path": str(model_dir), "dtype": "float32"},
        "data": {"train": [{"path": str(data_file)}], "max_seq_length": 16},
        "peft": {"method": "lora", "r": 4},
        "train": {"per_device_batch_size": 4, "gradient_accumulation_steps": 2, "epochs": 2, **train},
        "output": {"dir": str(tmp_path / "run")},
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def token_lengths(model_dir, data_file) -> list[int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    rows = [json.loads(line)["text"] for line in Path(data_file).read_text().splitlines()]
    return [len(tok.encode(t).ids) for t in rows]


def test_local_data_counts_samples_tokens_and_steps(capsys, tmp_path, tiny_model_dir, text_data_file):
    out = plan_json(capsys, str(write_recipe(tmp_path, tiny_model_dir, text_data_file)))
    lengths = token_lengths(tiny_model_dir, text_data_file)
    assert out["data"] == {
        "samples": 200,
        "tokens": sum(min(n, 16) for n in lengths),
        "rows": 200,
        "steps_per_epoch": 25,  # 200 rows / batch 4 = 50 batches / accumulation 2
        "total_steps": 50,
        "epochs": 2,
        "effective_batch": 8,
        "approximate": False,
        "longest": max(lengths),  # before truncation at data.max_seq_length
    }
    assert out["estimate"]["device"] == "cpu"


def test_packing_counts_packed_rows(tmp_path, tiny_model_dir, text_data_file):
    from ftune.recipe import load_recipe

    path = write_recipe(tmp_path, tiny_model_dir, text_data_file, max_steps=7)
    loaded = load_recipe(path, ["data.packing=true"])
    data = count_data(loaded.recipe, world_size=2, tokenizer_path=str(tiny_model_dir), epochs=1.0)
    tokens = sum(token_lengths(tiny_model_dir, text_data_file))
    assert data.tokens == tokens and data.rows == math.ceil(tokens / 16)
    assert data.steps_per_epoch == math.ceil(math.ceil(math.ceil(data.rows / 2) / 4) / 2)
    assert data.total_steps == 7 and data.effective_batch == 16


def test_eval_split_and_limit_reduce_samples(tmp_path, tiny_model_dir, text_data_file):
    from ftune.recipe import load_recipe

    path = write_recipe(tmp_path, tiny_model_dir, text_data_file)
    loaded = load_recipe(path, ["data.eval={split: 0.1}", "data.train.0.limit=150"])
    data = count_data(loaded.recipe, world_size=1, tokenizer_path=str(tiny_model_dir), epochs=1.0)
    assert data.samples == 150 - 15


def test_split_slices_count_the_rows_they_select(tmp_path, tiny_model_dir):
    """The issue's case: `train[:50%]` of 40 rows plans 20 samples and 10 steps (batch 1, accumulation 2)."""
    from ftune.recipe import load_recipe

    data_file = tmp_path / "d.jsonl"
    data_file.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(40)))
    path = write_recipe(tmp_path, tiny_model_dir, data_file, per_device_batch_size=1, epochs=1)
    for split, samples in [("train[:50%]", 20), ("train[10:15]", 5), ("train[-10%:]", 4), ("train[:25%]+train[-5:]", 15),
                           ("train", 40), ("train[:]", 40)]:
        loaded = load_recipe(path, [f"data.train.0.split={split}"])
        data = count_data(loaded.recipe, world_size=1, tokenizer_path=str(tiny_model_dir), epochs=1.0)
        assert data.samples == samples, split
    loaded = load_recipe(path, ["data.train.0.split=train[:50%]"])
    data = count_data(loaded.recipe, world_size=1, tokenizer_path=str(tiny_model_dir), epochs=1.0)
    assert (data.samples, data.steps_per_epoch, data.total_steps) == (20, 10, 10)
    assert count_data(load_recipe(path, ["data.train.0.split=validation"]).recipe, world_size=1,
                      tokenizer_path=str(tiny_model_dir), epochs=1.0) is None  # a local file has no such split


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.q_proj", "lm_head"],
         [("model.layers.*.self_attn.q_proj", 2), ("lm_head", 1)]),
        (["model.layers.31.mlp.down_proj.weight"], [("model.layers.*.mlp.down_proj.weight", 1)]),
    ],
)
def test_summarize_names(names, expected):
    assert summarize_names(names) == expected


def test_error_points_at_the_line_that_sets_the_key(capsys, tmp_path, tiny_model_dir, text_data_file):
    path = write_recipe(tmp_path, tiny_model_dir, text_data_file)
    text = path.read_text().replace("method: lora", "method: lora\n  target_modules: [wq, wv]")
    path.write_text(text)
    line = next(i for i, row in enumerate(text.splitlines(), 1) if "target_modules" in row)
    assert main(["plan", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{path}:{line}:")
    assert "error: peft.target_modules: (wq, wv) matches no module of the model" in err  # the compiler's preflight


def test_packing_without_a_local_tokenizer_leaves_steps_unknown(tmp_path, tiny_model_dir, text_data_file):
    from ftune.recipe import load_recipe

    loaded = load_recipe(write_recipe(tmp_path, tiny_model_dir, text_data_file), ["data.packing=true"])
    data = count_data(loaded.recipe, world_size=1, tokenizer_path=str(tmp_path / "no-tokenizer"), epochs=1.0)
    assert (data.samples, data.tokens, data.rows, data.steps_per_epoch, data.total_steps) == (200, None, None, None,
                                                                                                None)


def test_json_format_prints_recipe_errors_as_json(tmp_path, capsys):
    (tmp_path / "r.yaml").write_text("name: t\nmodel: {path: m}\ndata:\n  train: [{path: d.jsonl}]\n"
                                     "train:\n  max_steps: 2\n  mixed_precision: no\n")
    assert main(["plan", str(tmp_path / "r.yaml"), "--format", "json"]) == 1
    out, err = capsys.readouterr()
    assert err == ""
    assert json.loads(out) == {"recipe": str(tmp_path / "r.yaml"), "errors": [{
        "file": str(tmp_path / "r.yaml"), "line": 7, "column": 20, "path": "train.mixed_precision",
        "message": "invalid value false: an unquoted no, off or false is read as the boolean false",
        "hint": "quote it: 'no', in an override too: \"train.mixed_precision='no'\" (allowed values: no, fp16, bf16)"}]}


def test_json_format_prints_plan_errors_as_json(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert main(["plan", "recipes/llama7b-lora.yaml", "model.path=someone/Llama-3.1-8B", "--format", "json"]) == 1
    out = json.loads(capsys.readouterr().out)
    (error,) = out["errors"]
    assert out["recipe"] == str(REPO / "recipes/llama7b-lora.yaml")
    assert (error["file"], error["line"], error["path"]) == (None, None, "model.path")  # set by an override
    assert error["message"].startswith("no config found for 'someone/Llama-3.1-8B'")
    assert error["hint"].startswith("did you mean meta-llama/Llama-3.1-8B, ")
    assert main(["plan", "no-such.yaml", "--format", "json"]) == 2
    assert json.loads(capsys.readouterr().out)["errors"][0]["message"] == "recipe file not found: no-such.yaml"


@pytest.mark.parametrize("source", [{"format": "sharegpt"}, {"format": "chat", "roles": {"bot": "assistant"}},
                                    {"format": "alpaca", "as_chat": True}])
def test_chat_tokens_are_counted_through_the_chat_template(tmp_path, tiny_model_dir, source):
    """`plan`'s estimate for chat data is within 10% of what the data stage (`ftune data`) counts."""
    import random

    from ftune.recipe import load_recipe
    from tests.data_stage import build

    rng = random.Random(1)
    data = tmp_path / "chat.jsonl"
    if source["format"] == "alpaca":
        rows = [{"instruction": f"add {a} and {b}", "input": "", "output": f"{a + b}"}
                for a, b in ((rng.randint(0, 9), rng.randint(0, 9)) for _ in range(40))]
    else:
        m, r, c = ("conversations", "from", "value") if source["format"] == "sharegpt" else ("messages", "role", "content")
        bot = "gpt" if source["format"] == "sharegpt" else "bot"
        rows = [{m: [{r: "system", c: "be brief"}, {r: "user" if bot == "bot" else "human", c: f"add {a} and {b}"},
                     {r: bot, c: f"it is {a + b}"}]} for a, b in ((rng.randint(0, 9), rng.randint(0, 9))
                                                                    for _ in range(40))]
    data.write_text("".join(json.dumps(x) + "\n" for x in rows))
    path = write_recipe(tmp_path, tiny_model_dir, data)
    recipe = load_recipe(path, ["data.max_seq_length=512", f"data.cache_dir={tmp_path / 'cache'}"]
                         + [f"data.train.0.{k}={json.dumps(v)}" for k, v in source.items()]).recipe
    counted = count_data(recipe, world_size=1, tokenizer_path=str(tiny_model_dir), epochs=2.0)
    from transformers import AutoTokenizer

    built = build(recipe, AutoTokenizer.from_pretrained(tiny_model_dir), log=lambda _: None).report.tokens
    assert abs(counted.tokens - built) <= 0.1 * built, (counted.tokens, built)
    from ftune.estimate.data import _row_text, _tokenizer

    plain = sum(len(e.ids) for e in _tokenizer(str(tiny_model_dir)).encode_batch(
        [_row_text(x, recipe.data.train[0]) for x in rows]))
    assert plain < 0.8 * built  # the contents alone (the old estimate) miss the template's tokens


def test_plan_prints_epochs_and_what_max_steps_comes_to(capsys, tmp_path, tiny_model_dir, text_data_file):
    path = write_recipe(tmp_path, tiny_model_dir, text_data_file)  # epochs: 2
    assert main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert "(2 epochs)" in out and "threads      " in out and "per process" in out
    assert main(["plan", str(path), "train.epochs=1"]) == 0
    assert "(1 epoch)" in capsys.readouterr().out
    assert main(["plan", str(path), "train.max_steps=5"]) == 0
    assert "(train.max_steps: " in capsys.readouterr().out


def test_plan_builds_the_meta_model_once(capsys, monkeypatch, tmp_path, tiny_model_dir, text_data_file):
    """The compiler's preflight builds the model on the meta device and hands it to the estimate
    (`ftune.plan.compile.Compiled.meta`), which builds none of its own; its figures are those of a fresh build."""
    from ftune.estimate.estimate import estimate
    from ftune.models import meta
    from ftune.plan.compile import compile_plan
    from ftune.recipe import load_recipe

    built: list[str] = []
    instantiate = meta._instantiate

    def counted(recipe, config):
        built.append(recipe.model.path)
        return instantiate(recipe, config)

    monkeypatch.setattr(meta, "_instantiate", counted)
    path = write_recipe(tmp_path, tiny_model_dir, text_data_file)
    out = plan_json(capsys, str(path))
    assert built == [str(tiny_model_dir)]

    plan = compile_plan(load_recipe(path), check_inputs=False, reads_model=True)
    fresh = estimate(plan.recipe, world_size=plan.world_size, num_processes=plan.num_processes, gpu_memory=None,
                     device=plan.device)  # meta=None: built here
    assert built == [str(tiny_model_dir)] * 3  # the compile's and the estimate's own
    assert fresh.as_json() == out["estimate"]
