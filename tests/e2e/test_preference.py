"""Each preference objective trains through `ftune run` on the tiny model with LoRA, on synthetic pairs with a
learnable rule: the held-out preference accuracy rises to >= 0.9 and the chosen-minus-rejected reward margin grows.
Also: `ftune eval` on a preference run, resume from a DPO checkpoint, early stopping on eval_rewards/accuracies.

One run per objective (module-scoped), shared by the tests that read it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from ftune.tiny import WORDS
from tests.e2e._util import base_recipe, ftune, metrics, write_recipe

pytestmark = [pytest.mark.slow, pytest.mark.skipif(__import__("importlib").util.find_spec("trl") is None,
                                                   reason="needs trl (pip install 'ftune[preference]')")]

GOOD, BAD = ("cat", "sun", "books"), ("dog", "rain", "birds")
FILLER = [w for w in WORDS if w not in GOOD + BAD]
SEED = 5


def preference_rows(n: int, seed: int) -> list[dict]:
    """A learnable rule: the chosen answer opens with a GOOD word, the rejected one with a BAD word, the rest is the
    same. Which words are good is arbitrary to the untrained model, so a reference-free score (orpo, simpo) starts
    near chance; dpo and kto score against the reference, which the policy equals at the start (margin 0)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        words = " ".join(rng.choice(FILLER) for _ in range(4))
        rows.append({"prompt": f"User: {words}\nAssistant:", "chosen": f" {rng.choice(GOOD)} {words}",
                     "rejected": f" {rng.choice(BAD)} {words}"})
    return rows


def unpaired(rows: list[dict]) -> list[dict]:
    """KTO's rows: each pair as a desirable and an undesirable completion."""
    return [{"prompt": r["prompt"], "completion": r[key], "label": key == "chosen"}
            for r in rows for key in ("chosen", "rejected")]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def preference_recipe(model_dir: Path, data: Path, objective: str, fmt: str = "preference", **sections) -> dict:
    train = {"objective": objective, "max_steps": 16, "logging_steps": 4, "seed": SEED, **sections.pop("train", {})}
    return base_recipe(
        model_dir, data,
        data={"train": [{"path": str(data), "format": fmt}], "eval": {"split": 0.15}},
        train=train,
        **({"eval": {"strategy": "steps", "steps": train["max_steps"], "on_start": True},
            "checkpoint": {"strategy": "no"}} | sections),
    )


def train_run(folder: Path, recipe: dict) -> Path:
    res = ftune("run", str(write_recipe(folder, recipe)), cwd=folder)
    assert res.code == 0, res.text
    return folder / recipe["output"]["dir"]


def evals(run: Path) -> list[dict]:
    """The evaluations logged during training, one per step (not the end-of-run one: the last again, or with
    early stopping the best checkpoint's, at the step training stopped)."""
    by_step: dict[int, dict] = {}
    for r in metrics(run):
        if "eval_loss" in r:
            by_step.setdefault(r["step"], r)
    return [by_step[s] for s in sorted(by_step)]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("preference")
    write_jsonl(folder / "pairs.jsonl", preference_rows(200, seed=SEED))
    write_jsonl(folder / "unpaired.jsonl", unpaired(preference_rows(200, seed=SEED)))
    write_jsonl(folder / "heldout.jsonl", preference_rows(40, seed=SEED + 1000))  # rows no run trains on
    return folder


# lr and beta: the shortest runs whose figures are far from the thresholds (see the margins in docs/preference.md)
REFERENCE_FREE = {
    "orpo": {"max_steps": 12, "learning_rate": 2e-2, "preference": {"beta": 1.0}},  # beta 0.1: the NLL term dominates
    "simpo": {"max_steps": 12, "learning_rate": 2e-2},
}


@pytest.fixture(scope="module")
def runs(work, tiny_model_dir) -> dict:
    """Lazily trained runs by objective, shared by the tests of this module."""
    cache: dict[str, Path] = {}

    def get(objective: str) -> Path:
        if objective not in cache:
            folder = work / objective
            folder.mkdir()
            if objective == "kto":
                recipe = preference_recipe(
                    tiny_model_dir, work / "unpaired.jsonl", "kto", "unpaired-preference",
                    train={"learning_rate": 3e-2, "per_device_batch_size": 8, "preference": {"beta": 1.0}})
            else:
                recipe = preference_recipe(tiny_model_dir, work / "pairs.jsonl", objective,
                                           train=REFERENCE_FREE[objective])
            cache[objective] = train_run(folder, recipe)
        return cache[objective]

    return get


@pytest.mark.parametrize("objective", [pytest.param("orpo", marks=pytest.mark.extended), "simpo"])  # one in make test
def test_reference_free_objective_learns_the_preference(objective, runs):
    run = runs(objective)
    logged = evals(run)
    start, end = logged[0], logged[-1]
    assert start["step"] == 0 and 0.2 <= start["eval_rewards/accuracies"] <= 0.7  # chance: no rule learnt yet
    assert end["eval_rewards/accuracies"] >= 0.9
    assert end["eval_rewards/margins"] > start["eval_rewards/margins"] + 0.04
    assert end["eval_loss"] < start["eval_loss"]
    train = [r for r in metrics(run) if "rewards/chosen" in r and "loss" in r]
    assert {"rewards/rejected", "rewards/margins", "rewards/accuracies"} <= set(train[-1])


