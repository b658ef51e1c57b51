"""`train.global_batch_size`, `per_device_batch_size: auto`, `gradient_checkpointing: auto`: the rules, located;
the plan's arithmetic (`ftune.plan.batch_size`); and the choice from the memory estimate (`ftune.estimate.autobatch`),
checked against the estimate itself at the chosen micro-batch and the next one."""

from __future__ import annotations

import pytest
import yaml

from ftune.errors import Problem, RecipeError
from ftune.plan import batch_size
from ftune.plan.batch_size import Choice
from ftune.recipe import load_recipe
from ftune.recipe.schema import Recipe

BASE = {"name": "t", "model": {"path": "m"}, "data": {"train": [{"path": "d.jsonl"}], "max_seq_length": 64}}
AUTO = {"global_batch_size": 16, "per_device_batch_size": "auto", "gradient_checkpointing": "auto"}


def problems(tmp_path, train: dict, **top) -> dict[str, Problem]:
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({**BASE, "train": {"max_steps": 2, **train}, **top}, sort_keys=False))
    with pytest.raises(RecipeError) as err:
        load_recipe(str(path))
    return {p.path: p for p in err.value.problems}


def recipe(train: dict, **top) -> Recipe:
    return Recipe.model_validate({**BASE, "train": {"max_steps": 2, **train}, **top})


# ------------------------------------------------------------------------------ rules (validate), located
def test_auto_needs_the_global_batch_it_splits(tmp_path):
    p = problems(tmp_path, {"per_device_batch_size": "auto"})["train.per_device_batch_size"]
    assert "needs the rows per optimizer step" in p.message and "global_batch_size" in p.hint
    assert p.location.line is not None


def test_global_batch_and_accumulation_are_not_both_set(tmp_path):
    p = problems(tmp_path, {"global_batch_size": 8, "gradient_accumulation_steps": 2})
    assert "follows from global_batch_size" in p["train.gradient_accumulation_steps"].message


def test_auto_is_refused_where_it_isnt_planned(tmp_path):
    found = problems(tmp_path, AUTO, data={**BASE["data"], "max_seq_length": None})
    assert {"train.per_device_batch_size", "train.gradient_checkpointing"} <= set(found)
    assert "data.max_seq_length" in found["train.gradient_checkpointing"].message
    found = problems(tmp_path, {**AUTO, "objective": "grpo", "rl": {"rewards": [{"name": "length"}]}})
    assert "generation batch" in found["train.per_device_batch_size"].message
    found = problems(tmp_path, {"gradient_checkpointing": "auto"},
                     distributed={"strategy": "fsdp", "num_processes": 2, "fsdp": {"activation_checkpointing": True}})
    assert "already checkpoints" in found["train.gradient_checkpointing"].message


def test_auto_validates():
    r = recipe(AUTO)
    assert (r.train.per_device_batch_size, r.train.gradient_checkpointing) == ("auto", "auto")


# ------------------------------------------------------------------------------ the plan's arithmetic
def test_the_chooser_decides_and_the_accumulation_follows():
    seen = {}

    def choose(one, *, candidates, checkpointing, key):
        seen.update(candidates=candidates, checkpointing=checkpointing, one=one.train, key=key)
        return Choice(4, False, "because")

    out, found, note = batch_size.resolve(recipe(AUTO), 2, choose)
    assert found == [] and seen["candidates"] == [1, 2, 4, 8] and seen["checkpointing"] == (False, True)
    assert seen["key"] == "per_device_batch_size"  # where a refusal is located
    assert (seen["one"].per_device_batch_size, seen["one"].gradient_accumulation_steps) == (1, 1)
    t = out.train
    assert (t.per_device_batch_size, t.gradient_accumulation_steps, t.gradient_checkpointing) == (4, 2, False)
    assert note == ("batch: 4 row(s) per device x 2 accumulation x 2 rank(s) = global_batch_size 16; "
                    "gradient_checkpointing off (because)")


def test_without_a_chooser_the_least_memory_and_the_same_optimizer_batch():
    out, found, note = batch_size.resolve(recipe(AUTO), 1, None)
    t = out.train
    assert found == [] and (t.per_device_batch_size, t.gradient_accumulation_steps, t.gradient_checkpointing) == (
        1, 16, True)
    assert "not sized by this command" in note


