"""Online RL (grpo, rloo): the rules refuse what can't run (located, every bad input of issue #24), the Plan holds
the kwargs TRL's config classes accept unchanged, the built-in rewards score as documented, prompt rows reach TRL
as text with their answers, and the guard stops on flat rewards and clipped completions."""

from __future__ import annotations

import importlib.util
import json
from types import SimpleNamespace

import pytest
import yaml

from ftune.errors import RecipeError, RunError
from ftune.plan.compile import compile_plan
from ftune.recipe import load_recipe
from ftune.rewards import BUILTIN, Sample

PROMPTS = [{"path": "p.jsonl", "format": "prompt"}]
HAS_TRL = importlib.util.find_spec("trl") is not None


def _write(tmp_path, train: dict, data: dict | None = None, **top) -> str:
    raw = {"name": "t", "model": {"path": "m"},
           "data": {"train": PROMPTS, "max_seq_length": 64, **(data or {})},
           "train": {"max_steps": 10, "per_device_batch_size": 4, **train}, "output": {"dir": str(tmp_path / "run")},
           **top}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return str(path)


def grpo(rewards=None, **rl) -> dict:
    return {"objective": "grpo", "rl": {"rewards": rewards or [{"name": "exact_match"}], "num_generations": 4, **rl}}


def problems(tmp_path, train: dict, data: dict | None = None, **top) -> dict:
    with pytest.raises(RecipeError) as err:
        load_recipe(_write(tmp_path, train, data, **top))
    return {p.path: p for p in err.value.problems}


def plan(tmp_path, train: dict, data: dict | None = None, **top):
    return compile_plan(load_recipe(_write(tmp_path, train, data, **top)), check_inputs=False)


def line_of(problem) -> str:
    loc = problem.location
    return open(loc.file).read().splitlines()[loc.line - 1].strip()


# ------------------------------------------------------------------------------ bad input, located
def test_unknown_reward_name_is_located_with_near_names(tmp_path):
    p = problems(tmp_path, grpo([{"name": "exact_match"}, {"name": "numerc", "tolerance": 0.5}]))
    assert list(p) == ["train.rl.rewards[1].name"]
    assert p["train.rl.rewards[1].name"].message == "no reward named 'numerc'"
    assert "did you mean 'numeric'" in p["train.rl.rewards[1].name"].hint
    assert line_of(p["train.rl.rewards[1].name"]).endswith("name: numerc")


def test_reward_args_of_the_wrong_type_or_unknown_are_located(tmp_path):
    p = problems(tmp_path, grpo([{"name": "numeric", "tolerance": "small"}, {"name": "regex", "patern": "x"},
                                 {"name": "length"}, {"name": "regex", "pattern": "(unclosed"}]))
    assert "train.rl.rewards[0].tolerance" in p and "valid number" in p["train.rl.rewards[0].tolerance"].message
    assert line_of(p["train.rl.rewards[0].tolerance"]) == "tolerance: small"
    assert p["train.rl.rewards[1].patern"].message == "reward 'regex': unknown argument"
    assert "pattern" in p["train.rl.rewards[1].patern"].hint
    assert "train.rl.rewards[2].target" in p  # required
    assert "not a regular expression" in p["train.rl.rewards[3].pattern"].message


def test_an_adapter_on_the_output_head_is_refused_for_online_rl(tmp_path):
    """TRL's online trainers read lm_head.weight directly (an adapter there never trains; TRL raises at init)."""
    lora = {"method": "lora", "target_modules": ["q_proj", "lm_head"]}
    p = problems(tmp_path, grpo(), peft=lora)
    assert list(p) == ["peft.target_modules[1]"] and "never be trained" in p["peft.target_modules[1]"].message
    assert line_of(p["peft.target_modules[1]"]) == "- lm_head"
    load_recipe(_write(tmp_path, grpo(), peft={**lora, "target_modules": "all-linear"}))  # the head is not in it
    load_recipe(_write(tmp_path, {}, data={"train": [{"path": "d.jsonl"}]}, peft=lora))  # SFT trains it


