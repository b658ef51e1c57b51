"""Generation with a trained model: the run's prompt format, its stop tokens, batched decoding, and the
generation metrics (exact match, token F1) that `ftune eval` and the end of `ftune run` report.

A prompt is built exactly as training built it (the instruction template, or the chat template with the
generation prompt), and decoding stops at EOS or at an end-of-turn token the chat template uses: a model
trained to end its turn with `<|im_end|>` would otherwise run on past its answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from ftune.generation import stops
from ftune.datafiles.formats import ALPACA_TEMPLATE, ALPACA_TEMPLATE_NO_INPUT
from ftune.datafiles.masking import IGNORE

Prompt = str | dict
"""A plain prompt, `{"instruction", "input"}`, `{"prompt"}`, or `{"messages": [...]}` (a conversation)."""


@dataclass(frozen=True)
class PromptFormat:
    """How a prompt becomes tokens, as the run's training data did: `text` (as is), `instruction` (its
    template), or `chat` (the chat template, ending with the assistant's generation prompt)."""

    format: str
    template: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> PromptFormat:
        return cls(format=data["format"], template=data.get("template"))


def prompt_format(plan, tokenizer) -> PromptFormat:
    """The prompt format of a run as its Plan recorded it (`Plan.prompt`, decided before launch from the training
    data: `ftune.datafiles.prompts`; a plan written before ftune recorded it is decided from its recipe now), the
    chat template resolved with `tokenizer` (the one saved with the model). A vision run's prompts are encoded by
    `ftune.infer.image_prompts` (with their images); its format here names the template for the stop tokens and a
    merged folder's record."""
    from ftune.datafiles.chat_rows import chat_template_of
    from ftune.datafiles.prompts import decide

    decided = plan.prompt or decide(plan.recipe)
    if decided.chat:
        return PromptFormat("chat", chat_template_of(plan.recipe, tokenizer))
    return PromptFormat(decided.format, decided.template)


def as_chat_template(fmt: PromptFormat) -> str | None:
    """A Jinja chat template that renders prompts as `fmt` does (for a merged folder, so plain transformers
    users get the run's prompt with `apply_chat_template`): the chat template itself, or the instruction
    template around the last user message; None for plain text."""
    import json
    import string

    if fmt.format == "chat":
        return fmt.template
    if fmt.format != "instruction":
        return None
    template = fmt.template or ALPACA_TEMPLATE_NO_INPUT
    out = ["{%- set ns = namespace(prompt='') -%}{%- for m in messages -%}{%- if m['role'] == 'user' -%}"
           "{%- set ns.prompt = m['content'] -%}{%- endif -%}{%- endfor -%}"]
    for literal, name, _, _ in string.Formatter().parse(template):
        if literal:
            out.append("{{ " + json.dumps(literal) + " }}")
        if name == "instruction":
            out.append("{{ ns.prompt }}")
    return "".join(out)


def model_prompt_format(tokenizer) -> PromptFormat:
    """A model folder ftune did not write: its own chat template when it has one, else plain text."""
    template = getattr(tokenizer, "chat_template", None)
    return PromptFormat("chat", template) if isinstance(template, str) and template else PromptFormat("text")


def encode_prompt(fmt: PromptFormat, tokenizer, prompt: Prompt, system: str | None = None) -> list[int]:
    """Token ids of `prompt`, ready for the model to continue with its answer."""
    if isinstance(prompt, dict) and "messages" in prompt:
        messages = [dict(m) for m in prompt["messages"]]
    elif isinstance(prompt, dict) and "instruction" in prompt:
        messages = None
        instruction, inp = str(prompt["instruction"]), str(prompt.get("input") or "")
    else:
        text = prompt.get("prompt", "") if isinstance(prompt, dict) else prompt
        messages = [{"role": "user", "content": str(text)}]
    if fmt.format == "chat":
        if messages is None:
            messages = [{"role": "user", "content": f"{instruction}\n\n{inp}".strip()}]
        if system and not (messages and messages[0]["role"] == "system"):
            messages = [{"role": "system", "content": system}, *messages]
        text = tokenizer.apply_chat_template(messages, chat_template=fmt.template, tokenize=False,
                                             add_generation_prompt=True)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    if messages is not None:  # a conversation on a single-turn format: the last user turn is the prompt
        instruction, inp = next((m["content"] for m in reversed(messages) if m["role"] == "user"), ""), ""
    if fmt.format == "instruction":
        template = fmt.template or (ALPACA_TEMPLATE if inp.strip() else ALPACA_TEMPLATE_NO_INPUT)
        return tokenizer(template.format(instruction=instruction, input=inp), add_special_tokens=True)["input_ids"]
    return tokenizer(f"{instruction}\n\n{inp}".strip() if inp else instruction, add_special_tokens=True)["input_ids"]


def stop_token_ids(tokenizer, fmt: PromptFormat | None = None, extra: Iterable[int] = ()) -> list[int]:
    """EOS, the end-of-turn tokens the run's chat template writes, and `extra` (a model's generation config)."""
    template = fmt.template if fmt is not None and fmt.format == "chat" else None
    return stops.stop_token_ids(tokenizer, template, extra)


@dataclass(frozen=True)
class Completion:
    ids: list[int]
    text: str
    stopped: bool
    """True when a stop token ended it; False when it ran out of `max_new_tokens`."""


def input_device(model):
    """Where inputs go: the embedding's device (the first device of a dispatched model; CPU when offloaded)."""
    import torch

    device = model.get_input_embeddings().weight.device
    return torch.device("cpu") if device.type == "meta" else device


def generate(model, tokenizer, prompts: Sequence[list[int]], *, stop_ids: list[int], max_new_tokens: int = 128,
             temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None, batch_size: int = 8,
             streamer=None, images: Sequence[list[str]] | None = None, pixels=None) -> list[Completion]:
    """Complete each prompt (token ids), left-padded in batches; greedy when `temperature` is 0.

    Sampling is seeded (`seed`), so a seeded run repeats itself; greedy decoding needs no seed.
    A vision-language model: `images[i]` are prompt i's image files and `pixels(paths, ids)` the model's image
    inputs for a batch (`ftune.datastage.vision_chat.pixel_inputs` bound to the processor and data.images).
    """
    import torch
    from transformers import GenerationConfig, set_seed

    if seed is not None:
        set_seed(seed)
    pad = next(t for t in (tokenizer.pad_token_id, *stop_ids, 0) if t is not None)
    sample = temperature > 0
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=sample, eos_token_id=list(stop_ids) or None,
                              pad_token_id=pad, **({"temperature": temperature, "top_p": top_p} if sample else {}))
    device = input_device(model)
    was_training = model.training
    model.eval()
    out: list[Completion] = []
    try:
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start : start + batch_size]
            width = max(len(p) for p in chunk)
            ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for i, p in enumerate(chunk):
                ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
                mask[i, width - len(p):] = 1
            extra = {}
            if pixels is not None and images is not None:
                extra = {k: v.to(device) for k, v in pixels(list(images[start : start + batch_size]), ids).items()}
            with torch.no_grad():
                gen = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                     generation_config=config, streamer=streamer, **extra)
            for row in gen[:, width:].tolist():
                stop = next((k for k, t in enumerate(row) if t in stop_ids), None)
                new = row if stop is None else row[:stop]
                out.append(Completion(new, tokenizer.decode(new, skip_special_tokens=True).strip(), stop is not None))
    finally:
        model.train(was_training)
    return out


