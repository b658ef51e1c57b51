"""`ftune eval`'s work: a trained model scored on the recipe's eval data in this process, with the Trainer's
evaluation as `ftune run` runs it (loss, perplexity), generation metrics (exact match, F1), or an online RL recipe's
own rewards. After training, on the model runtime the run uses (`ftune.runtime`): the command imports no worker."""

from __future__ import annotations

import shutil
from pathlib import Path

from ftune.errors import FtuneError


def evaluate(plan, model_dir: Path, generate=None, log=None) -> dict:
    """Loss (and perplexity) on the eval data; generation metrics too when `generate` (an eval.generate section)."""
    from ftune import adapter
    from ftune.infer.load import load_trained
    from ftune.plan.evaluation import with_perplexity
    from ftune.recipe.objectives import FAMILIES, objective
    from ftune import generation
    from ftune import datastage as data
    from ftune.datastage import tokenizer
    from ftune.runtime import train

    processor = tokenizer.load_processor(plan)  # a vision-language model's
    tok = processor.tokenizer if processor is not None else tokenizer.load_tokenizer(plan)
    bundle = data.build(plan.recipe, tok, plan.data, log=lambda *a, **k: None, processor=processor)
    if bundle.eval is None:
        raise FtuneError("the recipe has no eval data", hint="set data.eval (e.g. `data.eval={split: 0.1}`)")
    model = load_trained(plan, model_dir, tok, labels=bundle.label_names)
    args = train.eval_arguments(plan)
    trl_images = processor is not None and plan.data.rows != "sft"  # image rows TRL's trainer reads (as in the run)
    if FAMILIES[plan.family].generates:
        # online RL has no fixed eval loss: the recipe's rewards on greedy completions of the eval prompts
        from ftune.runtime.rl import eval_rewards

        if trl_images:
            raise FtuneError(f"ftune eval of {plan.recipe.train.objective} on image prompts (vision-prompt) is not "
                             "supported yet: its greedy completions would need the images",
                             hint="the run's own eval (data.eval with eval.strategy) logs TRL's eval_reward")

        section = generate if generate is not None else plan.recipe.eval.generate
        return eval_rewards(plan, model, tok, bundle.eval, batch_size=args.per_device_eval_batch_size,
                            max_samples=section.max_samples if section is not None else None)
    reference = None
    if objective(plan.recipe.train.objective).uses_reference and not adapter.is_adapter(model_dir):
        # a full model's reference is the base the run started from (TRL would copy the trained weights: no rewards);
        # an adapter's is its base with the adapter disabled, as in training
        from ftune.runtime.model import load_model

        reference = load_model(plan, tok)
    trainer = train.build_trainer(plan, model, processor if trl_images else tok, bundle, args, callbacks=[],
                                  ref_model=reference)
    metrics = trainer.evaluate()  # the eval data as the trainer prepared it (TRL's tokenize theirs at init)
    with_perplexity(metrics, plan.recipe)  # the trainer's log added it already; a metrics dict of its own here
    shutil.rmtree(plan.run.eval_scratch, ignore_errors=True)  # the Trainer's output dir: nothing is kept there
    if generate is not None:
        from ftune.plan.evaluation import generation_metrics

        fmt = generation.prompt_format(plan, tok)
        with_generate = plan.recipe.model_copy(update={"eval": plan.recipe.eval.model_copy(update={"generate": generate})})
        metrics.update(generation.generation_metrics(
            model, tok, bundle.eval, metrics=generation_metrics(with_generate), max_new_tokens=generate.max_new_tokens,
            max_samples=generate.max_samples, stop_ids=generation.stop_token_ids(tok, fmt),
            batch_size=args.per_device_eval_batch_size, predictions=plan.run.predictions, log=log,
            pixels=_pixels(bundle)))
    return metrics


def _pixels(bundle):
    """A vision-chat bundle's image inputs for generation (its collator's processor and image settings)."""
    from ftune.datastage.vision_chat import VisionCollator, pixel_inputs

    collate = bundle.collator
    if not isinstance(collate, VisionCollator):
        return None
    return lambda paths, ids: pixel_inputs(collate.processor, paths, collate.images, ids)