def test_a_global_batch_with_a_fixed_micro_batch_derives_the_accumulation():
    out, found, _ = batch_size.resolve(recipe({"global_batch_size": 24, "per_device_batch_size": 3}), 2, None)
    assert found == [] and out.train.gradient_accumulation_steps == 4
    untouched = recipe({"per_device_batch_size": 3, "gradient_accumulation_steps": 5})
    assert batch_size.resolve(untouched, 2, None) == (untouched, [], None)


@pytest.mark.parametrize("train, ranks, says", [
    ({"global_batch_size": 10}, 4, "don't split evenly over the job's 4 data-parallel ranks"),
    ({"global_batch_size": 12, "per_device_batch_size": 4}, 2, "takes 6 rows per step, which per_device_batch_size 4"),
    ({"global_batch_size": 8, "optimizer": "adamw_torch_layerwise"}, 1, "can't accumulate"),
    ({"global_batch_size": 2, "per_device_batch_size": "auto", "objective": "kto"}, 2, "kto needs 2 or more rows"),
])
def test_job_shape_problems_are_located_at_global_batch_size(train, ranks, says):
    r = Recipe.model_validate({**BASE, "train": {"max_steps": 2, **train}})  # the schema alone: no rules
    _, found, _ = batch_size.resolve(r, ranks, lambda one, **kw: Choice(kw["candidates"][0], False, ""))
    assert [p.path for p in found] == ["train.global_batch_size"] and says in found[0].message


def test_kto_candidates_start_at_two_rows():
    r = Recipe.model_validate({**BASE, "train": {"max_steps": 2, "objective": "kto", **AUTO}})
    seen = {}
    batch_size.resolve(r, 1, lambda one, **kw: seen.update(kw) or Choice(2, True, ""))
    assert seen["candidates"] == [2, 4, 8, 16]


# ------------------------------------------------------------------------------ the choice, against the estimate
def _estimate(r, gpu, **train):
    from ftune.estimate.estimate import estimate

    r = r.model_copy(update={"train": r.train.model_copy(update=train)})
    return estimate(r, world_size=1, num_processes=1, gpu_memory=gpu, device="cuda")


def test_the_choice_is_the_fastest_micro_batch_the_estimate_says_fits(tiny_model_dir):
    """On the tiny Llama at 256-token rows, with GPU memory set so that few rows fit without checkpointing: the
    chosen micro-batch fits the estimate's budget and the next candidate up doesn't (for the chosen checkpointing);
    with memory to spare, checkpointing stays off; with too little, the refusal is located."""
    from ftune.estimate.autobatch import HEADROOM, choose_batch

    base = Recipe.model_validate({**BASE, "model": {"path": str(tiny_model_dir)},
                                  "data": {**BASE["data"], "max_seq_length": 256},
                                  "train": {"max_steps": 2, "per_device_batch_size": 1}})
    plain = _estimate(base, 2**40, gradient_checkpointing=False)
    ckpt = _estimate(base, 2**40, gradient_checkpointing=True)
    fixed = sum(i.bytes for i in plain.memory if i.phase == "always")
    per_row = plain.total_bytes - fixed  # what one row adds without checkpointing
    candidates = [1, 2, 4, 8, 16, 32, 64]

    def choose(gpu):
        return choose_batch(base, candidates, (False, True), world_size=1, num_processes=1, device="cuda",
                            gpu_memory=gpu, seq_length=None)

    # room for ~3 rows without checkpointing: every candidate estimated, fitting or not, both ways
    gpu = int((fixed + 3.5 * per_row) / HEADROOM["cuda"])
    choice = choose(gpu)
    assert isinstance(choice, Choice), choice
    budget = int(gpu * HEADROOM["cuda"])
    fit = {(m, c): _estimate(base, gpu, per_device_batch_size=m, gradient_checkpointing=c).total_bytes <= budget
           for m in candidates for c in (False, True)}
    assert fit[(2, False)] and not fit[(4, False)] and fit[(4, True)] and not fit[(8, True)]
    speed = {o: min(1.0, o[0] * 256 / 8192) / (1.5 if o[1] else 1.0) for o, ok in fit.items() if ok}
    assert (choice.per_device, choice.checkpointing) == max(speed, key=speed.get) == (4, True)
    assert "3 without checkpointing, 6 with checkpointing" in choice.why

    roomy = choose(2**40)  # everything fits: no checkpointing, and the micro-batch that reaches full speed
    assert (roomy.per_device, roomy.checkpointing) == (32, False)

    tight = choose(int(ckpt.total_bytes * 0.8))
    assert isinstance(tight, Problem) and tight.path == "train.per_device_batch_size"
    assert "no micro-batch fits" in tight.message
    # room for the weights and half a row's activations: the refusal names the levers the recipe leaves off, with
    # the longest row each allows (the one-row plan's "longer rows" note)
    resident = sum(i.bytes for i in ckpt.memory if i.phase == "always")
    half = choose(int((resident + (ckpt.total_bytes - resident) / 2) / HEADROOM["cuda"]))
    assert "no micro-batch fits" in half.message
    assert "the one-row plan's longer rows (memory alone; levers added in turn): + train.kernels: liger: " in \
        half.hint, half.hint
    fixed_batch = choose_batch(base, [1], (False, True), world_size=1, num_processes=1, device="cuda",
                               gpu_memory=int(ckpt.total_bytes * 0.8), seq_length=None, key="gradient_checkpointing")
    assert fixed_batch.path == "train.gradient_checkpointing"  # where the recipe wrote auto