def test_num_generations_must_divide_the_generation_batch(tmp_path):
    p = problems(tmp_path, grpo(num_generations=3))
    assert p["train.rl.num_generations"].message.startswith("3 generations per prompt don't divide the generation "
                                                            "batch of 4 completions")
    assert "use num_generations 2, 4" in p["train.rl.num_generations"].hint
    # TRL's own default (8 for grpo) is what the rule checks when the recipe leaves it unset
    p = problems(tmp_path, {"objective": "grpo", "rl": {"rewards": [{"name": "exact_match"}]}})
    assert "8 generations per prompt" in p["train.rl.num_generations"].message


def test_settings_and_sections_that_do_not_fit_the_objective(tmp_path):
    p = problems(tmp_path, {"objective": "rloo", "rl": {"rewards": [{"name": "regex", "pattern": "x"}],
                                                        "num_generations": 2, "loss_type": "grpo"}})
    assert p["train.rl.loss_type"].message == "rloo has no `loss_type` setting (grpo only)"
    p = problems(tmp_path, {"objective": "grpo", "rl": {"num_generations": 4}})
    assert p["train.rl.rewards"].message == "grpo learns from rewards, and the recipe names none"
    p = problems(tmp_path, {"rl": {"rewards": [{"name": "exact_match"}]}}, {"train": [{"path": "d.jsonl"}]})
    assert p["train.rl"].message.startswith("train.rl sets online RL options, but train.objective is 'sft'")
    p = problems(tmp_path, {}, {"train": PROMPTS})
    assert "prompt data is for online RL" in p["data.train[0].format"].message
    p = problems(tmp_path, grpo(), {"train": [{"path": "d.jsonl", "format": "preference"}]})
    assert p["data.train[0].format"].message == "train.objective 'grpo' reads `format: prompt` rows, not preference"
    p = problems(tmp_path, {**grpo(), "preference": {"beta": 0.1}})
    assert "its settings go under train.rl" in p["train.preference"].message
    p = problems(tmp_path, grpo(max_completion_length=60), {"max_prompt_length": 16})
    assert "max_completion_length" in p["train.rl.max_completion_length"].message


def test_beta_with_a_reference_that_cannot_be_built(tmp_path):
    p = problems(tmp_path, grpo(beta=0.04), model={"path": "m", "init": "random"}, peft={"method": "full"})
    assert list(p) == ["train.rl.beta"] and "model.init: random" in p["train.rl.beta"].message
    load_recipe(_write(tmp_path, grpo(beta=0.04), model={"path": "m", "init": "random"}))  # LoRA: adapter disabled


def test_vllm_without_cuda_is_a_located_plan_error(tmp_path):
    with pytest.raises(RecipeError) as err:
        compile_plan(load_recipe(_write(tmp_path, grpo(generation={"backend": "vllm"}))), check_inputs=False)
    [p] = [q for q in err.value.problems if q.path.startswith("train.rl")]
    assert p.path == "train.rl.generation.backend" and "CUDA GPUs only" in p.message
    assert "backend: transformers" in p.hint and line_of(p) == "backend: vllm"


def test_a_reward_model_that_is_not_a_sequence_classifier(tmp_path, tiny_model_dir, tiny_cls_model_dir):
    from ftune.plan.checks import model_files

    for folder, want in ((tiny_model_dir, "is not a sequence classifier"), (tmp_path / "nope", "not found"),
                         (tiny_cls_model_dir, "labels; a reward model has one output")):
        recipe = load_recipe(_write(tmp_path, grpo([{"name": "reward_model", "path": str(folder)}]))).recipe
        [p] = model_files.reward_models(recipe)
        assert p.path == "train.rl.rewards[0].path" and want in p.message


def test_answer_readers_need_an_answer_column(tmp_path):
    from ftune.datafiles.check import check_fields

    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": "2+2=", "solution": "4"}) + "\n")
    data = {"train": [{"path": str(tmp_path / "p.jsonl"), "format": "prompt"}]}
    recipe = load_recipe(_write(tmp_path, grpo([{"name": "numeric"}]), data)).recipe
    [(where, message, hint)] = [(p.path, p.message, p.hint) for p in check_fields(recipe)]
    assert where == "data.train[0].fields.answer" and message.startswith("reward numeric compares completions")
    assert "fields: {answer: solution}" in hint
    mapped = {"train": [{"path": str(tmp_path / "p.jsonl"), "format": "prompt", "fields": {"answer": "solution"}}]}
    assert check_fields(load_recipe(_write(tmp_path, grpo([{"name": "numeric"}]), mapped)).recipe) == []
    assert check_fields(load_recipe(_write(tmp_path, grpo([{"name": "regex", "pattern": "4"}]), data)).recipe) == []


