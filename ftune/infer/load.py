"""Loading a trained model for evaluation or generation: an adapter over its base (quantized as it was trained),
a full model, a merged folder, or any HF folder; optionally dispatched across devices (big-model inference)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ftune import adapter
from ftune.errors import FtuneError, Location
from ftune.infer.source import Target

READ_HINT = "the folder was cut short or edited: copy it again, or pass --model with another checkpoint"


def quiet_libraries() -> None:
    """ftune prints what it does; library progress bars and advisory warnings would bury the answer."""
    import logging
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    warnings.filterwarnings("ignore", category=FutureWarning)
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)


def load_trained(plan, model_dir: Path, tokenizer, labels: list[str] | None = None, extra: dict | None = None):
    """The trained model from `model_dir`: a full model folder, or an adapter put on the recipe's base.

    `extra` adds `from_pretrained` kwargs (device_map, max_memory, offload_folder) to the recipe's.
    """
    from ftune.plan.checks.environment import forward_attention
    from ftune.plan.loading import model_load
    from ftune.runtime.model import load_model

    def with_extra(spec):
        kwargs = {**spec.kwargs, **(extra or {})}
        attn, note = forward_attention(kwargs.get("attn_implementation"), _device())
        if note is not None:
            import sys

            print(f"note: {note}", file=sys.stderr)
            kwargs["attn_implementation"] = attn
        return spec.model_copy(update={"kwargs": kwargs})

    check_fits(plan, model_dir)
    if adapter.is_adapter(model_dir):
        from peft import PeftModel

        from ftune.plan.quantization import upcasts
        from ftune.runtime import quantized

        # Quantize the base as the adapter was trained (final/ftune.json records it), guarded and upcast like
        # k-bit preparation, so eval reproduces the logged loss.
        section = quantized.recorded_quantization(model_dir) or plan.recipe.kbit
        recipe = plan.recipe.model_copy(update={"quantization": section})
        base = load_model(plan, tokenizer, labels=labels, spec=with_extra(model_load(recipe)))
        if section is not None:
            base = quantized.prepare_for_eval(base, upcast=upcasts(recipe))
        import warnings

        hint = ("merge it first (`ftune merge RUN_DIR`) and generate with the merged folder, or raise --max-memory "
                "so the adapted layers fit on a device")
        on_disk = sorted(name for name, device in (getattr(base, "hf_device_map", None) or {}).items()
                         if device == "disk")
        if on_disk:  # checked before peft runs: it would write the offloaded weights under ./tmp and fail
            raise FtuneError(f"the adapter can't be loaded over a base offloaded to disk ({len(on_disk)} modules on "
                             f"disk, e.g. `{on_disk[0] or 'the whole model'}`)", hint=hint)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # meta-parameter copies: checked just below
            try:
                model = PeftModel.from_pretrained(base, str(model_dir))
            except RuntimeError as err:
                if "size mismatch" not in str(err):
                    raise
                raise base_mismatch(plan, model_dir, str(err)) from None
        homeless = adapter.unplaced_lora_tensors(model, model_dir)
        if homeless:  # peft only warns: those layers would keep their base weights, silently
            raise base_mismatch(plan, model_dir, f"{len(homeless)} adapter tensors have no place in it, e.g. "
                                f"{homeless[0]}", shapes=False)
        offloaded = sorted(n for n, p in model.named_parameters() if p.device.type == "meta" and "base_layer" not in n
                           and any(k in n for k in ("lora_", "prompt_encoder", "adaption_")))
        if offloaded:  # peft can't load adapter weights into disk-offloaded layers: they would stay empty
            raise FtuneError(f"the adapter can't be loaded over a base offloaded to disk ({len(offloaded)} adapter "
                             f"tensors would stay empty, e.g. {offloaded[0]})", hint=hint)
        return model
    if (model_dir / "config.json").is_file():
        return load_model(plan, tokenizer, spec=with_extra(model_load(plan.recipe, path=str(model_dir))))
    raise FtuneError(f"{model_dir} holds neither a model (config.json) nor an adapter (adapter_config.json)",
                     hint="pass --model pointing at a run's final/ folder or a checkpoint")


def _device() -> str:
    """Where the forward runs: CUDA when visible (a device_map may place parts elsewhere), else CPU."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def check_fits(plan, model_dir: Path) -> None:
    """Before any weight is read: the folder was trained for the recipe's task, and its weights files are whole."""
    from ftune.plan.checks.model_files import safetensors_problem

    want = plan.recipe.model.task
    if adapter.is_adapter(model_dir):
        saved = adapter.read(model_dir, READ_HINT)
    else:
        record = model_dir / adapter.RECORD
        saved = adapter.SavedAdapter(model_dir, {}, adapter.read_json(record, READ_HINT) if record.is_file() else {})
    task = saved.task
    if task and task != want:
        source = f"its {adapter.RECORD}" if saved.record.get("task") else f"its {adapter.ADAPTER_CONFIG} task_type"
        raise FtuneError(f"{model_dir} was trained for model.task {task} ({source}), but the recipe's model.task "
                         f"is {want}",
                         hint=f"evaluate it with the recipe it was trained with (model.task={task}), or pass "
                         "--model with a folder trained for this task")
    for file in sorted(model_dir.glob("*.safetensors")):
        problem = safetensors_problem(file)
        if problem is not None:
            raise FtuneError(problem, hint="the file was cut short (a full disk, an interrupted copy): copy it "
                             "again or retrain; a complete checkpoint under checkpoints/ can be passed with --model")