# ------------------------------------------------------------------------------ evaluation by generation
def normalize(text: str) -> str:
    """Lower case, whitespace collapsed: what exact match and F1 compare."""
    return " ".join(text.lower().split())


def exact_match(prediction: str, reference: str) -> float:
    return float(normalize(prediction) == normalize(reference))


def token_f1(prediction: str, reference: str) -> float:
    """F1 of the whitespace tokens of prediction and reference (counted with multiplicity)."""
    from collections import Counter

    pred, ref = normalize(prediction).split(), normalize(reference).split()
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


METRICS = {"exact_match": exact_match, "f1": token_f1}


def eval_images(dataset, limit: int | None = None) -> list[list[str]] | None:
    """The image files of the eval rows `eval_pairs` keeps (vision-chat data), None for text data."""
    if "images" not in getattr(dataset, "column_names", []):
        return None
    out = []
    for row in dataset:
        if limit is not None and len(out) >= limit:
            break
        first = next((i for i, label in enumerate(row["labels"]) if label != IGNORE), None)
        if first:
            out.append(list(row["images"] or []))
    return out


def eval_pairs(dataset, limit: int | None = None) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, reference ids) of eval rows, from the tokens training scored: the prompt is everything
    before the first loss-bearing token, the reference the first run of loss-bearing tokens (the answer,
    or the first assistant turn, with its end-of-turn tokens). Rows without a masked prompt are skipped."""
    pairs = []
    for row in dataset:
        if limit is not None and len(pairs) >= limit:
            break
        ids, labels = row["input_ids"], row["labels"]
        first = next((i for i, label in enumerate(labels) if label != IGNORE), None)
        if not first:  # None: nothing trained; 0: no prompt (train_on: all)
            continue
        end = first
        while end < len(labels) and labels[end] != IGNORE:
            end += 1
        pairs.append((list(ids[:first]), list(ids[first:end])))
    return pairs


def generation_metrics(model, tokenizer, dataset, *, metrics: Sequence[str], max_new_tokens: int,
                       max_samples: int | None, stop_ids: list[int], batch_size: int = 8,
                       predictions: Path | None = None, log=None, pixels=None) -> dict:
    """`eval_<metric>` of greedy completions against the references, averaged over the eval rows used.

    `predictions`: write one JSON line per row there (prompt, reference, completion, stopped, scores), replacing
    the file. `log`: called with a plain progress line after each batch (a log file sees generation move)."""
    import json
    import time

    from ftune.errors import FtuneError

    pairs = eval_pairs(dataset, max_samples)
    images = eval_images(dataset, max_samples) if pixels is not None else None
    if not pairs:
        raise FtuneError("no eval row has a prompt to complete: generation metrics need prompt-masked labels",
                         hint="use instruction or chat data with `data.train_on: completion`")
    completions: list[Completion] = []
    t0 = time.time()
    for start in range(0, len(pairs), batch_size):
        chunk = [p for p, _ in pairs[start : start + batch_size]]
        completions += generate(model, tokenizer, chunk, stop_ids=stop_ids, max_new_tokens=max_new_tokens,
                                batch_size=batch_size, pixels=pixels,
                                images=images[start : start + batch_size] if images is not None else None)
        if log is not None:
            from ftune.clock import clock

            done, elapsed = len(completions), time.time() - t0
            log(f"generate {done}/{len(pairs)}  elapsed {clock(elapsed)}  "
                f"eta {clock(elapsed / done * (len(pairs) - done))}")
    references = [tokenizer.decode([t for t in ref if t not in stop_ids], skip_special_tokens=True).strip()
                  for _, ref in pairs]
    scores = [{name: METRICS[name](c.text, r) for name in metrics} for c, r in zip(completions, references)]
    result = {f"eval_{name}": sum(s[name] for s in scores) / len(pairs) for name in metrics}
    result["eval_generated"] = len(pairs)
    result["eval_stopped"] = sum(c.stopped for c in completions) / len(pairs)
    if predictions is not None:
        tmp = predictions.with_name(f".{predictions.name}.tmp")
        with tmp.open("w", encoding="utf-8") as f:
            for (prompt, _), ref, c, sc in zip(pairs, references, completions, scores):
                f.write(json.dumps({"prompt": tokenizer.decode(prompt, skip_special_tokens=False),
                                    "reference": ref, "completion": c.text, "stopped": c.stopped,
                                    "scores": sc}, ensure_ascii=False) + "\n")
        tmp.replace(predictions)
    return result


def read_predictions(path: Path, limit: int | None = None) -> list[dict]:
    """The first `limit` rows of a predictions.jsonl."""
    import json

    rows = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if limit is not None and len(rows) >= limit:
                break
            if line.strip():
                rows.append(json.loads(line))
    return rows
