"""Distillation (`train.objective: distill`) and a student built from a model's layers (`model.init_from`): each
rule refuses located, the Plan holds GKDConfig's kwargs and the teacher, the files tier compares the teacher's
tokenizer with the student's and the layers with the source's depth, the student built in the worker keeps exactly
the layers listed, and `ftune plan` counts the teacher."""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest
import yaml

from ftune.errors import RecipeError
from ftune.plan.compile import compile_plan
from ftune.recipe import load_recipe

CHAT = [{"path": "c.jsonl", "format": "chat"}]
HAS_TRL = importlib.util.find_spec("trl") is not None


def _write(tmp_path, train: dict | None = None, model: dict | None = None, data: dict | None = None) -> str:
    raw = {"name": "t", "model": model or {"path": "m"},
           "data": {"train": CHAT, "max_seq_length": 64, **(data or {})},
           "peft": {"method": "full"},
           "train": {"max_steps": 10, "objective": "distill", "distill": {"teacher": "t"}, **(train or {})},
           "output": {"dir": str(tmp_path / "run")}}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return str(path)


def problems(tmp_path, **kw) -> dict:
    with pytest.raises(RecipeError) as err:
        load_recipe(_write(tmp_path, **kw))
    return {p.path: p for p in err.value.problems}


def line_of(problem) -> str:
    loc = problem.location
    return open(loc.file).read().splitlines()[loc.line - 1].strip()


# ------------------------------------------------------------------------------------ recipe rules
def test_distill_without_a_teacher_is_refused_at_the_objective(tmp_path):
    p = problems(tmp_path, train={"objective": "distill", "distill": None})
    assert list(p) == ["train.objective"] and "names none" in p["train.objective"].message
    assert "train.distill: {teacher: PATH}" in p["train.objective"].hint


def test_a_distill_section_under_another_objective_is_refused(tmp_path):
    p = problems(tmp_path, train={"objective": "sft"})
    assert list(p) == ["train.distill"] and "'sft'" in p["train.distill"].message


def test_beta_belongs_to_jsd(tmp_path):
    p = problems(tmp_path, train={"distill": {"teacher": "t", "loss": "reverse_kl", "beta": 0.3}})
    assert list(p) == ["train.distill.beta"] and line_of(p["train.distill.beta"]) == "beta: 0.3"
    load_recipe(_write(tmp_path, train={"distill": {"teacher": "t", "loss": "jsd", "beta": 0.3}}))


def test_generation_settings_without_generation_are_refused(tmp_path):
    p = problems(tmp_path, train={"distill": {"teacher": "t", "max_new_tokens": 32}})
    assert list(p) == ["train.distill.max_new_tokens"] and "nothing is generated" in p[
        "train.distill.max_new_tokens"].message
    load_recipe(_write(tmp_path, train={"distill": {"teacher": "t", "on_policy": 0.5, "max_new_tokens": 32}}))


def test_on_policy_range_is_the_schemas(tmp_path):
    p = problems(tmp_path, train={"distill": {"teacher": "t", "on_policy": 1.5}})
    assert list(p) == ["train.distill.on_policy"]


def test_packing_and_a_classifier_are_refused(tmp_path):
    p = problems(tmp_path, data={"packing": True})
    assert list(p) == ["data.packing"] and "packed rows would mix samples" in p["data.packing"].message


def test_on_policy_needs_rows_with_a_prompt(tmp_path):
    on = {"distill": {"teacher": "t", "on_policy": 0.5}}
    p = problems(tmp_path, train=on, data={"train": [{"path": "t.txt", "format": "text"}]})
    assert list(p) == ["data.train[0].format"] and "no prompt" in p["data.train[0].format"].message
    p = problems(tmp_path, train=on, data={"train_on": "all"})
    assert list(p) == ["data.train_on"]
    # off-policy, plain text is distilled token by token
    load_recipe(_write(tmp_path, data={"train": [{"path": "t.txt", "format": "text"}], "train_on": "all"}))


@pytest.mark.parametrize(("layers", "at", "says"), [
    ([0, 2, 2, 4], 2, "listed twice"),
    ([0, 4, 2], 2, "comes after 4"),
    ([-1, 2], 0, "negative"),
])
def test_init_from_layers_are_increasing_and_unique(tmp_path, layers, at, says):
    p = problems(tmp_path, model={"init_from": {"path": "m", "layers": layers}})
    key = f"model.init_from.layers[{at}]"
    assert list(p) == [key] and says in p[key].message


