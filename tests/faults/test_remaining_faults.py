"""The last runtime faults of the fault corpus: chat anomalies and size edges as warnings, max_seq_length past
the model's positions as an error, a corrupt cache entry rebuilt, and `ftune eval` mismatches named."""

from __future__ import annotations

import json

import pytest

from ftune.recipe.schema import Recipe
from tests.data_stage import build


@pytest.fixture(scope="module")
def tok(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir)


def _recipe(tmp_path, path, fmt="chat", train=None, **data) -> Recipe:
    return Recipe.model_validate({"name": "t", "model": {"path": "unused"}, "train": train or {},
                                  "data": {"train": [{"path": str(path), "format": fmt}], "shuffle": False,
                                           "cache_dir": str(tmp_path / "cache"), **data}})


def _chat_file(path, convs):
    path.write_text("".join(json.dumps({"messages": [{"role": r, "content": c} for r, c in conv]}) + "\n"
                            for conv in convs))
    return path


GOOD = [("user", "q"), ("assistant", "a")]


def test_chat_anomalies_are_counted_per_source_and_warned(tok, tmp_path):
    convs = [GOOD] * 5 + [
        [("system", "s"), ("assistant", "hi"), ("user", "q"), ("assistant", "a")],  # row 6: assistant first
        [("user", "q"), ("user", "again"), ("assistant", "a")],  # row 7: two user turns
        [("user", "q"), ("user", "again"), ("assistant", "a")],  # row 8
        [("user", ""), ("assistant", "a")],  # row 9: empty content
    ]
    lines: list[str] = []
    bundle = build(_recipe(tmp_path, _chat_file(tmp_path / "c.jsonl", convs)), tok, log=lines.append)
    src = bundle.report.sources[0]
    assert (src.assistant_first, src.user_twice, src.empty_content) == (1, 2, 1)
    assert src.first_anomaly == {"assistant_first": 6, "user_twice": 7, "empty_content": 9}
    text = "\n".join(bundle.warnings)
    assert "data.train[0]: 1 of 9 chat rows start with an assistant turn (first: row 6 of" in text
    assert "2 of 9 chat rows have two user turns in a row (first: row 7" in text
    assert "1 of 9 chat rows have a message with empty content (first: row 9" in text
    assert sum("data: WARNING" in x and "chat rows" in x for x in lines) == 3  # the run header's lines too
    # a cache hit reports the same counts
    again = build(_recipe(tmp_path, tmp_path / "c.jsonl"), tok, log=lambda _: None)
    assert again.report.cache_hit and again.warnings == bundle.warnings


def test_clean_chat_has_no_anomaly_warning(tok, tmp_path):
    bundle = build(_recipe(tmp_path, _chat_file(tmp_path / "c.jsonl", [GOOD] * 8)), tok, log=lambda _: None)
    assert not any("chat rows" in w or "optimizer step" in w for w in bundle.warnings)


def test_a_step_larger_than_the_dataset_is_warned(tok, tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "7")  # samples per step are the Plan's, never the launched environment's
    path = _chat_file(tmp_path / "c.jsonl", [GOOD] * 6)
    r = _recipe(tmp_path, path, train={"per_device_batch_size": 4, "gradient_accumulation_steps": 2})
    bundle = build(r, tok, log=lambda _: None)
    assert bundle.report.step_samples == 8 and bundle.report.train_samples == 6
    [w] = [w for w in bundle.warnings if "optimizer step" in w]
    assert "one optimizer step takes 8 samples" in w and "the training set has 6" in w
    r = _recipe(tmp_path, path, train={"per_device_batch_size": 2, "gradient_accumulation_steps": 3})
    assert not any("optimizer step" in w for w in build(r, tok, log=lambda _: None).warnings)
    assert build(r, tok, world_size=2, log=lambda _: None).report.step_samples == 12


