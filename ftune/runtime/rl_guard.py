"""RL's silent failures, caught from the training logs (`guard`): rewards identical within every group for
`train.rl.guard_logs` logs in a row (all advantages zero: nothing is learned), unless the run has saturated, or
every completion clipped at the length limit. Also maps TRL's metric names to ftune's (`ALIASES`)."""

from __future__ import annotations

import sys

from ftune.errors import RunError

ALIASES = {"frac_reward_zero_std": "zero_advantage_frac", "completions/mean_length": "completion_length",
           "completions/clipped_ratio": "clipped_ratio"}
"""TRL's metric → ftune's name (both are kept). `reward`, `reward_std`, `rewards/<name>/mean|std` and `kl` keep
TRL's names."""


def guard(plan):
    """Add ftune's metric names to each training log, and stop the run on RL's silent failures: rewards identical
    within every group (zero advantages: nothing to learn), or every completion clipped at the length limit, for
    `train.rl.guard_logs` logs in a row. Identical rewards after the run's rewards have varied, at the best mean
    reward it has logged, are saturation, not a failure: the run learned what these prompts reward (a solved task
    scores every completion alike), so it trains on with a note instead of stopping. Logged values are gathered
    over processes, so every rank stops alike. Placed first among the callbacks, so metrics.jsonl sees the names
    it adds."""
    from transformers import TrainerCallback

    rl = plan.recipe.train.rl
    objective = plan.recipe.train.objective
    limit = rl.guard_logs

    class RLGuard(TrainerCallback):
        def __init__(self) -> None:
            self.flat = self.clipped = 0
            self.saturated = False

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "reward" not in logs:
                return
            for trl_name, name in ALIASES.items():
                if trl_name in logs:
                    logs[name] = logs[trl_name]
            self.flat = self.flat + 1 if logs.get("frac_reward_zero_std") == 1.0 else 0
            self.clipped = self.clipped + 1 if logs.get("completions/clipped_ratio") == 1.0 else 0
            if self.flat >= limit and saturated(state.log_history, logs):
                if not self.saturated and state.is_world_process_zero:
                    print(f"ftune worker: note: {objective}: every group's completions got identical rewards for "
                          f"{self.flat} logs in a row at the run's best mean reward ({logs['reward']:.3g}, step "
                          f"{state.global_step}): saturated, the prompts hold nothing more to learn at this "
                          "temperature (advantages are zero); training goes on to max_steps", file=sys.stderr)
                self.saturated = True
            elif self.flat >= limit:
                per = ", ".join(f"{k.split('/')[1]} {logs[k]:.3g}" for k in logs
                                if k.startswith("rewards/") and k.endswith("/mean"))
                raise RunError(
                    f"{objective}: every group's completions got identical rewards for {self.flat} logs in a row "
                    f"(step {state.global_step}; mean reward {logs['reward']:.3g}: {per}); every advantage is zero, "
                    "so nothing is learned", hint="check the rewards against the data (the answer's format, a "
                    "regex that never matches), see completions.jsonl; raise train.rl.temperature or "
                    "num_generations, or add a graded reward (e.g. length, contains) beside a pass/fail one")
            if self.clipped >= limit:
                raise RunError(
                    f"{objective}: every completion hit max_completion_length ({rl.max_completion_length} tokens) "
                    f"for {self.clipped} logs in a row (step {state.global_step}): none ended, so answers are cut "
                    "before they are scored", hint="raise train.rl.max_completion_length, check that the model "
                    "ends its answers with the tokenizer's eos token (model.special_tokens.eos_token; an SFT "
                    "stage first teaches it), or add soft_overlong_punishment")

    return RLGuard()


def saturated(history: list[dict], logs: dict) -> bool:
    """Whether flat rewards in `logs` are saturation: the run's rewards varied in some earlier log and are now at
    the best mean it has logged. `history`: the trainer's log history (a resumed run's logs before its checkpoint
    too, as trainer_state.json restores them)."""
    rewarded = [h for h in (*history, logs) if "reward" in h]
    varied = any(h.get("frac_reward_zero_std") not in (None, 1.0) for h in rewarded)
    return varied and logs["reward"] >= max(h["reward"] for h in rewarded)
