"""`ftune merge`: a run's output as a plain HF model folder, verified, written atomically.

LoRA is folded into its base, loaded unquantized in the chosen dtype (a QLoRA adapter too: never into
dequantized 4-bit weights); full and freeze runs are re-saved (re-sharded). Methods that add computation
with no weights to fold into (prefix tuning, LLaMA-Adapter) are refused. The folder is written as a hidden
`.NAME.partial-PID` sibling, reloaded with plain transformers and compared with the unmerged model on a few
eval samples, marked complete, and only then renamed: a killed or failed merge leaves nothing that looks
finished. A vision-language run merges into the whole image-text-to-text model (vision tower and projector
included), saved with its processor, and is checked on eval rows with their images (pixel inputs), so a
projector or vision-tower change that did not reach the merged weights fails the check.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from ftune import outputs
from ftune.adapter import ADAPTER_CONFIG
from ftune.errors import FtuneError, Location, RunError, UsageError
from ftune.infer.source import RECORD, Target
from ftune.rundir import RunDir, mark_complete

DTYPES = ("bfloat16", "float16", "float32")
TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}
"""Largest |merged - unmerged| logit allowed, relative to the largest |logit| of the unmerged model (at least 1).
float32 only reorders sums; half precisions round W + BA once, where the unmerged model rounds each product."""
SAMPLES = 4
SAMPLE_TOKENS = 64
FALLBACK_TEXTS = ("The quick brown fox jumps over the lazy dog.", "1 2 3 4 5 6 7 8 9 10",
                  "Question: what is the capital of France?\nAnswer:", "def add(a, b):\n    return a + b")


@dataclass
class MergeResult:
    out: str
    action: str
    """`merged` (adapter folded into its base) or `copied` (a full model, re-sharded)."""
    dtype: str
    base: str
    """How the base was loaded, e.g. 'unquantized bfloat16 (the run trained on a 4-bit base)'."""
    max_diff: float
    tolerance: float
    samples: int
    sample_source: str
    files: list[str]
    images: int = 0
    """Vision-language models: images in the check's inputs (their pixel inputs go through the vision tower and
    projector of both models, so a projector or vision LoRA that did not reach the merged weights fails it)."""
    quantized: str | None = None
    """A QAT run (`quantization.qat`): the scheme its linear layers were truly quantized to (torchao), checked
    against the fake-quantized model the run trained and evaluated."""
    experts_checked: int = 0
    """MoE models: experts whose merged output was compared with the adapter's, one by one (every expert of
    every layer), so a delta dropped from one expert fails the merge even when no sample token reaches it."""


EXPERT_PROBE_TOKENS = 8


def _expert_outputs(model, dtype: str) -> dict[tuple[str, int], object] | None:
    """Each expert's output on the same probe tokens, every token routed to that expert alone (weight 1), by
    (experts module, expert). None for a dense model. Called on the adapter model and on the merged one."""
    import torch

    from ftune.models.moe import base_name, moe_layout

    layout = moe_layout(model)
    if layout is None:
        return None
    modules = {base_name(n): m for n, m in model.named_modules() if ".base_layer" not in n}
    out = {}
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for block in layout.blocks:
            experts = modules[block.experts]
            param = next(iter(experts.parameters()))
            x = torch.randn(EXPERT_PROBE_TOKENS, _hidden_size(model), generator=gen).to(param.device,
                                                                                         getattr(torch, dtype))
            for e in range(layout.num_experts):
                index = torch.full((EXPERT_PROBE_TOKENS, 1), e, dtype=torch.long, device=param.device)
                weight = torch.ones(EXPERT_PROBE_TOKENS, 1, dtype=x.dtype, device=param.device)
                out[(block.experts, e)] = experts(x, index, weight).float().cpu()
    return out


def _hidden_size(model) -> int:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return config.hidden_size


def _fold(unmerged):
    """The adapter folded into its base (peft's merge: linear layers and fused expert tensors alike)."""
    return unmerged.merge_and_unload()


def default_dtype(plan) -> str:
    dtype = plan.recipe.model.dtype
    return dtype if dtype in DTYPES else "bfloat16"


def _sample_inputs(plan, tokenizer, processor=None) -> tuple[list[dict], str, int]:
    """A few eval rows (train rows when there is no eval split) as the run tokenized them, as model inputs
    (`input_ids`, and a vision-language run's pixel inputs); fixed texts (with a drawn image) when the data is gone.
    Also: where they came from, and the number of images they show."""
    from ftune.datafiles.sample import first_rows

    if processor is not None:
        return _image_samples(plan, processor)
    fixed = [{"input_ids": _ids(tokenizer(t)["input_ids"][:SAMPLE_TOKENS])} for t in FALLBACK_TEXTS]
    # the first rows read directly, tokenized as the run did: never the whole data stage (a cold cache would
    # re-preprocess every row for 4 of them)
    rows, where = first_rows(plan.recipe, tokenizer, SAMPLES, plan.data.rows)
    picked = [{"input_ids": _ids(ids[:SAMPLE_TOKENS])} for ids in rows]
    if not picked:
        return fixed, "fixed texts (no local row with text)", 0
    return picked, f"{len(picked)} {where} rows", 0


def _ids(ids: list[int]):
    import torch

    return torch.tensor([list(ids)], dtype=torch.long)


def _image_samples(plan, processor) -> tuple[list[dict], str, int]:
    """A vision-language run's check inputs: its first eval (or train) rows with their images, read directly and
    encoded as the data stage does (`ftune.datastage.vision_chat.first_rows`: placeholders expanded; never the whole data
    stage), with pixel inputs as the run's collator builds them (a row is cut after SAMPLE_TOKENS tokens but never
    inside its image tokens); rows with images first. A drawn image with a fixed question when the data is gone,
    so the check always runs through the vision tower."""
    from ftune.datastage.vision_chat import first_rows, image_token_ids, pixel_inputs

    settings = plan.recipe.data.images
    try:
        rows, where = first_rows(plan.recipe, processor, SAMPLES, plan.data.max_images)
    except (FtuneError, OSError):
        rows, where = [], None
    if not rows:
        where = None
    image_ids = image_token_ids(processor)
    samples, images = [], 0
    for row in sorted(rows, key=lambda r: not r["images"]):
        ids, paths = row["input_ids"], row["images"]
        last = max((k for k, t in enumerate(ids) if t in image_ids), default=-1)
        ids = _ids(ids[: max(SAMPLE_TOKENS, last + 1)])
        samples.append({"input_ids": ids, **pixel_inputs(processor, [paths], settings, ids)})
        images += len(paths)
    if images:
        return samples, f"{len(samples)} {where} rows with {images} images ({_pixel_keys(samples)})", images
    samples = [_drawn_sample(plan, processor)]
    why = "the run's data or its images are unavailable" if where is None else f"no image in the {where} rows"
    return samples, f"a drawn image with a fixed question ({_pixel_keys(samples)}; {why})", 1


def _pixel_keys(samples: list[dict]) -> str:
    """The image inputs the check feeds the models, e.g. `pixel_values`."""
    return ", ".join(sorted({k for s in samples for k in s if k != "input_ids"}))


def _drawn_sample(plan, processor) -> dict:
    """One prompt with a drawn image (a colour gradient at the run's smallest image size, so it resizes as data
    would): the check's input when the run's rows are gone."""
    from PIL import Image

    from ftune.datastage.vision_chat import template_of

    side = max(28, int(plan.recipe.data.images.min_pixels ** 0.5))
    image = Image.new("RGB", (side, side))
    image.putdata([(255 * x // side, 255 * y // side, 128) for y in range(side) for x in range(side)])
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in the image?"}]}]
    text = processor.apply_chat_template(messages, chat_template=template_of(plan.recipe, processor), tokenize=False,
                                         add_generation_prompt=True)
    enc = processor(text=[text], images=[[image]], add_special_tokens=False, return_tensors="pt")
    return {k: v for k, v in enc.items() if k != "attention_mask" and hasattr(v, "dtype")}


def _logits(model, samples: list[dict]) -> list:
    import torch

    device = model.get_input_embeddings().weight.device
    with torch.no_grad():
        return [model(**{k: v.to(device) for k, v in s.items()}).logits.float().cpu() for s in samples]


def _max_diff(reference: list, found: list) -> tuple[float, float]:
    """(largest absolute difference, largest |reference logit|)."""
    diff = max(float((a - b).abs().max()) for a, b in zip(reference, found))
    scale = max(float(a.abs().max()) for a in reference)
    return diff, scale


def _load_base(plan, tokenizer, dtype: str, path: str | None = None):
    from ftune.plan.loading import model_load
    from ftune.runtime.model import load_model

    recipe = plan.recipe.model_copy(update={"quantization": None})  # merge into full-precision weights
    spec = model_load(recipe, path=path)
    spec = spec.model_copy(update={"kwargs": {**spec.kwargs, "dtype": dtype}})
    return load_model(plan, tokenizer, spec=spec).eval()


def _check_experts(reference, found, dtype: str) -> int:
    """Every expert's merged output against the adapter model's; the number of experts compared."""
    if not reference:
        return 0
    for key, want in reference.items():
        got = found[key]
        diff = float((want - got).abs().max())
        tolerance = TOLERANCE[dtype] * max(1.0, float(want.abs().max()))
        if not diff <= tolerance:
            raise RunError(f"merge check failed: expert {key[1]} of {key[0]} computes differently merged than with "
                           f"the adapter (largest difference {diff:.3g}, allowed in {dtype}: {tolerance:.3g}): its "
                           "adapter delta did not reach the merged weights",
                           hint="nothing was written; report this with the run dir (the run's final/ is untouched)")
    return len(reference)


def refuse_unmergeable(target: Target) -> str:
    """The action for the target's method (`merge` or `copy`); raises for methods that can't be merged."""
    if target.plan is None:
        raise UsageError(f"{target.model_dir} is not a run's output: merge needs the run (its plan.json)",
                         hint="pass the run dir or the recipe that trained it")
    if target.is_merged:
        raise UsageError(f"{target.model_dir} is already a merged model", hint="generate with it directly")
    peft = target.plan.recipe.peft
    method = target.record.get("method", peft.method)
    if peft.merge is None:
        raise FtuneError(
            f"a {method} adapter can't be merged into its base: {method} adds prompt/prefix computation that has "
            "no weight to fold into, so it stays an adapter",
            hint=f"use it as it is: `ftune generate {target.model_dir.parent}` or `ftune chat {target.model_dir.parent}` "
                 "load the adapter over its base",
            location=Location(file=str(target.model_dir / ADAPTER_CONFIG)))
    return peft.merge


def check_out(target: Target, out: Path | None, force: bool) -> Path:
    """Where the merge goes (default: <run>/merged), through the output policy: never the run's final/ or
    checkpoints/, its base model, another run dir, or a folder ftune did not write (ftune.outputs)."""
    base = Path(target.plan.recipe.model.path).expanduser()
    protected = [(base, "the adapter's base model")] if base.exists() else []
    return outputs.check_output(out if out is not None else RunDir(target.model_dir.parent).merged, outputs.MERGED,
                                inputs=[target.model_dir], protected=protected, force=force, flag="--out")


def merge(target: Target, *, out: Path | None = None, dtype: str | None = None, shard_size: int | str = "5GB",
          force: bool = False, quantize: bool = True, log: Callable[[str], None] = lambda s: None) -> MergeResult:
    """Write the merged (or re-sharded) model of `target` to `out` (default: <run>/merged), verified; a QAT run's
    truly quantized with its scheme (`quantize=False`: its full-precision weights, as GGUF export needs)."""
    action = refuse_unmergeable(target)
    plan = target.plan
    dtype = dtype or default_dtype(plan)
    out = check_out(target, out, force)
    for stale in outputs.stale_partials(out):  # left by a killed merge: never a result
        log(f"removing {stale.name}, left by an interrupted merge")
        shutil.rmtree(stale, ignore_errors=True)
    tmp = outputs.partial_folder(out)
    try:
        return _write_verified(target, plan, action, dtype, shard_size, out, tmp, log, quantize)
    except OSError as err:
        if err.errno not in outputs.WRITE_ERRNOS:
            raise
        raise outputs.io_error(err, out) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_verified(target, plan, action, dtype, shard_size, out, tmp, log, quantize) -> MergeResult:
    import transformers

    from ftune.infer.load import load_tokenizer, quiet_libraries
    from ftune.generation import as_chat_template, prompt_format, stop_token_ids
    from ftune.runtime.saved import saved_tensors

    quiet_libraries()
    tmp.mkdir(parents=True)
    from ftune.infer.image_prompts import is_vision, load_vision

    vision = load_vision(target) if is_vision(target) else None  # the processor travels with the merged model
    tok = vision.processor.tokenizer if vision is not None else load_tokenizer(target)
    fmt = prompt_format(plan, tok)
    quant = target.record.get("quantization") or (plan.recipe.kbit.model_dump() if plan.recipe.kbit
                                                   else None)
    base = f"unquantized {dtype}" + (f" (the run trained on a {quant['bits']}-bit base; the adapter is folded into "
                                     "full-precision weights, not dequantized ones)" if quant else "")
    record = {"merged_from": str(target.model_dir), "method": plan.recipe.peft.method,
              "base_model": plan.recipe.model.path, "dtype": dtype, "base": base, "prompt": fmt.to_dict(),
              "task": plan.recipe.model.task}
    (tmp / RECORD).write_text(json.dumps(record, indent=2) + "\n")  # first: a partial folder says what it is

    cls = getattr(transformers, plan.model_load.auto_class)
    samples, sample_source, images = _sample_inputs(plan, tok, vision.processor if vision is not None else None)
    if action == "merge":
        from peft import PeftModel

        log(f"loading the base {plan.recipe.model.path} {base}")
        unmerged = PeftModel.from_pretrained(_load_base(plan, tok, dtype), str(target.model_dir)).eval()
        reference = _logits(unmerged, samples)
        expert_reference = _expert_outputs(unmerged, dtype)
        model = _fold(unmerged)
    else:
        log(f"loading {target.model_dir} in {dtype}")
        model = _load_base(plan, tok, dtype, path=str(target.model_dir))
        reference = _logits(model, samples)
        expert_reference = None

    qat = plan.recipe.qat if quantize else None
    if qat is not None:  # the reference: the fake-quantized model the run trained; then the true conversion
        model, reference = _convert(model, qat, cls, samples, dtype, tmp)
        record["quantized"] = qat.scheme
        (tmp / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    if getattr(model, "generation_config", None) is not None:  # causal LMs: stop where the run's answers end
        stops = stop_token_ids(tok, fmt)
        model.generation_config.eos_token_id = stops[0] if len(stops) == 1 else stops
        model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(str(tmp), max_shard_size=shard_size, safe_serialization=True)
    if vision is not None:  # the image processor, tokenizer and the run's chat template, as AutoProcessor reads them
        vision.processor.chat_template = vision.template
        vision.processor.save_pretrained(str(tmp))
    else:
        template = as_chat_template(fmt)
        if template is not None:
            tok.chat_template = template
        tok.save_pretrained(str(tmp))
    del model

    leftovers = sorted(n for n in saved_tensors(tmp) if "lora_" in n or ".base_layer." in n)
    if leftovers:
        raise RunError(f"merge check failed: adapter tensors remain in the merged model: {leftovers[:3]}",
                       hint="report this with the run dir; the run's final/ is untouched")
    reloaded = cls.from_pretrained(str(tmp), dtype=dtype).eval()
    checked = _check_experts(expert_reference, _expert_outputs(reloaded, dtype), dtype)  # first: it names the expert
    diff, scale = _max_diff(reference, _logits(reloaded, samples))
    tolerance = TOLERANCE[dtype] * max(1.0, scale)
    if not diff <= tolerance:
        raise RunError(
            f"merge check failed: the merged model's logits differ from the unmerged ones by {diff:.3g} "
            f"(allowed in {dtype}: {tolerance:.3g}) on {sample_source}",
            hint="nothing was written; try --dtype float32, and report this with the run dir")
    files = sorted(p.name for p in tmp.iterdir())
    result = MergeResult(str(out), "merged" if action == "merge" else "copied", dtype, base, diff, tolerance,
                         len(samples), sample_source, files, images=images, experts_checked=checked,
                         quantized=qat.scheme if qat is not None else None)
    mark_complete(tmp, asdict(result))
    outputs.publish_folder(tmp, out)  # an existing out is a finished merge (check_out), replaced only now
    return result


def _convert(model, qat, cls, samples: list[dict], dtype: str, tmp: Path):
    """(the model truly quantized with the QAT scheme, the fake-quantized model's logits on `samples`): the trained
    weights fake-quantized as in training, then saved plain and reloaded through transformers' TorchAoConfig, which
    applies the same torchao config (QAT's convert step) and writes a folder plain `from_pretrained` reloads."""
    from ftune.runtime import qat as qat_runtime

    config = qat_runtime.quantization_config(model, qat)
    reference = _logits(qat_runtime.prepare(model, qat.model_copy(update={"start_after_steps": 0})), samples)
    plain = tmp.with_name(tmp.name + ".plain")
    try:
        qat_runtime.unwrap(model).save_pretrained(str(plain), safe_serialization=True)
        del model
        return cls.from_pretrained(str(plain), dtype=dtype, quantization_config=config).eval(), reference
    finally:
        shutil.rmtree(plain, ignore_errors=True)