def test_prompt_plus_completion_past_the_model_positions(tmp_path, tiny_model_dir):
    from ftune.models.meta import build_meta_model
    from ftune.plan.checks.preflight import completion_position_problems

    recipe = load_recipe(_write(tmp_path, grpo(max_completion_length=500), {"max_prompt_length": 20,
                                                                           "max_seq_length": None},
                                model={"path": str(tiny_model_dir)})).recipe
    [p] = completion_position_problems(recipe, build_meta_model(recipe))
    assert p.path == "train.rl.max_completion_length" and "max_position_embeddings (512" in p.message


# ------------------------------------------------------------------------------ the Plan
def test_plan_writes_trl_defaults_per_objective(tmp_path):
    p = plan(tmp_path, grpo([{"name": "exact_match", "weight": 2.0}, {"name": "length", "target": 8}]))
    assert (p.config_class, p.trainer_class) == ("trl.GRPOConfig", "trl.GRPOTrainer")
    t = p.trainer
    assert (t["num_generations"], t["beta"], t["loss_type"], t["scale_rewards"], t["epsilon"]) == (4, 0.0, "dapo",
                                                                                                   "group", 0.2)
    assert t["reward_weights"] == [2.0, 1.0] and t["use_vllm"] is False and t["remove_unused_columns"] is False
    assert "max_length" not in t  # the preference kwargs are not GRPO's
    assert any("each step samples 1 prompt(s) x 4 completions" in n for n in p.notes)
    assert any("reference: none" in n for n in p.notes)
    r = plan(tmp_path, {"objective": "rloo", "rl": {"rewards": [{"name": "exact_match"}]}}).trainer
    assert (r["num_generations"], r["beta"]) == (2, 0.05) and "loss_type" not in r
    full = plan(tmp_path, grpo(beta=0.04), peft={"method": "full"})
    assert any("a frozen copy of the model" in n for n in full.notes)
    assert not any("processes" in n for n in p.notes)  # one process: nothing is split


def test_plan_notes_how_processes_split_the_generation_batch(tmp_path):
    """8 completions a step on 2 processes: 4 each, one whole group of 4 each; with num_generations 8 a group
    spans both processes (TRL gathers the rewards, so that is allowed)."""
    two = {"distributed": {"strategy": "ddp", "num_processes": 2}}
    [note] = [n for n in plan(tmp_path, grpo(), **two).notes if "processes:" in n]
    assert note.startswith("grpo on 2 processes: each generates 4 of the step's 8 completions (1 whole prompt "
                           "group(s) each)") and "train.seed + rank" in note
    [note] = [n for n in plan(tmp_path, grpo(num_generations=8), **two).notes if "processes:" in n]
    assert "each generates 4 of the step's 8 completions (groups spanning processes)" in note


@pytest.mark.skipif(not HAS_TRL, reason="trl not installed")
@pytest.mark.parametrize("train", [grpo(beta=0.04, loss_type="dr_grpo", scale_rewards="none", temperature=0.7),
                                   {"objective": "rloo", "rl": {"rewards": [{"name": "exact_match"}],
                                                                "num_iterations": 2, "top_p": 0.9}}])
def test_trl_config_class_takes_plan_trainer_unchanged(tmp_path, train):
    from ftune.runtime.train import training_arguments

    p = plan(tmp_path, train)
    args = training_arguments(p)
    assert type(args).__name__ == p.config_class.rpartition(".")[2]
    for key, value in p.trainer.items():
        got = getattr(args, key)
        got = getattr(got, "value", got)
        if key == "report_to":
            value = [value] if isinstance(value, str) else value
        assert got == value, key


# ------------------------------------------------------------------------------ rewards
def score(name: str, completion: str, answer=None, ids=(1, 2, 3), **args) -> float:
    from ftune.plugins import load_object

    plugin = BUILTIN[name]
    return load_object(plugin.make)(plugin.args.model_validate(args))(
        Sample(prompt="p", completion=completion, completion_ids=tuple(ids), answer=answer))


