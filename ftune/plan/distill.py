"""The distill family's part of the Plan and its file checks: GKDConfig's own kwargs, the teacher as the worker
loads it (`Plan.teacher`), and what the folders must agree on (the teacher's tokenizer is the student's; the
layers `model.init_from` keeps exist). Light: JSON files read directly, no trl, transformers or torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ftune import hub
from ftune.adapter import is_adapter
from ftune.errors import Problem
from ftune.plan.plan import ModelLoad
from ftune.recipe.objectives import DISTILL_BETA, DISTILL_JSD_BETA, family_of
from ftune.recipe.schema import Recipe

SPECIAL = ("bos_token", "eos_token", "pad_token", "unk_token")


def config_kwargs(recipe: Recipe) -> dict[str, Any]:
    """`train.distill` → GKDConfig's own kwargs ({} for the other families): every value written out."""
    d = recipe.train.distill
    if not family_of(recipe).teacher or d is None:
        return {}
    return {
        "lmbda": d.on_policy,
        "beta": DISTILL_BETA.get(d.loss, d.beta if d.beta is not None else DISTILL_JSD_BETA),
        "temperature": d.temperature,
        "max_new_tokens": d.max_new_tokens,
        "seq_kd": d.teacher_sequences,
        "disable_dropout": True,
        # ftune's data stage tokenizes and masks the rows and brings the collator (prompts for generation)
        "remove_unused_columns": False,
        "dataset_kwargs": {"skip_prepare_dataset": True},
    }


def teacher_load(recipe: Recipe) -> ModelLoad | None:
    """How the worker loads the teacher: frozen, whole, in `train.distill.dtype` (default the student's)."""
    d = recipe.train.distill
    if not family_of(recipe).teacher or d is None:
        return None
    dtype = d.dtype or (recipe.model.dtype if recipe.model.dtype != "auto" else "float32")
    kwargs: dict[str, Any] = {"dtype": dtype, "trust_remote_code": recipe.model.trust_remote_code}
    if recipe.model.attn_implementation:
        kwargs["attn_implementation"] = recipe.model.attn_implementation
    return ModelLoad(auto_class="AutoModelForCausalLM", path=d.teacher, init="pretrained", kwargs=kwargs)


def notes(recipe: Recipe) -> list[str]:
    d = recipe.train.distill
    if not family_of(recipe).teacher or d is None:
        return []
    how = {"forward_kl": "forward KL(teacher || student)", "reverse_kl": "reverse KL(student || teacher)"}.get(
        d.loss, f"generalized JSD (beta {config_kwargs(recipe)['beta']})")
    seqs = "the teacher's samples" if d.teacher_sequences else "the data's completions"
    out = [f"distill: the student learns the teacher {d.teacher} ({how}) on {seqs}"
           + (f", on its own samples for {d.on_policy:.0%} of the batches (up to {d.max_new_tokens} new tokens, "
              f"temperature {d.temperature})" if d.on_policy else "")]
    if recipe.model.init_from is not None:
        out.append(f"student: built in the worker from {recipe.model.init_from.path}'s embeddings, head and "
                   f"{len(recipe.model.init_from.layers)} decoder layers {recipe.model.init_from.layers}")
    return out


# ------------------------------------------------------------------------------------- files tier
def problems(recipe: Recipe) -> list[Problem]:
    """The teacher's folder, its tokenizer against the student's, and `init_from`'s layers against its config."""
    return _teacher(recipe) + _layers(recipe)


def _folder(value: str, revision: str | None = None) -> Path | None:
    return None if value.lower().endswith(".gguf") else hub.folder(value, revision)