def base_mismatch(plan, model_dir: Path, detail: str, shapes: bool = True) -> FtuneError:
    """The adapter's tensors don't fit the base the recipe names: say which base it was trained on."""
    trained_on = adapter.read(model_dir, READ_HINT).base or "an unrecorded base"
    first = next((line.strip() for line in detail.splitlines() if "size mismatch" in line), detail.strip())
    first = first.removeprefix("size mismatch for ")
    differ = "their shapes differ" if shapes else "their layers differ"
    if str(trained_on) != str(plan.recipe.model.path):
        message = (f"the adapter in {model_dir} was trained on base {trained_on}, the recipe's model.path is "
                   f"{plan.recipe.model.path}: {differ} ({first})")
    else:
        message = (f"the adapter in {model_dir} does not fit the recipe's model {plan.recipe.model.path} (the same "
                   f"path it was trained on, but {differ} now: {first})")
    return FtuneError(message, hint=f"set model.path to the base it was trained on ({trained_on}), or evaluate an "
                      "adapter trained on this model")


def load_tokenizer(target: Target):
    """The tokenizer saved with the model (final/ and merged folders hold one), with a pad token."""
    if target.plan is not None:
        from ftune.datastage.tokenizer import load

        return load(str(target.model_dir), target.plan.recipe, token=target.plan.secret("model.hub_token"),
                    prompt=target.plan.prompt)
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(target.model_dir))
    except (OSError, ValueError, TypeError, KeyError) as err:  # no tokenizer files, or ones transformers can't read
        raise FtuneError(f"{target.model_dir} holds no tokenizer ftune can load: {str(err).splitlines()[0][:200]}",
                         hint="copy the model's tokenizer files (tokenizer.json, tokenizer_config.json, ...) into the "
                         "folder", location=Location(file=str(target.model_dir))) from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token or tok.unk_token
    return tok


def context_length(model) -> int | None:
    """Positions the model has (max_position_embeddings of its text config), or None when it doesn't say."""
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    n = getattr(text, "max_position_embeddings", None)
    return n if isinstance(n, int) and n > 0 else None


def clamp_new_tokens(model, prompt_tokens: int, requested: int) -> tuple[int, str | None]:
    """New tokens to generate after a prompt of `prompt_tokens`: at most what the model's context has left, with a
    note when that is fewer than asked. A prompt that fills the context is an error."""
    limit = context_length(model)
    if limit is None or prompt_tokens + requested <= limit:
        return requested, None
    room = limit - prompt_tokens
    if room < 1:
        raise FtuneError(f"the prompt is {prompt_tokens} tokens, and the model's context is {limit} "
                         "(max_position_embeddings): no room to generate", hint="shorten the prompt")
    return room, (f"note: generating at most {room} new tokens, not {requested}: the prompt ({prompt_tokens} tokens) "
                  f"and the answer must fit the model's context of {limit} positions")