def test_builtin_rewards_score_as_documented():
    assert score("exact_match", "  The Cat.\n", "the   cat") == 1.0
    assert score("exact_match", "the cat sat", "the cat") == 0.0
    assert score("contains", "I think the cat sat", "Cat") == 1.0
    assert score("contains", "a dog", "cat") == 0.0 and score("contains", "a dog", None, text="dog") == 1.0
    assert score("numeric", "so 3 + 4 = 7", "7") == 1.0
    assert score("numeric", "1,234.5 apples", "1234.5") == 1.0
    assert score("numeric", "7 then 8", "7") == 0.0  # the last number counts
    assert score("numeric", "about 3.14", "3.1416", tolerance=0.01) == 1.0
    assert score("numeric", "no number", "3") == 0.0
    with pytest.raises(ValueError, match="holds no number"):
        score("numeric", "3", "three")
    assert score("regex", "Answer: 42", pattern=r"Answer: \d+") == 1.0
    assert score("regex", "x Answer: 42", pattern=r"Answer: \d+", full=True) == 0.0
    assert score("choice", "I pick (B) because", "B") == 1.0
    assert score("choice", "Because A is wrong, C", "c") == 0.0  # the first option letter standing alone is A
    assert score("json", '```json\n{"a": 1, "b": 2}\n```', required=["a", "b"]) == 1.0
    assert score("json", '{"a": 1}', required=["a", "b"]) == 0.0 and score("json", "{nope") == 0.0
    assert score("length", "x", ids=range(10), target=8, penalty=0.5) == -1.0
    assert score("length", "x", ids=range(8), target=8) == 0.0


@pytest.mark.skipif(not HAS_TRL, reason="trl not installed")
def test_trl_builtin_rewards_by_name():
    assert score("think_format", "<think>\nhm\n</think>\nok") == 1.0
    assert score("repetition_penalty", "x", ids=[1, 2, 3, 1, 2, 3, 1, 2, 3]) < 0.0
    assert score("soft_overlong_punishment", "x", ids=range(95), max_completion_len=100, soft_punish_cache=10) < 0


