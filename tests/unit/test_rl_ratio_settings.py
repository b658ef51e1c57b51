"""TRL 1.16's GRPO knobs as recipe keys (#39): GSPO's sequence-level ratio, clip-higher, two-sided clipping,
truncated-completion masking and high-entropy token selection, each validated against the others and written
out in plan.trainer exactly as GRPOConfig takes them."""

from __future__ import annotations

import pytest

from ftune.plan.rl import config_kwargs
from tests.unit.test_rl import grpo, line_of, plan, problems


def test_gspo_defaults_to_the_per_sequence_loss_and_writes_every_knob(tmp_path):
    trainer = config_kwargs(plan(tmp_path, grpo(importance_sampling_level="sequence", epsilon=3e-4,
                                                epsilon_high=4e-4, mask_truncated_completions=True,
                                                top_entropy_quantile=0.2)).recipe)
    assert trainer["importance_sampling_level"] == "sequence" and trainer["loss_type"] == "grpo"
    assert (trainer["epsilon"], trainer["epsilon_high"]) == (3e-4, 4e-4)
    assert trainer["mask_truncated_completions"] is True and trainer["top_entropy_quantile"] == 0.2


def test_unset_knobs_are_trls_defaults_written_out(tmp_path):
    trainer = config_kwargs(plan(tmp_path, grpo()).recipe)
    assert trainer["importance_sampling_level"] == "token" and trainer["loss_type"] == "dapo"
    assert trainer["epsilon_high"] == trainer["epsilon"] == 0.2 and trainer["delta"] is None
    assert trainer["mask_truncated_completions"] is False and trainer["top_entropy_quantile"] == 1.0
    assert config_kwargs(plan(tmp_path, grpo(loss_type="luspo")).recipe)["importance_sampling_level"] == "sequence"


def test_rloo_takes_the_shared_knobs_only(tmp_path):
    rloo = {"objective": "rloo", "rl": {"rewards": [{"name": "exact_match"}], "num_generations": 4,
                                        "epsilon_high": 0.3, "mask_truncated_completions": True}}
    trainer = config_kwargs(plan(tmp_path, rloo).recipe)
    assert trainer["epsilon_high"] == 0.3 and "importance_sampling_level" not in trainer
    p = problems(tmp_path, {**rloo, "rl": {**rloo["rl"], "importance_sampling_level": "sequence"}})
    assert "rloo has no `importance_sampling_level` setting" in p["train.rl.importance_sampling_level"].message


@pytest.mark.parametrize("rl,key,words", [
    ({"importance_sampling_level": "sequence", "loss_type": "dapo"}, "train.rl.loss_type", "sums per-token terms"),
    ({"importance_sampling_level": "sequence", "loss_type": "vespo"}, "train.rl.importance_sampling_level",
     "vespo computes its sequence-level weights"),
    ({"importance_sampling_level": "token", "loss_type": "luspo"}, "train.rl.importance_sampling_level",
     "luspo is defined on sequence-level ratios"),
    ({"epsilon": 0.2, "epsilon_high": 0.1}, "train.rl.epsilon_high", "is below epsilon 0.2"),
    ({"delta": 1.1}, "train.rl.delta", "is not above 1 + epsilon"),
])
def test_contradicting_knobs_are_refused_at_their_key(tmp_path, rl, key, words):
    p = problems(tmp_path, grpo(**rl))
    assert words in p[key].message, p
    assert line_of(p[key]).startswith(key.rsplit(".", 1)[1])
