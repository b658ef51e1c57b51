"""GRPO and RLOO learn through `ftune run` on the tiny model: a short SFT stage teaches it to answer `Q: ...\nA:`
with one of four words and end (eos); RL then rewards one of them (`exact_match` against each row's answer). Mean
reward rises from the first logs to the last, and held-out greedy exact match rises from the SFT model's to the
RL model's. GRPO with full fine-tuning, with LoRA (q/v, the output head trained in full beside it: see LORA_HEAD
for why) and with the same on a 4-bit base (QLoRA), RLOO with full fine-tuning. `ftune eval` scores the rewards on
held-out prompts. GRPO + LoRA on 2 processes (DDP and FSDP2) against one process, with row-seeded sampling
(ROW_SAMPLING), and SIGTERM + resume are extended runs.

One SFT run and one run per objective (module-scoped), shared by the tests that read them."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from ftune.rundir import RunDir
from ftune.tiny import WORDS
from tests.e2e._util import base_recipe, ftune, metrics, write_recipe

pytestmark = [pytest.mark.slow, pytest.mark.skipif(__import__("importlib").util.find_spec("trl") is None,
                                                   reason="needs trl (pip install 'ftune[preference]')")]

ANSWERS = ("cat", "dog", "sun", "rain")
TARGET = "sun"
FILLER = [w for w in WORDS if w not in ANSWERS]
TEMPLATE = "Q: {instruction}\nA:"


def questions(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(FILLER) for _ in range(3)) for _ in range(n)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run(folder: Path, recipe: dict, expect: int = 0):
    res = ftune("run", str(write_recipe(folder, recipe)), cwd=folder)
    assert res.code == expect, res.text
    return folder / recipe["output"]["dir"], res


def rl_recipe(model: Path, data: Path, objective: str, out: str, **rl) -> dict:
    return base_recipe(
        model, data,
        data={"train": [{"path": str(data), "format": "prompt"}], "eval": None, "max_seq_length": None},
        peft={"method": "full"},
        train={"objective": objective, "max_steps": 16, "logging_steps": 4, "learning_rate": 5e-3, "lr_scheduler": "constant",
               "per_device_batch_size": 16, "seed": 3,
               "rl": {"rewards": [{"name": "exact_match"}], "num_generations": 4, "max_completion_length": 4,
                      "beta": 0.0, **rl}},
        eval={"strategy": "no"}, checkpoint={"strategy": "no"},
        output={"dir": out, "report_to": ["none"], "loss_curve": False},
    )


@pytest.fixture(scope="module")
def work(tmp_path_factory, tiny_model_dir) -> dict:
    """The SFT stage: any of ANSWERS (at random) after `A:`, then eos."""
    folder = tmp_path_factory.mktemp("rl")
    rng = random.Random(1)
    sft_rows = [{"instruction": q, "output": f" {rng.choice(ANSWERS)}"} for q in questions(256, seed=1)]
    write_jsonl(folder / "sft.jsonl", sft_rows)
    write_jsonl(folder / "prompts.jsonl", [{"prompt": TEMPLATE.format(instruction=q), "answer": TARGET}
                                           for q in questions(128, seed=2)])
    recipe = base_recipe(tiny_model_dir, folder / "sft.jsonl",
                         data={"train": [{"path": str(folder / "sft.jsonl"), "format": "instruction",
                                          "template": TEMPLATE}], "eval": None},
                         train={"max_steps": 40, "learning_rate": 3e-3, "per_device_batch_size": 16, "seed": 1,
                                "logging_steps": 10},
                         eval={"strategy": "no"}, checkpoint={"strategy": "no"},
                         output={"dir": "runs/sft", "report_to": ["none"], "loss_curve": False})
    recipe["peft"] = {"method": "full"}
    sft, _ = run(folder, recipe)
    return {"folder": folder, "sft": sft / "final", "heldout": [TEMPLATE.format(instruction=q)
                                                                  for q in questions(40, seed=3)]}


@pytest.fixture(scope="module")
def rl_runs(work) -> dict:
    cache: dict[str, Path] = {}

    def get(name: str) -> Path:
        """`grpo`, `rloo` (full fine-tuning), `grpo-lora` or `grpo-qlora` (LORA_HEAD on the 4-bit base)."""
        if name not in cache:
            recipe = rl_recipe(work["sft"], work["folder"] / "prompts.jsonl", name.split("-")[0], f"runs/{name}")
            if name.endswith("lora"):
                recipe["peft"] = LORA_HEAD
            if name.endswith("-qlora"):
                recipe["quantization"] = {"bits": 4, "compute_dtype": "float32"}
            cache[name], _ = run(work["folder"], recipe)
        return cache[name]

    return get


NEEDS_BNB = pytest.mark.skipif(__import__("importlib").util.find_spec("bitsandbytes") is None,
                               reason="needs bitsandbytes (pip install 'ftune[quant]')")
LORA_HEAD = {"method": "lora", "r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"],
             "modules_to_save": ["lm_head"]}
"""LoRA for GRPO on the tiny model: the adapter on q/v and the output head trained in full beside it. On this model
the reward is learned through the head: GRPO training only lm_head rose 0.31 -> 0.67 in 16 steps, training every
decoder layer in full (the head frozen) fell 0.31 -> 0.19, and LoRA alone (which TRL can't put on lm_head) stayed
flat over 48 steps at lr 5e-3 (0.31 -> 0.19) and collapsed into clipped gibberish at 1e-2. Measured on the 2-core
machine, this module's SFT model and recipe (docs/rl.md)."""


@pytest.mark.parametrize("name", ["grpo", pytest.param("grpo-lora", marks=pytest.mark.extended),
                                  pytest.param("grpo-qlora", marks=[pytest.mark.extended, NEEDS_BNB]),
                                  pytest.param("rloo", marks=pytest.mark.extended)])
def test_rl_raises_the_reward_and_held_out_exact_match(name, rl_runs, work):
    out = rl_runs(name)
    logs = [r for r in metrics(out) if "reward" in r]
    assert [r["step"] for r in logs] == [1, 4, 8, 12, 16]
    first, last = logs[0], logs[-1]
    # the SFT model says TARGET about a quarter of the time; RL makes it the answer (measured: full 0.31 -> 0.84,
    # LoRA + head 0.31 -> 0.64, QLoRA (4-bit base) + head 0.31 -> 0.66 by step 16)
    assert first["reward"] <= 0.5 and last["reward"] > first["reward"] + 0.25, [r["reward"] for r in logs]
    assert last["reward"] >= (0.55 if name.endswith("lora") else 0.7)
    assert last["rewards/exact_match/mean"] == last["reward"]  # one reward of weight 1
    for key in ("reward_std", "rewards/exact_match/std", "zero_advantage_frac", "completion_length",
                "clipped_ratio"):
        assert key in last, key
    assert last["clipped_ratio"] < 0.5  # the SFT stage taught it to end its answers
    # generation and the rest of each step timed apart (per step, means over the window), and their totals
    assert all(r["generation_time"] > 0 and r["training_time"] > 0 for r in logs), logs
    summary = json.loads((out / "summary.json").read_text())
    assert summary["generation_seconds"] > 0 and summary["training_seconds"] > 0
    windows = [b["step"] - a["step"] for a, b in zip([{"step": 0}, *logs], logs)]
    tokens = sum(w * r["completion_length"] * 16 for w, r in zip(windows, logs))  # 16 completions a step
    assert summary["generated_tokens"] == round(tokens) > 0
    seconds = summary["generation_seconds"] + summary["training_seconds"]
    assert summary["generated_tokens_per_second"] == pytest.approx(tokens / seconds, rel=1e-2)
    before, after = exact_match(work["sft"], work["heldout"]), exact_match(final_model(out), work["heldout"])
    assert before <= 0.5 and after >= 0.9, (before, after)
    sample = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert sample and set(sample[-1]) >= {"step", "prompt", "completion", "rewards"}
    assert sample[-1]["rewards"]["exact_match"] in (0.0, 1.0) and sample[-1]["prompt"].startswith("Q: ")


@pytest.mark.extended
def test_grpo_with_paged_generation_trains(work):
    """`backend: paged`: TRL's transformers continuous batching generates (the Plan's cache handed to it), the
    rewards vary within groups, and two steps move the weights. The completions are the same as generate's for
    greedy decoding (tests/unit/test_paged_generation.py); sampled ones differ in their random draws."""
    from safetensors.torch import load_file

    recipe = rl_recipe(work["sft"], work["folder"] / "prompts.jsonl", "grpo", "runs/grpo-paged",
                       generation={"backend": "paged"})
    recipe["train"] |= {"max_steps": 2, "logging_steps": 1}
    out, _ = run(work["folder"], recipe)
    trainer = json.loads((out / "plan.json").read_text())["trainer"]
    assert trainer["use_transformers_continuous_batching"] is True
    assert trainer["transformers_continuous_batching_config"]["num_blocks"] >= 16  # one page per completion at least
    logs = [r for r in metrics(out) if "reward" in r]
    assert [r["step"] for r in logs] == [1, 2]
    assert all(r["generated_tokens"] > 0 and 0 < r["completion_length"] <= 4 for r in logs), logs
    assert any(r["reward_std"] > 0 and r["grad_norm"] > 0 for r in logs), logs  # something to learn, and learnt
    before, after = load_file(work["sft"] / "model.safetensors"), load_file(out / "final" / "model.safetensors")
    assert max((after[k] - before[k]).abs().max().item() for k in before) > 0


LOSSES = {"grpo": {}, "dr_grpo": {}, "dapo": {}, "bnpo": {}, "cispo": {}, "sapo": {}, "luspo": {}, "vespo": {},
          "gspo": {"importance_sampling_level": "sequence"},
          "dapo-clip-higher": {"epsilon_high": 0.28, "mask_truncated_completions": True},
          "grpo-high-entropy": {"top_entropy_quantile": 0.5}}


@pytest.mark.extended
@pytest.mark.parametrize("variant", list(LOSSES))
def test_every_loss_type_raises_the_reward(variant, work):
    """Each GRPO loss of the schema, GSPO (sequence-level ratios) and the clip-higher / masking / entropy knobs
    train the SFT model towards the target: the reward rises by a quarter over 16 steps, as the default's does."""
    loss = variant.split("-")[0]
    rl = {**({"loss_type": loss} if loss in LOSSES and loss != "gspo" else {}), **LOSSES[variant]}
    out, _ = run(work["folder"], rl_recipe(work["sft"], work["folder"] / "prompts.jsonl", "grpo",
                                           f"runs/loss-{variant}", **rl))
    plan = json.loads((out / "plan.json").read_text())["trainer"]
    assert plan["loss_type"] == (rl.get("loss_type") or ("grpo" if variant == "gspo" else "dapo"))
    logs = [r["reward"] for r in metrics(out) if "reward" in r]
    assert logs[-1] > logs[0] + 0.25, logs


def test_eval_scores_the_recipes_rewards_on_eval_prompts(rl_runs, work):
    """`ftune eval` of an RL recipe: each reward's mean over greedy completions of the eval prompts. Half the
    held-out rows expect TARGET (which GRPO taught), half another word, so the score sits between 0 and 1, and it
    equals the test's own greedy exact match row by row."""
    out = rl_runs("grpo")
    folder = work["folder"]
    half = len(work["heldout"]) // 2
    rows = [{"prompt": p, "answer": TARGET if i < half else "cat"} for i, p in enumerate(work["heldout"])]
    heldout = write_jsonl(folder / "heldout.jsonl", rows)
    recipe = rl_recipe(work["sft"], folder / "prompts.jsonl", "grpo", "runs/grpo")
    recipe["data"]["eval"] = [{"path": str(heldout), "format": "prompt"}]
    write_recipe(folder, recipe, "eval.yaml")
    res = ftune("eval", "eval.yaml", "--format", "json", cwd=folder)  # the run's final/
    assert res.code == 0, res.text
    got = json.loads(res.out)["metrics"]
    final = out / "final"
    expected = (exact_match(final, work["heldout"][:half]) + exact_match(final, work["heldout"][half:], "cat")) / 2
    assert got["eval_rewards/exact_match/mean"] == pytest.approx(expected) and 0.3 <= expected <= 0.7, (got, expected)
    assert got["eval_reward"] == got["eval_rewards/exact_match/mean"] and got["eval_generated"] == 40
    assert got["eval_rewards/exact_match/std"] > 0 and got["eval_clipped_ratio"] < 0.5


@pytest.fixture(scope="module")
def reward_run(work, tiny_model_dir) -> Path:
    """`objective: reward` on pairs whose chosen answer is TARGET alone and rejected one of the others, TARGET among
    other words, TARGET repeated, or no answer at all. Trained on single words only, the model scored `dog sun sun
    sun` above `sun`, and GRPO learned to say that (reward up, every completion clipped); without the answer-less
    pairs it scored `A:` + eos (an empty completion) above ` sun`, and GRPO learned to say nothing (reward -0.0 ->
    2.4, held-out exact match 0.0); without the repeated ones, `sun sun sun sun` (2.33) above `sun` (2.23), and 91%
    of the completions ended clipped: a reward model is hacked where its data is thin."""
    rng = random.Random(4)
    others = [a for a in ANSWERS if a != TARGET]

    def pair(q: str) -> dict:
        prompt, r = TEMPLATE.format(instruction=q), rng.random()
        if r < 0.2:  # no answer: `A:` then eos (the row's prompt stops before the colon, as no field may be empty)
            return {"prompt": prompt[:-1], "chosen": f": {TARGET}", "rejected": ":"}
        if r < 0.45:
            words = [rng.choice(others)]
        elif r < 0.75:
            words = rng.sample([*others, TARGET, TARGET], 3)
        else:  # TARGET said again and again
            words = [TARGET] * rng.randint(2, 4)
        return {"prompt": prompt, "chosen": f" {TARGET}", "rejected": " " + " ".join(words)}

    data = write_jsonl(work["folder"] / "pairs.jsonl", [pair(q) for q in questions(240, seed=4)])
    recipe = base_recipe(tiny_model_dir, data,
                         model={"path": str(tiny_model_dir), "dtype": "float32", "task": "sequence-classification"},
                         data={"train": [{"path": str(data), "format": "preference"}], "eval": {"split": 0.15}},
                         peft={"method": "full"},
                         train={"objective": "reward", "max_steps": 60, "learning_rate": 3e-3,
                                "per_device_batch_size": 16, "seed": 4, "logging_steps": 10},
                         eval={"strategy": "steps", "steps": 60, "on_start": True}, checkpoint={"strategy": "no"},
                         output={"dir": "runs/reward", "report_to": ["none"], "loss_curve": False})
    out, _ = run(work["folder"], recipe)
    return out


@pytest.mark.extended
def test_reward_model_learns_the_rule_and_drives_grpo(reward_run, work):
    """Held-out pairwise accuracy from chance to >= 0.9, then the model's logit is the reward of a GRPO run, which
    learns the rule: mean reward up, held-out greedy exact match from the SFT model's to >= 0.9. With
    `scale_rewards: none`: the reward model's scores for two wrong answers differ by a few hundredths, and the
    default group scaling divides each group by its spread, so that noise became full-size advantages and the policy
    drifted into byte soup (reward -0.80 -> -1.90, 81% clipped; binary rewards don't do this: an all-equal group
    has no advantage at all)."""
    evals = [r for r in metrics(reward_run) if "eval_accuracy" in r]
    assert evals[0]["step"] == 0 and evals[-1]["eval_accuracy"] >= 0.9, evals  # held-out pairs
    config = json.loads((reward_run / "final" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForSequenceClassification"] and len(config["id2label"]) == 1

    recipe = rl_recipe(work["sft"], work["folder"] / "prompts.jsonl", "grpo", "runs/grpo-rm",
                       rewards=[{"name": "reward_model", "path": str(reward_run / "final")}], scale_rewards="none")
    out, _ = run(work["folder"], recipe)
    logs = [r for r in metrics(out) if "reward" in r]
    curve = [(r["step"], r["rewards/reward_model/mean"], r["clipped_ratio"]) for r in logs]
    # measured: -1.68, -2.03, 0.06, 1.69, 0.44 (none clipped at the end), held-out exact match 0.0 -> 1.0
    assert logs[-1]["reward"] > logs[0]["reward"] + 1.0 and logs[-1]["clipped_ratio"] < 0.5, curve
    before, after = exact_match(work["sft"], work["heldout"]), exact_match(out / "final", work["heldout"])
    assert before <= 0.5 and after >= 0.9, (before, after, curve)
    sample = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert set(sample[-1]["rewards"]) == {"reward_model"}


ROW_SAMPLING = Path(__file__).parents[1] / "data" / "row_sampling"
"""A sitecustomize that makes each completion's sampling noise depend only on its row in the global generation
batch (see its docstring): with it, 1 and 2 processes sample the same completions, so their curves must agree step
for step. Without it they agree only statistically, and this recipe is too noisy for that to be a test: with
natural sampling one process collapsed to reward 0 on seeds 5 and 6 (0.25 -> 0, 0.12 -> 0) and learned on 3 and
4, while 2 processes learned on seeds 4, 5, 6 (-> 0.80, 0.80, 0.70) and not on 3 (0.19 -> 0.12): that seed-3
pair was the "2 processes don't learn" of the old strict xfail."""
TWO = {"ddp": {"strategy": "ddp", "num_processes": 2}, "fsdp": {"strategy": "fsdp", "num_processes": 2}}
# Stated tolerance: the same completions and rewards on both sides, so the rewards are equal (they are counts of
# 1/16); loss and grad norm differ only by the order of the gradient reductions' float sums (measured on the 2-core
# machine over 16 steps: <= 1.1e-7 relative with DDP, 3.9e-7 with FSDP2; the final adapter <= 1.6e-6 on both).
RTOL = 1e-4
WEIGHT_ATOL = 1e-4


@pytest.fixture(scope="module")
def row_sampled(work) -> dict:
    """GRPO + LoRA (LORA_HEAD) runs with row-seeded sampling (ROW_SAMPLING): `one` process (16 completions a step),
    or `ddp` / `fsdp` on 2 processes with 8 completions each: the same 4 prompts x 4 completions a step."""
    import os

    cache: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in cache:
            folder = work["folder"]
            recipe = rl_recipe(work["sft"], folder / "prompts.jsonl", "grpo", f"runs/rows-{kind}")
            recipe["peft"] = LORA_HEAD
            if kind != "one":
                recipe["train"]["per_device_batch_size"] = 8
                recipe["distributed"] = TWO[kind]
            env = {"FTUNE_ROW_SAMPLING": str(folder / f"rows-{kind}"), "FTUNE_RECORD_FACTS": "1",
                   "PYTHONPATH": os.pathsep.join(p for p in (str(ROW_SAMPLING), os.environ.get("PYTHONPATH")) if p),
                   **({"OMP_NUM_THREADS": "1"} if kind != "one" else {})}
            res = ftune("run", str(write_recipe(folder, recipe, f"rows-{kind}.yaml")), cwd=folder, timeout=600,
                        env=env)
            assert res.code == 0, res.text[-3000:]
            cache[kind] = folder / recipe["output"]["dir"]
        return cache[kind]

    return get


def generated(work: dict, kind: str, rank: int) -> list[list[list[int]]]:
    """What `rank` of the `kind` run generated (ROW_SAMPLING's record): per generate call, the completions' ids."""
    record = work["folder"] / f"rows-{kind}" / f"rank{rank}.jsonl"
    return [json.loads(line)["rows"] for line in record.read_text().splitlines()]


@pytest.mark.distributed
@pytest.mark.extended
@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
def test_grpo_lora_on_two_processes_splits_the_generations_and_learns_as_one_process(kind, row_sampled, work):
    """GRPO + LoRA (q/v, the head in full) on 2 processes (gloo): each rank generates its own 8 of the step's 16
    completions (2 prompts x 4: TRL hands each process whole groups and gathers the rewards for the advantages),
    rank 0's and rank 1's rows together are the one-process run's rows, and with the same completions the curve
    (reward, loss, grad norm at every log) and the final adapter equal one process's within RTOL / WEIGHT_ATOL."""
    from safetensors.torch import load_file

    one, two = row_sampled("one"), row_sampled(kind)
    ranks = [json.loads(RunDir(two).rank_facts(r).read_text()) for r in (0, 1)]
    assert [f["world_size"] for f in ranks] == [2, 2], ranks
    for f in ranks:  # the wrapping is real: DDP, or FSDP2 units whose every parameter is sharded
        if kind == "ddp":
            assert f["wrapper"] == "DistributedDataParallel" and f["fsdp_units"] == 0, f
        else:
            assert f["distributed_type"] == "FSDP" and f["fsdp_version"] == 2, f
            assert "FSDPLlamaDecoderLayer" in f["fsdp_unit_classes"] and f["dtensor_params"] == f["params"] > 0, f
    groups = []
    for f in ranks:  # 8 rows: 2 prompts, each repeated num_generations (4) times in a row
        p = f["first_batch_prompts"]
        assert len(p) == 8 and p[:4] == [p[0]] * 4 and p[4:] == [p[4]] * 4 and p[0] != p[4], p
        groups.append({p[0], p[4]})
    assert not groups[0] & groups[1]  # the ranks split the prompts

    alone, rank0, rank1 = generated(work, "one", 0), generated(work, kind, 0), generated(work, kind, 1)
    assert len(alone) == len(rank0) == len(rank1) == 16  # one generate call a step on every rank
    assert all(len(rows) == 16 for rows in alone) and all(len(r0) == len(r1) == 8 for r0, r1 in zip(rank0, rank1))
    # each rank generated its own completions (at step 1 the SFT model answers at random; late in the run both
    # ranks may say ` sun` 8 times alike), which together are the one-process batch, step by step
    assert rank0[0] != rank1[0]
    assert [r0 + r1 for r0, r1 in zip(rank0, rank1)] == alone

    want, got = [r for r in metrics(one) if "reward" in r], [r for r in metrics(two) if "reward" in r]
    assert [r["step"] for r in got] == [r["step"] for r in want] == [1, 4, 8, 12, 16]
    for a, b in zip(want, got):
        assert b["reward"] == pytest.approx(a["reward"], abs=1e-9), (a["step"], a["reward"], b["reward"])
        for key in ("loss", "grad_norm", "clipped_ratio"):
            assert b[key] == pytest.approx(a[key], rel=RTOL, abs=1e-7), (a["step"], key, a[key], b[key])
    # and it learns (measured with this sampling: 0.25 -> 0.86 on both)
    assert got[0]["reward"] <= 0.5 and got[-1]["reward"] >= got[0]["reward"] + 0.3, [r["reward"] for r in got]

    ref, out = (load_file(run / "final" / "adapter_model.safetensors") for run in (one, two))
    assert sorted(out) == sorted(ref) and any("lm_head" in k for k in out)  # the trained head copy is saved
    for name, tensor in ref.items():
        assert (out[name] - tensor).abs().max() <= WEIGHT_ATOL, name


@pytest.mark.extended
def test_sigterm_leaves_a_checkpoint_that_a_rerun_resumes_to_the_last_step(work):
    """SIGTERM to `ftune run` mid-GRPO: the run stops at its last complete step, checkpointed (exit 143, no final/),
    and the same command resumes from it (TRL regenerates the batch it had buffered) to max_steps, logging the steps after."""
    import os
    import signal

    from tests.faults.test_run_faults import _workers_of
    from tests.held import start_held, wait_held

    folder = work["folder"]
    recipe = rl_recipe(work["sft"], folder / "prompts.jsonl", "grpo", "runs/grpo-term")
    recipe["train"].update(max_steps=STEPS_TERM, logging_steps=2)
    recipe["checkpoint"] = {"strategy": "steps", "steps": 4, "keep": None, "resume": "auto"}
    path = write_recipe(folder, recipe, "grpo-term.yaml")
    proc = start_held(path, folder, 4, folder / "hold-grpo-term")  # after checkpoint-4, whatever the CPU's speed
    run_dir = folder / "runs/grpo-term"
    assert wait_held(proc, folder / "hold-grpo-term") == 4
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "stopped by SIGTERM at step" in err and "Traceback" not in err
    step = int(err.split("stopped by SIGTERM at step ")[1].split(";")[0])
    # The signal came while the run was held before step 5: step 5 starts with the stop already asked for, so its
    # rewards are abandoned (runtime/reward_pool.py: a stop while rewards score loses that step) and the run ends
    # at step 4, whose checkpoint was saved before the hold
    assert step == 4, err
    assert (run_dir / f"checkpoints/checkpoint-{step}/ftune_complete.json").is_file()
    assert not (run_dir / "final").exists() and _workers_of(run_dir / "plan.json") == []

    res = ftune("run", str(path), cwd=folder)
    assert res.code == 0, res.text
    assert json.loads((run_dir / "plan.json").read_text())["resume_from"].endswith(f"checkpoint-{step}")
    assert (run_dir / "final" / "ftune_complete.json").is_file()
    logs = [r for r in metrics(run_dir) if "reward" in r]
    assert logs[-1]["step"] == STEPS_TERM and any(step < r["step"] < STEPS_TERM for r in logs), logs
    assert all(r["generation_time"] > 0 for r in logs if r["step"] > step)  # generating again after the resume
    sampled = [json.loads(line)["step"] for line in (run_dir / "completions.jsonl").read_text().splitlines()]
    assert max(sampled) == STEPS_TERM


STEPS_TERM = 40


def final_model(out: Path) -> Path:
    """The run's final/ as a full model: an adapter merged into its base by `ftune merge` (its own check: the
    merged logits equal the adapter's)."""
    if not (out / "final" / "adapter_config.json").is_file():
        return out / "final"
    if not (out / "merged").is_dir():
        res = ftune("merge", str(out), "--dtype", "float32", cwd=out.parent)
        assert res.code == 0, res.text
    return out / "merged"


def exact_match(folder: Path, prompts: list[str], target: str = TARGET) -> float:
    """Greedy held-out exact match of the model's answer against `target` (what `exact_match` rewards)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    hits = 0
    with torch.no_grad():
        for p in prompts:
            ids = tok(p, return_tensors="pt", add_special_tokens=False)["input_ids"]
            out = model.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=tok.eos_token_id,
                                 pad_token_id=tok.pad_token_id)
            hits += tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip() == target
    return hits / len(prompts)
