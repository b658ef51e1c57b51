"""Rewards run under bounds (issue #37): each scored reward runs in a process of its own and answers each row
within `train.rl.reward_timeout`; a runaway (a regex backtracking in C, where no signal reaches it) is killed and
named with its row and limit; a stop abandons the reward at once; a score is a finite number, never text; the
weighted total is finite; a backtracking pattern and an all-zero weighting are refused at validate."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from ftune.errors import RecipeError, RunError
from ftune.plugins import RewardPlugin
from ftune.recipe import load_recipe
from ftune.rewards import BUILTIN, NoArgs, RegexArgs, Sample, backtracks
from ftune.runtime import reward_pool
from ftune.runtime.reward_pool import Entry, Pool, RewardsInterrupted, RewardTimeout
from ftune.runtime.rl import reward_function
from tests.unit.test_rl import _write, grpo

ROWS = ["data.train[0] row 14 of a.jsonl", "data.train[0] row 15 of a.jsonl"]
PLUGIN_REWARDS = '''
import time
def text(args):
    return lambda s: "1.0"
def items(args):
    return lambda s: [1.0]
def exits(args):
    return lambda s: __import__("sys").exit(3)
def numpyish(args):
    class Scalar:
        def __float__(self):
            return 0.25
    return lambda s: (True if s.completion == "yes" else Scalar())
def huge(args):
    return lambda s: 1e39
def sleeps(args):
    return lambda s: time.sleep(600)
'''


def _samples(*completions: str) -> list[Sample]:
    return [Sample(prompt="p", completion=c, completion_ids=(1,), answer="a") for c in completions]


@pytest.fixture
def plugin_rewards(tmp_path, monkeypatch):
    """A module of rewards the rewards' process can import (it is a fresh interpreter: PYTHONPATH, not sys.path)."""
    (tmp_path / "my_rewards.py").write_text(PLUGIN_REWARDS)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{':'.join(sys.path)}")

    def fn(name: str, limit_s: float = 30.0):
        return reward_function(SimpleNamespace(name=name, args={}), RewardPlugin(f"my_rewards:{name}", NoArgs),
                               limit_s=limit_s)

    return fn


# ------------------------------------------------------------------------------ at validate
@pytest.mark.parametrize("pattern", ["(.|.)*ZZZ", "(a+)+$", "(a*)*b", r"(\w+\s?)*x", r"(\s*\w+)*$", "(?:x|.)*y",
                                     "ok: ((a+)+)"])
def test_backtracking_patterns_are_refused_at_validate_located(tmp_path, pattern):
    with pytest.raises(RecipeError) as err:
        load_recipe(_write(tmp_path, grpo([{"name": "regex", "pattern": pattern}])))
    (problem,) = err.value.problems
    assert problem.path == "train.rl.rewards[0].pattern"
    assert "can backtrack catastrophically" in problem.message and "rewrite it" in problem.message


@pytest.mark.parametrize("pattern", [r"^\d+$", "answer: (yes|no)", ".*", "(?:a|b)*c", r"[(]a+[)]+", r"(\d+,)*",
                                     "(ab|ac)*", r"<think>.*?</think>", r"(\w+,\s*)*\w+", r"(a|\w)+", r"\d+(\.\d+)?"])
def test_ordinary_patterns_pass(pattern):
    assert backtracks(pattern) is None
    RegexArgs(pattern=pattern)


def test_a_sole_reward_of_weight_zero_is_refused_and_a_zero_beside_another_is_not(tmp_path):
    with pytest.raises(RecipeError) as err:
        load_recipe(_write(tmp_path, grpo([{"name": "exact_match", "weight": 0}])))
    (problem,) = err.value.problems
    assert problem.path == "train.rl.rewards[0].weight" and "the only reward" in problem.message
    with pytest.raises(RecipeError) as err:
        load_recipe(_write(tmp_path, grpo([{"name": "exact_match", "weight": 0}, {"name": "length", "target": 3,
                                                                                    "weight": 0.0}])))
    assert [(p.path, "all of them" in p.message) for p in err.value.problems] == [("train.rl.rewards[1].weight", True)]
    load_recipe(_write(tmp_path, grpo([{"name": "exact_match", "weight": 0}, {"name": "length", "target": 3}])))


def test_reward_timeout_is_a_checked_setting(tmp_path):
    assert load_recipe(_write(tmp_path, grpo(reward_timeout=2.5))).recipe.train.rl.reward_timeout == 2.5
    for bad in (0, -1, 10_000, "soon"):
        with pytest.raises(RecipeError) as err:
            load_recipe(_write(tmp_path, grpo(reward_timeout=bad)))
        assert [p.path for p in err.value.problems] == ["train.rl.reward_timeout"]


# ------------------------------------------------------------------------------ at run time
def test_a_runaway_regex_is_killed_at_its_limit_naming_the_reward_and_the_row():
    """The pattern validate refuses, forced past it: re.search in C can't be interrupted in-process."""
    args = RegexArgs.model_construct(pattern="(.|.)*ZZZ", full=False)
    pool = Pool([Entry("regex", BUILTIN["regex"].make, args)], 0.5)
    with pytest.raises(RewardTimeout) as err:
        pool.score(0, _samples("ZZZ", "x" * 60), ROWS)
    assert err.value.message == f"reward 'regex' took longer than its limit of 0.5 s on {ROWS[1]}"
    assert err.value.exit_code == 3 and "reward_timeout" in err.value.hint
    assert pool.proc is None  # killed
    assert pool.score(0, _samples("ZZZ"), ROWS) == [1.0]  # a later call starts afresh


def test_a_stop_abandons_a_reward_that_never_returns(plugin_rewards):
    import threading

    fn = plugin_rewards("sleeps", limit_s=600)
    fn([], [], [])  # starts the process (no rows)
    threading.Timer(0.2, reward_pool.INTERRUPT.set).start()  # SIGTERM's handler, while (or before) the reward sleeps
    try:
        with pytest.raises(RewardsInterrupted):
            fn(["p"], ["x"], [[1]])
    finally:
        reward_pool.INTERRUPT.clear()


@pytest.mark.parametrize(("name", "says"), [
    ("text", "reward 'text' returned str '1.0', not a number on r1"),
    ("items", "reward 'items' returned list [1.0], not a number on r1"),
    ("huge", "reward 'huge' returned 1e+39, past float32's range"),
    ("exits", "reward 'exits' failed on r1: called sys.exit(3)"),
])
def test_a_score_must_be_a_finite_number(plugin_rewards, name, says):
    with pytest.raises(RunError) as err:
        plugin_rewards(name)(["p"], ["x"], [[1]], _row=["r1"])
    assert err.value.message.startswith(says)


def test_numbers_of_any_numeric_type_are_scores(plugin_rewards):
    assert plugin_rewards("numpyish")(["p", "p"], ["yes", "no"], [[1], [2]]) == [1.0, 0.25]


def test_a_weighted_total_past_float32_stops_the_run():
    import torch

    from ftune.runtime.rl import check_total

    weights = torch.tensor([1e30, 1.0])
    check_total(torch.tensor([[1.0, 2.0], [0.0, 5.0]]), weights, ["a", "b"])
    with pytest.raises(RunError) as err:
        check_total(torch.tensor([[1.0, 2.0], [1e9, 5.0]]), weights, ["a", "b"])
    assert err.value.message.startswith("the weighted reward total of completion 2 of the batch is inf (a 1e+09 x ")