def test_init_from_path_is_the_model_path(tmp_path):
    r = load_recipe(_write(tmp_path, model={"init_from": {"path": "m", "layers": [0, 1]}})).recipe
    assert r.model.path == "m"
    p = problems(tmp_path, model={"path": "other", "init_from": {"path": "m", "layers": [0, 1]}})
    assert list(p) == ["model.path"] and "differ" in p["model.path"].message
    p = problems(tmp_path, model={"init_from": {"path": "m", "layers": []}})
    assert list(p) == ["model.init_from.layers"]


# ---------------------------------------------------------------------------------------- the Plan
@pytest.mark.parametrize(("distill", "beta"), [
    ({"loss": "forward_kl"}, 0.0), ({"loss": "reverse_kl"}, 1.0), ({"loss": "jsd"}, 0.5),
    ({"loss": "jsd", "beta": 0.2}, 0.2),
])
def test_the_plan_maps_the_loss_to_gkds_beta(tmp_path, distill, beta):
    plan = compile_plan(load_recipe(_write(tmp_path, train={"distill": {"teacher": "t", **distill}})),
                        check_inputs=False)
    assert plan.family == "distill" and plan.trainer_class == "trl.experimental.gkd.GKDTrainer"
    assert plan.trainer["beta"] == beta and plan.trainer["lmbda"] == 0.0 and plan.trainer["seq_kd"] is False
    assert plan.teacher.path == "t" and plan.teacher.kwargs["dtype"] == "float32"


def test_the_plan_holds_the_layers_and_on_policy_share(tmp_path):
    plan = compile_plan(load_recipe(_write(
        tmp_path, model={"init_from": {"path": "m", "layers": [0, 2]}, "dtype": "bfloat16"},
        train={"distill": {"teacher": "t", "on_policy": 0.25, "temperature": 0.7, "max_new_tokens": 16}})),
        check_inputs=False)
    assert plan.model_load.layers == [0, 2] and plan.model_load.path == "m"
    assert (plan.trainer["lmbda"], plan.trainer["temperature"], plan.trainer["max_new_tokens"]) == (0.25, 0.7, 16)
    assert plan.teacher.kwargs["dtype"] == "bfloat16"  # the student's by default
    assert any("25% of the batches" in n for n in plan.notes)


@pytest.mark.skipif(not HAS_TRL, reason="needs trl")
def test_gkdconfig_takes_the_plans_kwargs(tmp_path):
    from ftune.runtime.train import training_arguments

    plan = compile_plan(load_recipe(_write(tmp_path, train={"distill": {"teacher": "t", "loss": "jsd",
                                                                         "on_policy": 0.5}})), check_inputs=False)
    args = training_arguments(plan)
    assert type(args).__name__ == "GKDConfig" and (args.lmbda, args.beta) == (0.5, 0.5)


# -------------------------------------------------------------------------------------- files tier
def _folder(tmp_path, name, src, **edit):
    dst = tmp_path / name
    shutil.copytree(src, dst)
    for file, change in edit.items():
        data = json.loads((dst / file).read_text())
        change(data)
        (dst / file).write_text(json.dumps(data))
    return dst


def _checked(tmp_path, student, teacher, layers=None):
    from ftune.plan.distill import problems as distill_problems

    model = {"path": str(student)} if layers is None else {"init_from": {"path": str(student), "layers": layers}}
    recipe = load_recipe(_write(tmp_path, model=model, train={"distill": {"teacher": str(teacher)}})).recipe
    return {p.path: p for p in distill_problems(recipe)}


def test_the_same_tokenizer_passes_and_a_different_vocabulary_is_named(tmp_path, tiny_model_dir):
    assert _checked(tmp_path, tiny_model_dir, tiny_model_dir) == {}

    def swap(tok):
        vocab = tok["model"]["vocab"]
        a, b = sorted(vocab, key=vocab.get)[10:12]
        vocab[a], vocab[b] = vocab[b], vocab[a]

    other = _folder(tmp_path, "other", tiny_model_dir, **{"tokenizer.json": swap})
    p = _checked(tmp_path, tiny_model_dir, other)
    assert list(p) == ["train.distill.teacher"] and "token id 10 is" in p["train.distill.teacher"].message