def _entry(tmp_path):
    [entry] = [p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")]
    return entry


@pytest.mark.parametrize("damage", ["truncate-arrow", "drop-report", "garble-manifest"])
def test_a_corrupt_cache_entry_is_rebuilt(tok, tmp_path, damage):
    path = _chat_file(tmp_path / "c.jsonl", [GOOD] * 6)
    ids = list(build(_recipe(tmp_path, path), tok, log=lambda _: None).train["input_ids"])  # before the damage
    entry = _entry(tmp_path)
    if damage == "truncate-arrow":
        arrow = next((entry / "train").glob("*.arrow"))
        arrow.write_bytes(arrow.read_bytes()[:100])
    elif damage == "drop-report":
        (entry / "report.json").unlink()
    else:
        (entry / "manifest.json").write_text("{")
    lines: list[str] = []
    second = build(_recipe(tmp_path, path), tok, log=lines.append)
    assert not second.report.cache_hit
    assert second.report.cache_reason.startswith("entry corrupt, rebuilt: ")
    assert any("cache miss (entry corrupt, rebuilt" in x for x in lines)
    assert list(second.train["input_ids"]) == ids
    third = build(_recipe(tmp_path, path), tok, log=lambda _: None)  # the rebuilt entry is whole again
    assert third.report.cache_hit and list(third.train["input_ids"]) == ids


def test_max_seq_length_past_the_models_positions_is_a_located_error(tiny_model_dir):
    from ftune.models.meta import build_meta_model
    from ftune.plan.checks.preflight import position_problems, problems

    positions = json.loads((tiny_model_dir / "config.json").read_text())["max_position_embeddings"]

    def recipe(n):
        return Recipe.model_validate({"name": "t", "model": {"path": str(tiny_model_dir)},
                                      "data": {"train": [{"path": "x.jsonl"}], "max_seq_length": n}})

    r = recipe(positions + 1)
    [p] = position_problems(r, build_meta_model(r))
    assert p.path == "data.max_seq_length"
    assert p.message.startswith(f"{positions + 1} is longer than the model's max_position_embeddings ({positions}")
    assert p.hint == f"set data.max_seq_length to at most {positions} (longer rows are truncated)"
    assert position_problems(recipe(positions), build_meta_model(recipe(positions))) == []

    # the preflight the compiler runs (so `plan` and `run` refuse it before the run dir is written)
    assert [p.path for p in problems(r, "cpu")] == ["data.max_seq_length"]


# ------------------------------------------------------------------ `ftune eval` on a folder that doesn't fit


@pytest.fixture(scope="module")
def adapter_dir(tiny_model_dir, tmp_path_factory):
    """A LoRA adapter trained (initialised) on the tiny Llama, saved with the record the save stage writes."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("adapter") / "final"
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    model.save_pretrained(str(folder))
    (folder / "ftune.json").write_text(json.dumps({"method": "lora", "task": "causal-lm", "quantization": None,
                                                  "base_model": str(tiny_model_dir), "adapter": True}))
    return folder


def _plan(tmp_path, model_path, task="causal-lm"):
    import yaml

    from ftune.plan.compile import compile_plan
    from ftune.recipe import load_recipe

    model = {"path": str(model_path), "task": task}
    if task == "sequence-classification":
        model["labels"] = ["a", "b"]
    fmt = "classification" if task == "sequence-classification" else "text"
    recipe = {"name": "unit", "model": model, "data": {"train": [{"path": str(tmp_path / "t.jsonl"), "format": fmt}]},
              "peft": {"method": "lora", "r": 4, "target_modules": ["q_proj"]}, "train": {"max_steps": 1},
              "output": {"dir": str(tmp_path / "runs" / "unit")}}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    return compile_plan(load_recipe(str(tmp_path / "recipe.yaml")), check_inputs=False)


def _load_error(plan, folder, tok):
    from ftune.errors import FtuneError
    from ftune.infer.load import load_trained

    with pytest.raises(FtuneError) as info:
        load_trained(plan, folder, tok)
    return info.value


def test_eval_on_a_wrong_base_names_both_bases(adapter_dir, tiny_model_dir, tiny_tokenizer_dir, tmp_path, tok):
    from ftune.tiny import build_tiny_llama

    wider = tmp_path / "wider-llama"
    build_tiny_llama(wider, tok, hidden_size=96, intermediate_size=128)
    err = _load_error(_plan(tmp_path, wider), adapter_dir, tok)
    assert err.message.startswith(f"the adapter in {adapter_dir} was trained on base {tiny_model_dir}, "
                                  f"the recipe's model.path is {wider}: their shapes differ (")
    assert "q_proj" in err.message and err.hint.startswith(f"set model.path to the base it was trained on ({tiny_model_dir})")


def test_eval_on_a_shallower_base_is_refused_not_silently_half_loaded(adapter_dir, tiny_model_dir, tmp_path, tok):
    from ftune.tiny import build_tiny_llama

    shallow = tmp_path / "one-layer-llama"
    build_tiny_llama(shallow, tok, num_layers=1)
    err = _load_error(_plan(tmp_path, shallow), adapter_dir, tok)
    assert err.message.startswith(f"the adapter in {adapter_dir} was trained on base {tiny_model_dir}, "
                                  f"the recipe's model.path is {shallow}: their layers differ (2 adapter tensors "
                                  "have no place in it, e.g. base_model.model.model.layers.1.self_attn.q_proj.lora_A")


def test_the_right_base_loads_the_adapter(adapter_dir, tiny_model_dir, tmp_path, tok):
    from ftune.infer.load import load_trained

    model = load_trained(_plan(tmp_path, tiny_model_dir), adapter_dir, tok)
    assert sum(".lora_A.default." in n for n, _ in model.named_parameters()) == 2


def test_eval_on_a_truncated_adapter_names_the_file(adapter_dir, tiny_model_dir, tmp_path, tok):
    import shutil

    cut = tmp_path / "final"
    shutil.copytree(adapter_dir, cut)
    weights = cut / "adapter_model.safetensors"
    whole = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[: whole // 2])
    err = _load_error(_plan(tmp_path, tiny_model_dir), cut, tok)
    assert err.message == f"{weights} is truncated: {whole // 2} bytes of {whole}"
    assert "cut short" in err.hint and (adapter_dir / "adapter_model.safetensors").stat().st_size == whole


def test_a_classification_recipe_against_an_lm_adapter_is_a_task_mismatch(adapter_dir, tiny_model_dir, tmp_path, tok):
    err = _load_error(_plan(tmp_path, tiny_model_dir, task="sequence-classification"), adapter_dir, tok)
    assert err.message == (f"{adapter_dir} was trained for model.task causal-lm (its ftune.json), but the recipe's "
                           "model.task is sequence-classification")
    assert "model.task=causal-lm" in err.hint


def test_without_a_record_the_adapters_task_type_decides(adapter_dir, tiny_model_dir, tmp_path, tok):
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(adapter_dir, bare)
    (bare / "ftune.json").unlink()
    err = _load_error(_plan(tmp_path, tiny_model_dir, task="sequence-classification"), bare, tok)
    assert err.message == (f"{bare} was trained for model.task causal-lm (its adapter_config.json task_type), but "
                           "the recipe's model.task is sequence-classification")
    (bare / "adapter_config.json").write_text('{"task_type": ')
    err = _load_error(_plan(tmp_path, tiny_model_dir), bare, tok)
    assert err.message.startswith(f"{bare / 'adapter_config.json'} is not valid JSON")