def test_plan_sizes_auto_on_the_cli(tiny_model_dir, tmp_path, capsys):
    """`ftune plan --gpu-memory` with both keys auto: plan.json's recipe holds numbers, the batch line says why."""
    from ftune.cli.main import main

    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({**BASE, "model": {"path": str(tiny_model_dir)},
                                    "data": {"train": [{"path": str(tmp_path / "d.jsonl")}], "max_seq_length": 128},
                                    "train": {"max_steps": 2, **AUTO}}, sort_keys=False))
    (tmp_path / "d.jsonl").write_text('{"text": "hello there"}\n' * 4)
    assert main(["plan", str(path), "--gpu-memory", "80GiB", "--format", "json"]) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    trainer = out["trainer"]
    assert (trainer["per_device_train_batch_size"], trainer["gradient_accumulation_steps"],
            trainer["activation_checkpointing"]) == (16, 1, False)
    assert out["effective_batch_size"] == 16
    [line] = [n for n in out["notes"] if n.startswith("batch: ")]
    assert "16 row(s) per device x 1 accumulation" in line and "gradient_checkpointing off" in line


# ------------------------------------------------------------------------------ machines deciding alone
def test_machines_whose_plans_split_the_batch_differently_are_stopped_with_both_named():
    """Each machine compiles its plan; auto decides on its memory. The worker gathers every rank's split at start
    and refuses a mismatch (the ranks would wait on each other's gradient syncs), naming the hosts."""
    from ftune.errors import FtuneError
    from ftune.worker.distributed import check_splits, split

    same = [("node-a", (4, 4, False)), ("node-a", (4, 4, False)), ("node-b", (4, 4, False))]
    check_splits(same)
    with pytest.raises(FtuneError) as err:
        check_splits([*same, ("node-c", (2, 8, True))])
    assert "node-a, node-b: 4 row(s) x 4 accumulation, checkpointing off" in err.value.message
    assert "node-c: 2 row(s) x 8 accumulation, checkpointing on" in err.value.message
    assert "set them to numbers" in err.value.hint

    from types import SimpleNamespace
    plan = SimpleNamespace(trainer={"per_device_train_batch_size": 2, "gradient_accumulation_steps": 3,
                                    "activation_checkpointing": False}, activation_checkpointing="fsdp")
    assert split(plan) == (2, 3, True)  # FSDP's own checkpointing counts as on


def test_grpo_groups_are_counted_in_the_global_batch(tmp_path):
    """With global_batch_size, TRL's generation batch is the global batch (per-device x the derived accumulation x
    ranks): 8 generations fit 16 rows of 4 per device, not 12."""
    from ftune.recipe.rules.rl import whole_groups

    def grpo(**train):
        return Recipe.model_validate({**BASE, "data": {"train": [{"path": "p.jsonl", "format": "prompt"}]},
                                      "train": {"max_steps": 2, "objective": "grpo", "per_device_batch_size": 4,
                                                "rl": {"num_generations": 8, "rewards": [{"name": "length"}]},
                                                **train}})

    assert list(whole_groups(grpo(global_batch_size=16))) == []  # per-device 4 x accumulation 4 on one process
    [p] = list(whole_groups(grpo(global_batch_size=12)))
    assert "batch of 12 completions (train.global_batch_size)" in p.message
    [p] = list(whole_groups(grpo()))  # 4 x 1 x 1
    assert "batch of 4 completions (per_device_batch_size 4" in p.message