def test_a_reward_that_raises_or_returns_nan_is_named_with_its_row(monkeypatch, tmp_path):
    from ftune.plugins import RewardPlugin
    from ftune.rewards import NoArgs
    from ftune.runtime.rl import reward_function

    spec = SimpleNamespace(name="numeric", args={})
    fn = reward_function(spec, BUILTIN["numeric"])
    assert fn.__name__ == "numeric"
    assert fn(["p", "p"], ["= 4", "= 5"], [[1], [2]], answer=["4", "4"], _row=["r1", "r2"]) == [1.0, 0.0]
    with pytest.raises(RunError) as err:
        fn(["p", "p"], ["= 4", "4"], [[1], [2]], answer=["4", "four"], _row=["data.train[0] row 3 of a.jsonl",
                                                                               "data.train[0] row 9 of a.jsonl"])
    assert err.value.message.startswith("reward 'numeric' failed on data.train[0] row 9 of a.jsonl: ValueError")
    (tmp_path / "nanreward.py").write_text("def make(args):\n    return lambda s: float('nan')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the rewards run in a process of their own
    nan = reward_function(SimpleNamespace(name="mine", args={}), RewardPlugin("nanreward:make", NoArgs))
    with pytest.raises(RunError, match=r"reward 'mine' returned nan on r1"):
        nan(["p"], ["x"], [[1]], _row=["r1"])


def test_plugin_rewards_join_the_registry_and_may_not_shadow_a_builtin(monkeypatch):
    import ftune.plugins as plugins
    import ftune.rewards as rewards
    from ftune.errors import FtuneError
    from ftune.plugins import KINDS, Registry, RewardPlugin

    def registry(**r):
        return Registry({**{k: {} for k in KINDS}, "rewards": r}, {n: "team-rewards 1.0" for n in r})

    monkeypatch.setattr(plugins, "installed", lambda: registry(format_ok=RewardPlugin("m:f", rewards.NoArgs)))
    rewards.available.cache_clear()
    assert "format_ok" in rewards.available() and "exact_match" in rewards.available()
    monkeypatch.setattr(plugins, "installed", lambda: registry(numeric=RewardPlugin("m:f", rewards.NoArgs)))
    rewards.available.cache_clear()
    with pytest.raises(FtuneError, match="plugin team-rewards 1.0 registers reward 'numeric', which is built in"):
        rewards.available()
    rewards.available.cache_clear()


# ------------------------------------------------------------------------------ the guard
def _guard(**rl):
    from ftune.runtime.rl_guard import guard

    section = SimpleNamespace(guard_logs=3, max_completion_length=16, **rl)
    g = guard(SimpleNamespace(recipe=SimpleNamespace(train=SimpleNamespace(objective="grpo", rl=section))))
    g.log_history = []  # the trainer's state.log_history, as Trainer.log keeps it
    return g


def _log(g, step, history=(), **logs):
    """Trainer.log: the log appended to the history, then the callbacks called; `history`: a resumed run's logs
    before its checkpoint (trainer_state.json's), put first."""
    if history and not g.log_history:
        g.log_history.extend(history)
    g.log_history.append(logs)
    g.on_log(None, SimpleNamespace(global_step=step, is_world_process_zero=True, log_history=g.log_history), None,
             logs=logs)
    return logs


def test_guard_maps_trl_names_and_stops_on_flat_rewards_after_n_logs():
    g = _guard()
    logs = _log(g, 1, reward=0.5, frac_reward_zero_std=1.0, **{"completions/mean_length": 3.0,
                                                                "completions/clipped_ratio": 0.0,
                                                                "rewards/exact_match/mean": 0.5})
    assert (logs["zero_advantage_frac"], logs["completion_length"], logs["clipped_ratio"]) == (1.0, 3.0, 0.0)
    _log(g, 2, reward=0.5, frac_reward_zero_std=0.5)  # one group with a spread resets the count
    _log(g, 3, reward=0.5, frac_reward_zero_std=1.0)
    _log(g, 4, reward=0.5, frac_reward_zero_std=1.0)
    with pytest.raises(RunError) as err:
        _log(g, 5, reward=0.0, frac_reward_zero_std=1.0, **{"rewards/exact_match/mean": 0.0})
    assert "identical rewards for 3 logs in a row (step 5" in err.value.message and "exact_match 0" in err.value.message
    assert "completions.jsonl" in err.value.hint


def test_guard_trains_on_when_the_rewards_saturate_at_the_runs_best(capsys):
    """A solved task scores every completion alike: identical rewards after they varied, at the best mean the run
    has logged, are a note, not a stop (the demo-sized GRPO run reaches exact_match 1 for every group)."""
    g = _guard()
    _log(g, 2, reward=0.4, frac_reward_zero_std=0.5)
    _log(g, 4, reward=0.9, frac_reward_zero_std=0.75)
    for step in (6, 8, 10, 12, 14):
        _log(g, step, reward=1.0, frac_reward_zero_std=1.0)
    err = capsys.readouterr().err
    assert err.count("saturated") == 1 and "at the run's best mean reward (1, step 10)" in err


def test_guard_reads_a_resumed_runs_history_before_calling_flat_rewards_saturated():
    """A run resumed after its rewards varied (trainer_state.json's log history) saturates as the unbroken run
    would; resumed with a history that never varied, it still stops."""
    varied = [{"step": 2, "reward": 0.5, "frac_reward_zero_std": 0.5}, {"step": 4, "loss": 0.1}]
    g = _guard()
    for step in (6, 8, 10, 12):
        _log(g, step, history=varied, reward=1.0, frac_reward_zero_std=1.0)
    g = _guard()
    with pytest.raises(RunError, match="identical rewards"):
        for step in (6, 8, 10):
            _log(g, step, history=[{"step": 2, "reward": 0.0, "frac_reward_zero_std": 1.0}], reward=0.0,
                 frac_reward_zero_std=1.0)


@pytest.mark.parametrize("history", [
    [],  # identical from the first log: a reward that never tells completions apart
    [(0.9, 0.5)],  # the rewards varied, then fell flat below the run's best: collapsed, not solved
], ids=["never-varied", "below-best"])
def test_guard_still_stops_on_flat_rewards_that_are_not_saturation(history):
    g = _guard()
    for step, (reward, zero_std) in enumerate(history, 1):
        _log(g, step, reward=reward, frac_reward_zero_std=zero_std)
    with pytest.raises(RunError, match="identical rewards for 3 logs in a row"):
        for step in range(len(history) + 1, len(history) + 4):
            _log(g, step, reward=1.0 if not history else 0.5, frac_reward_zero_std=1.0)


def test_guard_stops_when_every_completion_is_clipped():
    g = _guard()
    for step in (1, 2):
        _log(g, step, reward=0.1, frac_reward_zero_std=0.0, **{"completions/clipped_ratio": 1.0})
    with pytest.raises(RunError) as err:
        _log(g, 3, reward=0.1, frac_reward_zero_std=0.0, **{"completions/clipped_ratio": 1.0})
    assert "every completion hit max_completion_length (16 tokens)" in err.value.message
    assert "eos" in err.value.hint
    g = _guard()
    for step in range(1, 6):  # most, not all, clipped: trains on
        _log(g, step, reward=0.1, frac_reward_zero_std=0.0, **{"completions/clipped_ratio": 0.97})


# ------------------------------------------------------------------------------ data
def test_summary_totals_generation_and_training_time_over_logging_windows():
    """metrics.jsonl holds per-step means over each window; summary.json's totals weight them by the window's steps
    (a resumed run's repeated steps count once); runs without online RL get no such keys."""
    from ftune.worker.report import rl_times

    records = [{"step": 1, "generation_time": 2.0, "training_time": 1.0, "generated_tokens": 10.0, "reward": 0.1},
               {"step": 4, "generation_time": 1.0, "training_time": 0.5, "generated_tokens": 20.0, "reward": 0.2},
               {"step": 4, "eval_loss": 0.3},
               {"step": 4, "generation_time": 9.0, "training_time": 9.0, "generated_tokens": 99.0},  # resumed at 4
               {"step": 6, "generation_time": 0.5, "training_time": 0.5, "generated_tokens": 5.0}]
    got = rl_times(records)
    # generation 2 + 3*1 + 2*0.5 = 6, training 1 + 3*0.5 + 2*0.5 = 3.5, tokens 10 + 60 + 10 = 80
    assert got == {"generation_seconds": 6.0, "training_seconds": 3.5, "generated_tokens": 80,
                   "generated_tokens_per_second": round(80 / 9.5, 2)}
    assert rl_times([{"step": 5, "loss": 1.0}]) == {}


def test_step_timer_splits_each_step_into_generation_and_the_rest(monkeypatch):
    """The trainer's `_generate` adds its seconds and the tokens of every process to the step; the timer logs
    them and the rest of the step's wall time as TRL's per-step metrics."""
    from collections import defaultdict

    from ftune.runtime import rl

    clock = iter([10.0, 13.5])
    monkeypatch.setattr(rl.time, "perf_counter", lambda: next(clock))
    trainer = SimpleNamespace(_metrics={"train": defaultdict(list)})
    timer = rl.step_timer(trainer)
    timer.on_step_begin(None, None, None)
    trainer._ftune_step[1] += 2.0  # what _generate adds
    trainer._ftune_step[2] += 48.0
    timer.on_step_end(None, None, None)
    assert dict(trainer._metrics["train"]) == {"generation_time": [2.0], "training_time": [1.5],
                                               "generated_tokens": [48.0]}


def test_prompt_rows_render_chat_and_keep_answer_and_columns(tmp_path, tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    from tests.data_stage import build

    rows = [{"question": [{"role": "user", "content": f"what is {i}+1?"}], "solution": i + 1, "level": "easy"}
            for i in range(3)] 
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = {"train": [{"path": str(tmp_path / "p.jsonl"), "format": "prompt",
                       "fields": {"prompt": "question", "answer": "solution"}}], "shuffle": False}
    recipe = load_recipe(_write(tmp_path, grpo([{"name": "numeric"}]), data)).recipe
    b = build(recipe, AutoTokenizer.from_pretrained(tiny_tokenizer_dir), log=lambda *a: None)
    assert b.collator is None
    assert sorted(b.train.column_names) == ["_row", "answer", "level", "prompt"]
    row = b.train[0]
    assert row["prompt"].endswith("<|assistant|>\n") and "what is 0+1?" in row["prompt"]
    assert (row["answer"], row["level"], row["_row"]) == ("1", "easy", f"data.train[0] row 1 of {tmp_path}/p.jsonl")


# ------------------------------------------------------------------------------ objective: reward
PAIRS = [{"path": "pairs.jsonl", "format": "preference"}]


def test_reward_objective_needs_a_one_logit_classifier(tmp_path):
    p = problems(tmp_path, {"objective": "reward"}, {"train": PAIRS})
    assert list(p) == ["model.task"] and "sequence classifier with one output" in p["model.task"].message
    p = problems(tmp_path, {"objective": "reward"}, {"train": PAIRS},
                 model={"path": "m", "task": "sequence-classification", "labels": ["a", "b"]})
    assert list(p) == ["model.labels"]
    r = plan(tmp_path, {"objective": "reward"}, {"train": PAIRS}, model={"path": "m", "task": "sequence-classification"})
    assert (r.config_class, r.trainer_class) == ("trl.RewardConfig", "trl.RewardTrainer")
    assert (r.trainer["max_length"], r.trainer["disable_dropout"]) == (64, True)


def test_reward_model_config_has_one_label(tmp_path, tiny_model_dir):
    from ftune.models.config import load_config

    recipe = load_recipe(_write(tmp_path, {"objective": "reward"}, {"train": PAIRS},
                                model={"path": str(tiny_model_dir), "task": "sequence-classification"})).recipe
    config = load_config(recipe)
    assert config.num_labels == 1 and config.id2label == {0: "reward"}


@pytest.mark.skipif(not HAS_TRL, reason="trl not installed")
def test_reward_config_takes_plan_trainer_unchanged(tmp_path):
    from ftune.runtime.train import training_arguments

    p = plan(tmp_path, {"objective": "reward"}, {"train": PAIRS}, model={"path": "m", "task": "sequence-classification"})
    args = training_arguments(p)
    assert type(args).__name__ == "RewardConfig" and args.max_length == 64


def test_ftune_data_shows_rendered_prompts_and_answers(tmp_path, tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    from ftune.cli.data import prompt_samples
    from tests.data_stage import build

    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"prompt": f"Q: {i}+1\nA:", "answer": str(i + 1)}) + "\n"
                                              for i in range(3)))
    data = {"train": [{"path": str(tmp_path / "p.jsonl"), "format": "prompt"}], "shuffle": False}
    tok = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    b = build(load_recipe(_write(tmp_path, grpo(), data)).recipe, tok, log=lambda *a: None)
    [s] = prompt_samples(tok, b.train, 1)
    assert (s["runs"][0]["text"], s["answer"], s["runs"][0]["trained"]) == ("Q: 0+1\nA:", "1", False)
    assert s["source"].startswith("data.train[0] row 1 of")


