"""Online RL (grpo, rloo), in the run and in `ftune eval`: the recipe's rewards as TRL reward functions, TRL's
trainer, the guards and completions.jsonl. TRL generates, computes advantages and the loss; ftune writes none of them.

Each reward is scored row by row (`ftune.rewards.Sample`), so a reward that raises or returns NaN stops the run
naming the reward and the row. TRL's logged names are mapped to ftune's (`rl_guard.ALIASES`) in metrics.jsonl.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from ftune.errors import RunError
from ftune.rewards import REWARD_MODEL, Sample, available
from ftune.rundir import is_complete
from ftune.runtime.reward_pool import Entry, Pool, RewardsInterrupted, RewardTimeout
from ftune.runtime.rl_guard import guard
from ftune.datastage.prompt import BOOKKEEPING, ROW

TIMES = ("generation_time", "training_time", "generated_tokens")
"""ftune's per-step timing in metrics.jsonl (means over each logging window, as TRL logs its own): seconds spent
sampling completions (TRL's `_generate`: generation and decoding), seconds for the rest of the optimizer step
(rewards, reference/old log-probs, forward, backward, optimizer), and completion tokens generated over all
processes. TRL's own `step_time` counts both without the optimizer step."""

DEFAULT_LIMIT_S = 10.0
"""`train.rl.reward_timeout`'s default (the schema's)."""



def reward_function(spec, plugin, pool=None, index: int = 0, limit_s: float = DEFAULT_LIMIT_S):
    """The TRL reward function (batched keyword call) for one `train.rl.rewards` entry, scored in `pool` (the
    rewards' process: `ftune.runtime.reward_pool`) as its entry `index`; without a pool, in a pool of its own."""
    if pool is None:
        pool = Pool([scored_entry(spec, plugin)], limit_s)
    name = spec.name

    def reward(prompts, completions, completion_ids=None, **columns) -> list[float]:
        n = len(completions)
        answers = columns.get("answer") or [None] * n
        rows = columns.get(ROW) or [f"completion {j + 1}" for j in range(n)]
        other = {k: v for k, v in columns.items()
                 if isinstance(v, list) and len(v) == n and k not in ("answer", ROW, "environments")}
        samples = [Sample(prompt=str(prompts[j]),
                          completion=completions[j] if isinstance(completions[j], str) else completions[j][-1]["content"],
                          completion_ids=tuple(completion_ids[j]) if completion_ids is not None else (),
                          answer=answers[j], row={k: v[j] for k, v in other.items()}) for j in range(n)]
        return pool.score(index, samples, rows)

    reward.__name__ = name  # TRL logs rewards/<__name__>/mean and /std
    return reward


def scored_entry(spec, plugin) -> Entry:
    """A scored (not model) reward as the rewards' process builds it."""
    return Entry(spec.name, plugin.make, plugin.args.model_validate(spec.args) if plugin.args is not None else None)


def reward_model_function(spec, device):
    """A `reward_model` entry: the sequence classifier's logit for prompt + completion + eos, the text as TRL's
    RewardTrainer scored it in training (it appends eos to every completion). Without the eos the score is read at
    the completion's last word, where it was never trained: a tiny GRPO run learned to repeat the rewarded word
    forever (reward -0.68 -> 2.24, every completion clipped)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = spec.args["path"]
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1).eval().requires_grad_(False)
    model.config.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    model.to(device)
    eos = tok.eos_token or ""

    def reward(prompts, completions, completion_ids=None, **columns) -> list[float]:
        texts = [str(p) + (c if isinstance(c, str) else c[-1]["content"]) + eos for p, c in zip(prompts, completions)]
        batch = tok(texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
        with torch.inference_mode():
            return model(**batch.to(device)).logits[:, 0].float().tolist()

    reward.__name__ = REWARD_MODEL
    return reward


def reward_functions(plan, device) -> list:
    """TRL's reward_funcs, in the recipe's order (weights: plan.trainer). The scored rewards share one process
    (`Pool`), each call under `train.rl.reward_timeout`; a reward model runs here, on the device."""
    known = available()
    rl = plan.recipe.train.rl
    scored = [spec for spec in rl.rewards if spec.name != REWARD_MODEL]
    pool = Pool([scored_entry(spec, known[spec.name]) for spec in scored], rl.reward_timeout) if scored else None
    if pool is not None:
        pool.start()
    funcs = [reward_model_function(spec, device) if spec.name == REWARD_MODEL
             else reward_function(spec, known[spec.name], pool, scored.index(spec)) for spec in rl.rewards]
    if rl.tools:  # a completion with a failed tool call scores tool_error_reward alone (ftune.runtime.tools)
        from ftune.runtime.tools import zero_failed

        funcs = [zero_failed(f) for f in funcs]
    return funcs


def step_timer(trainer):
    """A callback splitting each optimizer step's wall time into generation and the rest (`TIMES`), appended to
    TRL's per-step metrics so they are averaged and logged with them. The generation seconds and tokens are
    counted by the trainer's `_generate` (`build_trainer`)."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            trainer._ftune_step = [time.perf_counter(), 0.0, 0.0]

        def on_step_end(self, args, state, control, **kwargs):
            start, generation, tokens = trainer._ftune_step
            metrics = trainer._metrics["train"]
            metrics["generation_time"].append(generation)
            metrics["training_time"].append(time.perf_counter() - start - generation)
            metrics["generated_tokens"].append(tokens)

    return StepTimer()


class StopDuringReward(Exception):
    """SIGTERM while a reward scored: the step was abandoned; `checkpoint` is the last complete step's (or None).
    The worker turns it into its SIGTERM exit (143)."""

    def __init__(self, step: int, checkpoint: str | None):
        super().__init__(step, checkpoint)
        self.step, self.checkpoint = step, checkpoint


def check_total(per_func, weights, names) -> None:
    """The weighted total TRL learns from (float32, as TRL sums it) is finite for every completion: each reward is
    checked where it is scored, but finite rewards times large weights overflow to inf, and the group's advantages
    then read as zero (the run learned nothing and exited 0)."""
    import torch

    total = (per_func * weights.to(per_func.device).unsqueeze(0)).nansum(dim=1)
    bad = (~torch.isfinite(total)).nonzero()
    if len(bad):
        j = int(bad[0])
        parts = ", ".join(f"{n} {float(v):g} x {float(w):g}" for n, v, w in zip(names, per_func[j], weights))
        raise RunError(f"the weighted reward total of completion {j + 1} of the batch is {float(total[j])} ({parts})",
                       hint="TRL sums the rewards in float32 (largest ~3.4e38): lower the weights in "
                       "train.rl.rewards, or make the rewards smaller")


def build_trainer(plan, trainer_class, model, tokenizer, bundle, args, callbacks: list, ref_model=None):
    """TRL's GRPOTrainer / RLOOTrainer (`trainer_class`, the Plan's) on the model ftune loaded and adapted, with
    the recipe's rewards."""
    from transformers import PrinterCallback

    from ftune.datastage.vision_chat import template_of
    from ftune.runtime.precision import hold_weights, put_back, set_mixed_precision_policy
    from ftune.runtime.vision_trl import is_processor, prompt_rows

    rl = plan.recipe.train.rl
    run = plan.run
    funcs = reward_functions(plan, args.device)
    tool_kwargs = {}
    if rl.tools:
        from ftune.runtime import tools

        tools.response_parser(tokenizer, rl.tool_format)
        tool_kwargs["environment_factory"] = tools.environment_factory(plan)

    class RLTrainer(trainer_class):
        def create_accelerator_and_postprocess(self):
            super().create_accelerator_and_postprocess()
            set_mixed_precision_policy(self.accelerator, plan)

        def _generate(self, prompts):
            if not self.model.training:
                return super()._generate(prompts)
            start = time.perf_counter()
            held = hold_weights(self.model, self.args) if rl.generation.backend == "paged" else None
            try:
                out = super()._generate(prompts)
            finally:
                put_back(held)
            if rl.tools:
                self._ftune_tool_record(out)
            step = getattr(self, "_ftune_step", None)
            if step is not None:
                step[1] += time.perf_counter() - start
                # TRL's mean over the completions of every process (it gathers them): tokens of all processes
                mean = self._metrics["train"]["completions/mean_length"][-1]
                step[2] += mean * len(out[1]) * self.accelerator.num_processes
            return out

        def training_step(self, model, inputs, num_items_in_batch):
            """A reward past its limit, or a stop while one scores: the step is abandoned, the last complete step
            checkpointed (one process: the others would wait in the save), then the run ends (exit 3 / 143)."""
            try:
                return super().training_step(model, inputs, num_items_in_batch)
            except RewardTimeout as err:
                folder = self._checkpoint_last_step()
                err.hint += (f"; saved a complete checkpoint of step {self.state.global_step}: {folder}"
                             if folder else f"; step {self.state.global_step} was not checkpointed (nothing "
                             "trained yet, or several processes); complete checkpoints already saved are kept")
                raise
            except RewardsInterrupted:
                raise StopDuringReward(self.state.global_step, self._checkpoint_last_step()) from None

        def _checkpoint_last_step(self) -> str | None:
            step = self.state.global_step
            folder = Path(self.args.output_dir) / f"checkpoint-{step}"
            if is_complete(folder):  # the save strategy wrote it at this step
                return str(folder)
            if step == 0 or self.accelerator.num_processes > 1:
                return None
            if not folder.is_dir():
                self._save_checkpoint(self.model, trial=None)
                self.control = self.callback_handler.on_save(self.args, self.state, self.control)
            return str(folder) if is_complete(folder) else None

        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
            check_total(per_func, self.reward_weights, self.reward_func_names)
            return per_func

        def log(self, logs, start_time=None):
            sample = self._sample() if self.model.training and "loss" in logs else None
            super().log(logs, start_time)
            if sample:
                with run.completions.open("a") as f:
                    f.writelines(json.dumps(r, default=_shown) + "\n" for r in sample)

        def _ftune_tool_record(self, out) -> None:
            """Each rollout's calls (name, arguments, result, error) and the text masked from its loss (the
            tool results TRL appended: `tool_mask` 0), kept beside TRL's logged completions."""
            from accelerate.utils import gather_object

            from ftune.runtime.tools import note_unrouted

            completion_ids, tool_mask, completions = out[1], out[2], out[3]
            note_unrouted(self.environments, completions)
            records = []
            for j, env in enumerate(self.environments or []):
                mask = tool_mask[j] if tool_mask is not None else []
                masked = [t for t, m in zip(completion_ids[j], mask) if m == 0]
                records.append({"tool_calls": list(env.calls),
                                "masked": self.processing_class.decode(masked) if masked else ""})
            if not hasattr(self, "_ftune_tools"):
                from collections import deque

                self._ftune_tools = deque(maxlen=self._logs["prompt"].maxlen)
            self._ftune_tools.extend(gather_object(records))

        def _sample(self) -> list[dict] | None:
            """The last `completions_sample` completions generated, with their rewards (rank 0)."""
            logs = getattr(self, "_logs", None)
            if not rl.completions_sample or not self.accelerator.is_main_process or not logs or not logs["prompt"]:
                return None
            prompts, comps = list(logs["prompt"]), list(logs["completion"])
            rewards = {k: list(v) for k, v in logs["rewards"].items()}
            advantages = list(logs.get("advantages", []))
            k = min(rl.completions_sample, len(comps))
            out = []
            calls = list(getattr(self, "_ftune_tools", []))
            calls = calls[len(calls) - len(comps):] if len(calls) >= len(comps) else [{}] * len(comps)
            for j in range(len(comps) - k, len(comps)):
                out.append({"step": self.state.global_step, "time": round(time.time(), 3), "prompt": prompts[j],
                            "completion": comps[j], **calls[j],
                            "rewards": {n: v[j] for n, v in rewards.items() if j < len(v)},
                            **({"advantage": advantages[j]} if j < len(advantages) else {})})
            return out

    train_rows, eval_rows = bundle.train, bundle.eval
    if is_processor(tokenizer):  # vision-prompt rows: conversational prompts and opened images, as GRPO takes them
        tokenizer.chat_template = template_of(plan.recipe, tokenizer)
        train_rows, eval_rows = (prompt_rows(d, plan.recipe.data.images) for d in (train_rows, eval_rows))
    trainer = RLTrainer(
        model=model,
        reward_funcs=funcs,
        args=args,
        train_dataset=train_rows,
        eval_dataset=eval_rows,
        processing_class=tokenizer,
        callbacks=[guard(plan), *callbacks],
        **tool_kwargs,
    )
    restore_saved_modules_dtype(trainer.model)
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(step_timer(trainer))
    return trainer


def _shown(value) -> str:
    """An image in a vision-prompt's messages, as completions.jsonl shows it (`<image 28x28>`)."""
    size = getattr(value, "size", None)
    return f"<image {size[0]}x{size[1]}>" if isinstance(size, tuple) and len(size) == 2 else repr(value)


def restore_saved_modules_dtype(model) -> int:
    """Put each module trained in full beside an adapter (`peft.modules_to_save`, e.g. lm_head) back in the dtype
    of the module it copies; returns how many were cast. TRL's GRPO/RLOO trainers cast every trainable parameter
    of a quantized model to bf16 (QLoRA's adapter dtype, trl 1.16). A LoRA layer casts its input to its own dtype,
    but such a copy is a plain module that does not: QLoRA + `modules_to_save: [lm_head]` failed its first
    generation with "expected m1 and m2 to have the same dtype, float != BFloat16" (float32 hidden states)."""
    from peft.utils import ModulesToSaveWrapper

    cast = 0
    for module in model.modules():
        if not isinstance(module, ModulesToSaveWrapper):
            continue
        original = next(module.original_module.parameters(), None)
        for copy in module.modules_to_save.values():
            if original is not None and any(p.dtype != original.dtype for p in copy.parameters()):
                copy.to(original.dtype)
                cast += 1
    return cast


def eval_rewards(plan, model, tokenizer, dataset, *, max_samples: int | None = None, batch_size: int = 8) -> dict:
    """The recipe's rewards on the eval prompts (`ftune eval`): one greedy completion per prompt (so the score is
    the model's, not a sample's), up to `max_completion_length` tokens or a stop token, scored by every reward
    exactly as in training (the same functions, the row's answer and columns). Returns `eval_rewards/<name>/mean`
    and `/std`, `eval_reward` (the weighted total's mean, TRL's `reward`), `eval_generated` and `eval_clipped_ratio`
    (completions cut at the limit)."""
    import statistics

    from ftune import generation

    rl = plan.recipe.train.rl
    if rl.tools:
        raise RunError("ftune eval scores plain completions and does not run the tool loop, so the rewards of a "
                       "recipe with train.rl.tools would be scored on answers that could call no tool",
                       hint="read the held-out rewards from a GRPO run's logs; the tool loop in eval is not "
                       "done yet (docs/rl.md)")
    rows = dataset.select(range(min(len(dataset), max_samples))) if max_samples else dataset
    if len(rows) == 0:
        raise RunError("the eval data has no prompts to score", hint="set data.eval (e.g. `data.eval={split: 0.1}`)")
    prompts = list(rows["prompt"])
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    stop_ids = generation.stop_token_ids(tokenizer)
    done = generation.generate(model, tokenizer, ids, stop_ids=stop_ids, max_new_tokens=rl.max_completion_length,
                               batch_size=batch_size)
    texts = [tokenizer.decode(c.ids, skip_special_tokens=True) for c in done]  # unstripped, as TRL decodes
    columns = {k: list(rows[k]) for k in rows.column_names if k not in ("prompt", *BOOKKEEPING)}
    device = generation.input_device(model)
    funcs = reward_functions(plan, device)
    total = [0.0] * len(texts)
    result: dict = {}
    for spec, func in zip(rl.rewards, funcs):
        scores = func(prompts=prompts, completions=texts, completion_ids=[c.ids for c in done], **columns)
        result[f"eval_rewards/{func.__name__}/mean"] = statistics.fmean(scores)
        result[f"eval_rewards/{func.__name__}/std"] = statistics.pstdev(scores)
        total = [t + spec.weight * s for t, s in zip(total, scores)]
    result["eval_reward"] = statistics.fmean(total)
    result["eval_generated"] = len(texts)
    result["eval_clipped_ratio"] = sum(not c.stopped for c in done) / len(done)
    return result