def test_a_different_special_token_is_named(tmp_path, tiny_model_dir):
    def eos(cfg):
        cfg["eos_token"] = "<pad>"

    other = _folder(tmp_path, "other", tiny_model_dir, **{"tokenizer_config.json": eos})
    p = _checked(tmp_path, tiny_model_dir, other)
    assert "eos_token is '<pad>' in the teacher" in p["train.distill.teacher"].message


def test_an_adapter_teacher_must_be_merged(tmp_path, tiny_model_dir):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    p = _checked(tmp_path, tiny_model_dir, adapter)
    assert "saved adapter" in p["train.distill.teacher"].message and "ftune merge" in p["train.distill.teacher"].hint


def test_layers_past_the_sources_depth_are_located(tmp_path, tiny_model_dir):
    assert _checked(tmp_path, tiny_model_dir, tiny_model_dir, layers=[0, 1]) == {}
    p = _checked(tmp_path, tiny_model_dir, tiny_model_dir, layers=[0, 1, 2])
    assert list(p) == ["model.init_from.layers[2]"] and "has 2 decoder layers" in p["model.init_from.layers[2]"].message


# ----------------------------------------------------------------------------- the student, built
def test_keep_layers_computes_what_the_layers_listed_compute(tmp_path, tiny_tokenizer_dir):
    """The student of layers [0, 2] of a 3-layer model equals a 2-layer model holding those layers' weights."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ftune.runtime.layers import keep_layers
    from ftune.tiny import build_tiny_llama

    build_tiny_llama(tmp_path / "deep", AutoTokenizer.from_pretrained(tiny_tokenizer_dir), num_layers=3, seed=4)
    deep = AutoModelForCausalLM.from_pretrained(tmp_path / "deep")
    state = deep.state_dict()
    student = keep_layers(AutoModelForCausalLM.from_pretrained(tmp_path / "deep"), [0, 2])
    assert student.config.num_hidden_layers == 2 and len(student.model.layers) == 2
    assert [layer.self_attn.layer_idx for layer in student.model.layers] == [0, 1]
    cfg = deep.config
    cfg.num_hidden_layers = 2
    ref = AutoModelForCausalLM.from_config(cfg)
    ref.load_state_dict({k.replace("layers.2.", "layers.1."): v for k, v in state.items() if "layers.1." not in k})
    ids = torch.randint(0, cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(student(ids).logits, ref(ids).logits)
        # generation uses the KV cache by the renumbered layer_idx
        out = student.generate(ids[:, :4], max_new_tokens=5, do_sample=False)
        assert torch.equal(out, ref.generate(ids[:, :4], max_new_tokens=5, do_sample=False))
    student.save_pretrained(tmp_path / "student")
    assert json.loads((tmp_path / "student" / "config.json").read_text())["num_hidden_layers"] == 2


# ----------------------------------------------------------------------------------- ftune plan
def test_the_estimate_counts_the_teacher_beside_the_student(tmp_path, tiny_model_dir):
    from ftune.estimate.estimate import estimate

    recipe = load_recipe(_write(tmp_path, model={"init_from": {"path": str(tiny_model_dir), "layers": [0]}},
                                train={"distill": {"teacher": str(tiny_model_dir)}, "per_device_batch_size": 4,
                                       "gradient_accumulation_steps": 2})).recipe
    est = estimate(recipe, world_size=1, num_processes=1, gpu_memory=None, device="cpu")
    t = est.teacher
    cfg = json.loads((tiny_model_dir / "config.json").read_text())
    hidden, vocab = cfg["hidden_size"], cfg["vocab_size"]
    embed = vocab * hidden
    layer = t.params - est.params_total  # the teacher: one decoder layer more than the one-layer student
    assert cfg["num_hidden_layers"] == 2 and layer > 0
    assert est.params_total == embed * 2 + hidden + layer  # untied head, final norm, one layer
    assert t.weight_bytes == 4 * t.params and t.tokens_per_step == 4 * 64 * 2
    assert t.forward_flops_per_step == 2 * (t.params - embed) * t.tokens_per_step
    assert t.student_flops_per_step == 6 * (est.params_total - embed) * t.tokens_per_step
    teacher_rows = {i.detail: i.bytes for i in est.memory if "teacher" in i.detail}
    assert teacher_rows == {"teacher float32 (frozen)": t.weight_bytes,
                            "teacher logits (float32, for the loss)": 4 * 64 * vocab * 4}
    assert est.total_bytes >= t.weight_bytes + t.logits_bytes