# ------------------------------------------------------------------------------ QLoRA: the head trained beside
def test_saved_module_copies_go_back_to_the_dtype_they_copy(tiny_model_dir):
    """TRL's GRPO/RLOO cast a quantized model's trainable parameters to bf16; the lm_head copy of
    `modules_to_save` then met float32 hidden states in its first forward (float != BFloat16), which stopped
    QLoRA + GRPO. The worker casts that copy back to its original's dtype; the LoRA layers keep TRL's bf16."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from ftune.runtime.rl import restore_saved_modules_dtype

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                           LoraConfig(r=4, target_modules=["q_proj"], modules_to_save=["lm_head"]))
    for p in model.parameters():  # what TRL does to a quantized model's trainable parameters
        if p.requires_grad:
            p.data = p.data.to(torch.bfloat16)
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(RuntimeError, match="dtype"):
        model(input_ids=ids)
    assert restore_saved_modules_dtype(model) == 1 and restore_saved_modules_dtype(model) == 0
    head = model.base_model.model.lm_head.modules_to_save["default"].weight
    assert head.dtype == torch.float32 and head.requires_grad
    assert {p.dtype for n, p in model.named_parameters() if "lora_" in n} == {torch.bfloat16}
    assert torch.isfinite(model(input_ids=ids).logits).all()