def test_kto_learns_the_preference_on_held_out_pairs(runs, work, tiny_model_dir):
    """KTO logs no pairwise accuracy (its rows are unpaired). The held-out measure: `ftune eval` of the KTO adapter
    with train.objective=dpo on pairs no run trained on. DPO's eval_rewards/accuracies is then the share of pairs
    whose implicit reward beta*log(policy/reference) (the reward KTO trains, against the same reference: the base
    with the adapter disabled) is higher for the chosen completion than for the rejected one."""
    run = runs("kto")
    logged = evals(run)
    start, end = logged[0], logged[-1]
    assert start["step"] == 0 and start["eval_rewards/margins"] == 0.0 and start["eval_kl"] == 0.0  # policy == ref
    assert end["eval_rewards/margins"] > 0.2
    assert end["eval_loss"] < start["eval_loss"]

    heldout = str(work / "heldout.jsonl")
    res = ftune("eval", str(work / "kto" / "recipe.yaml"), "train.objective=dpo",
                f"data.train=[{{path: {heldout}, format: preference}}]",
                f"data.eval=[{{path: {heldout}, format: preference}}]", "--format", "json", cwd=work / "kto")
    assert res.code == 0, res.text
    pairwise = json.loads(res.out)["metrics"]
    assert pairwise["eval_rewards/accuracies"] >= 0.9, pairwise
    assert pairwise["eval_rewards/margins"] > 0.2, pairwise
    assert "eval_perplexity" not in pairwise  # a preference loss has no perplexity


def test_ftune_eval_reports_the_objectives_metrics(runs, work):
    """`ftune eval` on a preference run reproduces the run's last evaluation (same data, model, trainer)."""
    run = runs("orpo")
    last = evals(run)[-1]
    res = ftune("eval", str(work / "orpo" / "recipe.yaml"), "--format", "json", cwd=work / "orpo")
    assert res.code == 0, res.text
    out = json.loads(res.out)
    assert out["model"] == str(run / "final")
    got = out["metrics"]
    for key in ("eval_loss", "eval_rewards/accuracies", "eval_rewards/margins", "eval_rewards/chosen",
                "eval_rewards/rejected", "eval_logps/chosen", "eval_nll_loss"):
        assert got[key] == pytest.approx(last[key], rel=1e-4, abs=1e-5), key
    assert "eval_perplexity" not in got


def test_dpo_learns_stops_early_and_resumes_identically(work, tiny_model_dir):
    """DPO + LoRA: the preference is learnt; early stopping on eval_rewards/accuracies (patience 1) stops the run at
    the first evaluation without a gain; a run resumed from the first checkpoint logs the same losses and stops at
    the same step; final/ is one plain adapter; the plain-string prompts stay plain text after training."""
    max_steps = 24
    recipe = preference_recipe(
        tiny_model_dir, work / "pairs.jsonl", "dpo",
        train={"max_steps": max_steps, "logging_steps": 1, "learning_rate": 2e-2, "preference": {"beta": 0.1},
               "early_stopping": {"metric": "eval_rewards/accuracies", "patience": 1}},
        eval={"strategy": "steps", "steps": 4, "on_start": True},
        checkpoint={"strategy": "steps", "steps": 4, "keep": None},
        output={"dir": "runs/dpo", "report_to": ["none"]},
    )
    (work / "dpo").mkdir()
    run = train_run(work / "dpo", recipe)
    logged = evals(run)
    start = logged[0]
    assert start["step"] == 0 and start["eval_rewards/accuracies"] == 0.0  # policy == reference: every reward is 0
    best = max(e["eval_rewards/accuracies"] for e in logged)
    assert best >= 0.9
    assert max(e["eval_rewards/margins"] for e in logged) > start["eval_rewards/margins"] + 0.03
    # patience 1: the first evaluation (after step 4) that doesn't beat the best so far stops the run
    accs = [(e["step"], e["eval_rewards/accuracies"]) for e in logged if e["step"] > 0]
    expected = next(s for i, (s, a) in enumerate(accs) if i > 0 and a <= max(b for _, b in accs[:i]))
    records = metrics(run)
    stopped = max(r["step"] for r in records)
    assert stopped == expected < max_steps, accs
    train = {r["step"]: r["loss"] for r in records if "loss" in r}
    assert train[stopped] < train[1]

    resumed = train_run(work / "dpo", recipe | {
        "checkpoint": {**recipe["checkpoint"], "resume": str(run / "checkpoints" / "checkpoint-4")},
        "output": {"dir": "runs/dpo-resumed", "report_to": ["none"]}})
    assert json.loads((resumed / "plan.json").read_text())["resume_from"].endswith("checkpoint-4")
    # plain-string pairs: generate, chat and merge prompt the model with the bare text, as DPO scored it
    assert json.loads((run / "plan.json").read_text())["prompt"]["format"] == "text"
    again = {r["step"]: r["loss"] for r in metrics(resumed) if "loss" in r}
    assert again and min(again) > 4 and max(again) == stopped, metrics(resumed)
    assert again == pytest.approx({s: v for s, v in train.items() if s > 4}, rel=1e-4)
    assert [e["eval_rewards/accuracies"] for e in evals(resumed)] == [a for s, a in accs if s > 4]

    final = run / "final"
    assert (final / "adapter_config.json").is_file() and not (final / "ref").exists()  # TRL's ref copy dropped
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(final))
    assert list(model.peft_config) == ["default"]
    lora_b = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert lora_b and all(float(p.abs().sum()) > 0 for p in lora_b)  # trained, not the zero init