def _teacher(recipe: Recipe) -> list[Problem]:
    d = recipe.train.distill
    if not family_of(recipe).teacher or d is None:
        return []
    at = "train.distill.teacher"
    if d.teacher.lower().endswith(".gguf"):
        return [Problem.at(at, f"{d.teacher} is a GGUF file; the teacher is loaded as a Hugging Face model",
                           "convert it: `ftune merge` a run trained on it, or point at its converted folder")]
    teacher = _folder(d.teacher)
    if teacher is None:
        if (p := hub.missing(at, d.teacher, what="teacher")) is not None:
            return [p]
        local = Path(d.teacher).expanduser()
        return [Problem.at(at, f"teacher folder not found: {d.teacher}", "point it at a model folder")] \
            if d.teacher.startswith(("/", ".", "~")) or local.parent.is_dir() and not local.exists() else []
    if is_adapter(teacher):
        return [Problem.at(at, f"{d.teacher} is a saved adapter, not a model",
                           f"merge it into its base first: `ftune merge {d.teacher}`, and name the merged folder")]
    if not (teacher / "config.json").is_file():
        return [Problem.at(at, f"teacher folder {d.teacher} has no config.json", "point it at a HF model folder")]
    student_source = recipe.model.tokenizer or recipe.model.path
    student = _folder(student_source, recipe.model.revision)
    if student is None:
        return []  # a GGUF student (its converted folder) or a missing one: its own checks say so
    differs = tokenizer_difference(teacher, student)
    return [] if differs is None else [Problem.at(
        at, f"the teacher's tokenizer is not the student's ({student_source}): {differs}",
        "distillation compares next-token distributions token by token: use a teacher with the student's "
        "tokenizer (the same family), or set model.tokenizer to the teacher's if the vocabularies are the same")]


def tokenizer_difference(teacher: Path, student: Path) -> str | None:
    """What differs between two tokenizer folders' vocabularies and special tokens (None: nothing found)."""
    tv, sv = _vocab(teacher), _vocab(student)
    if tv is not None and sv is not None and tv != sv:
        if len(tv) != len(sv):
            return f"the teacher's vocabulary has {len(tv):,} tokens, the student's {len(sv):,}"
        inv_t, inv_s = {i: t for t, i in tv.items()}, {i: t for t, i in sv.items()}
        first = min(i for i in set(inv_t) | set(inv_s) if inv_t.get(i) != inv_s.get(i))
        return f"token id {first} is {inv_t.get(first)!r} in the teacher, {inv_s.get(first)!r} in the student"
    ts, ss = _special(teacher), _special(student)
    for name in SPECIAL:
        if ts.get(name) != ss.get(name):
            return f"{name} is {ts.get(name)!r} in the teacher, {ss.get(name)!r} in the student"
    tn, sn = _config_vocab(teacher), _config_vocab(student)
    if tn is not None and sn is not None and tn != sn:
        return f"config.json's vocab_size is {tn:,} in the teacher, {sn:,} in the student (embedding rows differ)"
    return None


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _vocab(folder: Path) -> dict[str, int] | None:
    """tokenizer.json's vocabulary with its added tokens (token -> id), or vocab.json's; None if neither."""
    tok = _json(folder / "tokenizer.json")
    if tok is not None:
        vocab = (tok.get("model") or {}).get("vocab")
        if isinstance(vocab, list):  # Unigram: [[piece, score], ...]
            vocab = {row[0]: i for i, row in enumerate(vocab)}
        out = dict(vocab or {})
        out.update({a["content"]: a["id"] for a in tok.get("added_tokens") or [] if "content" in a})
        return out
    return _json(folder / "vocab.json")


def _special(folder: Path) -> dict[str, str | None]:
    cfg = _json(folder / "tokenizer_config.json") or {}
    mapping = _json(folder / "special_tokens_map.json") or {}
    out = {}
    for name in SPECIAL:
        value = cfg.get(name, mapping.get(name))
        out[name] = value.get("content") if isinstance(value, dict) else value
    return out


def _config_vocab(folder: Path) -> int | None:
    cfg = _json(folder / "config.json") or {}
    return (cfg.get("text_config") or cfg).get("vocab_size")


def _layers(recipe: Recipe) -> list[Problem]:
    init = recipe.model.init_from
    if init is None:
        return []
    folder = _folder(init.path, recipe.model.revision)
    cfg = _json(folder / "config.json") if folder is not None else None
    if cfg is None:
        return []  # a missing folder: the paths check names it
    depth = (cfg.get("text_config") or cfg).get("num_hidden_layers")
    if not isinstance(depth, int):
        return [Problem.at("model.init_from", f"{init.path}'s config.json has no num_hidden_layers",
                           "init_from builds a student from a decoder's layers: name a decoder-only LM")]
    return [Problem.at(f"model.init_from.layers.{i}", f"layer {layer} is out of range: {init.path} has {depth} "
                       f"decoder layers (0-{depth - 1})", f"list layers below {depth}")
            for i, layer in enumerate(init.layers) if layer >= depth]
