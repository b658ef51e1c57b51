"""The preference guard (issue #16's silent failures): a non-finite eval loss, or rewards/accuracies at exactly 0
for STUCK_LOGS training logs in a row after the first step, stops the run with an error and a suggestion."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ftune.errors import RunError


def _guard(objective: str = "dpo"):
    from ftune.runtime.train import preference_guard

    return preference_guard(SimpleNamespace(recipe=SimpleNamespace(train=SimpleNamespace(objective=objective))))


def _log(guard, step: int, **logs):
    guard.on_log(None, SimpleNamespace(global_step=step), None, logs=logs)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_nonfinite_eval_loss_stops_the_run(value):
    guard = _guard("orpo")
    _log(guard, 4, eval_loss=0.69)
    with pytest.raises(RunError) as err:
        _log(guard, 8, eval_loss=value)
    assert f"orpo: eval_loss is {value} at step 8" in err.value.message
    assert "learning_rate" in err.value.hint and "bf16" in err.value.hint


def test_accuracy_stuck_at_zero_stops_after_three_logs_not_before():
    from ftune.runtime.train import STUCK_LOGS

    assert STUCK_LOGS == 3
    guard = _guard()
    _log(guard, 1, **{"rewards/accuracies": 0.0})  # step 1: policy == reference, every reward is 0: ignored
    _log(guard, 2, **{"rewards/accuracies": 0.0})
    _log(guard, 3, **{"rewards/accuracies": 0.0})
    with pytest.raises(RunError) as err:
        _log(guard, 4, **{"rewards/accuracies": 0.0})
    assert "rewards/accuracies has been exactly 0 for 3 logs in a row (step 4)" in err.value.message
    assert "swapped or identical" in err.value.hint and "max_prompt_length" in err.value.hint


def test_any_nonzero_accuracy_resets_the_count():
    guard = _guard()
    for step, acc in [(2, 0.0), (3, 0.0), (4, 0.25), (5, 0.0), (6, 0.0), (7, 0.5), (8, 0.0)]:
        _log(guard, step, **{"rewards/accuracies": acc})  # never three zeros in a row: no error
    assert guard.zero_runs == 1