def dispatch_kwargs(device_map: str | None, max_memory: dict | None, offload_dir: str | None) -> dict:
    """accelerate's big-model inference through `from_pretrained`: build on the meta device, then load each
    weight straight to the device `device_map` gives it (GPUs, then CPU, then `offload_dir` on disk)."""
    out: dict = {}
    if device_map:
        out["device_map"] = device_map
    if max_memory:
        out["max_memory"] = max_memory
    if offload_dir:
        out["offload_folder"] = offload_dir
    return out


@dataclass
class Loaded:
    model: object
    tokenizer: object
    fmt: object  # PromptFormat
    stop_ids: list[int]
    description: str
    vision: object | None = None
    """A vision-language run's `ftune.infer.image_prompts.Vision` (processor, chat template, image settings): its prompts
    are encoded through it, images or not."""


def _not_causal(folder: Path) -> FtuneError:
    """A model folder ftune did not train whose class AutoModelForCausalLM doesn't know (a VLM, an encoder)."""
    import json

    try:
        model_type = json.loads((folder / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        model_type = None
    kind = f"{model_type} model" if model_type else "model"
    return FtuneError(f"{folder} holds a {kind} that AutoModelForCausalLM can't load: generate and chat take a "
                      "causal language model folder, or a run", hint="for a vision-language model, "
                      "fine-tune it with `model.task: image-text-to-text` and pass the run (its dir, final/ or merged "
                      "folder): its prompts carry images", location=Location(file=str(folder / "config.json")))


def load_for_generation(target: Target, *, extra: dict | None = None) -> Loaded:
    """Model, tokenizer, the run's prompt format and its stop tokens, ready to generate."""
    from ftune.generation import PromptFormat, model_prompt_format, prompt_format, stop_token_ids

    from ftune.infer.image_prompts import TASK, is_vision, load_vision

    quiet_libraries()
    vision = load_vision(target) if is_vision(target) else None
    tok = vision.processor.tokenizer if vision is not None else load_tokenizer(target)
    if target.plan is not None and not target.is_merged:
        model = load_trained(target.plan, target.model_dir, tok, extra=extra)
        fmt = prompt_format(target.plan, tok)
        q = target.record.get("quantization")
        kind = "adapter" if target.is_adapter else "model"
        description = f"{kind} {target.model_dir}" + (f" on a {q['bits']}-bit base" if target.is_adapter and q else "")
        extra_stops: list[int] = []
    else:
        import transformers

        kwargs = {"dtype": "auto", **(extra or {})}
        vlm = vision is not None or target.record.get("task") == TASK  # a merged vision-language model
        cls = transformers.AutoModelForImageTextToText if vlm else transformers.AutoModelForCausalLM
        try:
            model = cls.from_pretrained(str(target.model_dir), **kwargs)
        except ValueError as err:
            if "Unrecognized configuration class" not in str(err):
                raise
            raise _not_causal(target.model_dir) from None
        prompt = target.record.get("prompt")
        fmt = PromptFormat.from_dict(prompt) if prompt else model_prompt_format(tok)
        eos = model.generation_config.eos_token_id
        extra_stops = [eos] if isinstance(eos, int) else list(eos or [])
        description = f"{'merged model' if target.is_merged else 'model'} {target.model_dir}"
    placement = getattr(model, "hf_device_map", None) or getattr(getattr(model, "base_model", None), "hf_device_map", None)
    if placement:  # dispatched by accelerate: say where the modules went (GPUs, cpu, disk)
        from collections import Counter

        counts = Counter(str(d) for d in placement.values())
        description += " (modules on " + ", ".join(f"{d}: {n}" for d, n in sorted(counts.items())) + ")"
    return Loaded(model.eval(), tok, fmt, stop_token_ids(tok, fmt, extra_stops), description, vision)
