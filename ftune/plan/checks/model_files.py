"""The files tier's model checks: the model folder (config.json, whole weights, a VLM's image processor and chat
template) and reward models' folders. Each returns `Problem`s; the table of checks (`ftune.plan.checks`) says which
commands run each. The machine's own checks (devices, packages, the run dir) are `ftune.plan.checks.environment`.
"""

from __future__ import annotations

from pathlib import Path

from ftune import hub
from ftune.adapter import is_adapter
from ftune.errors import Problem
from ftune.hub import looks_local
from ftune.recipe.objectives import family_of
from ftune.recipe.schema import Recipe


def model_folder(recipe: Recipe, model_folder: bool = True) -> list[Problem]:
    """The model folder (unless it is a GGUF's converted copy, which `ftune.plan.gguf` checks) holds config.json,
    whole weights and a VLM's image processor (its absence: `ftune.plan.checks.paths.missing_inputs`)."""
    found: list[Problem] = model_files(recipe) + image_processor(recipe) + processor_chat_template(recipe)
    folder = Path(recipe.model.path).expanduser()
    if model_folder and folder.exists() and not (folder / "config.json").is_file() and not is_adapter(folder):
        # ftune.plan.adapter checks adapters
        found.append(Problem.at("model.path", f"{recipe.model.path} has no config.json",
                                "model.path must be a Hugging Face model folder (save_pretrained output), or a "
                                "run's final/ adapter to continue"))
    return found


def reward_models(recipe: Recipe) -> list[Problem]:
    """`train.rl.rewards: [{name: reward_model, path}]`: a local folder whose config.json is a sequence classifier
    with one output (its logit is the reward)."""
    import json

    rl = recipe.train.rl
    found: list[Problem] = []
    for i, spec in enumerate(rl.rewards if rl is not None and family_of(recipe).generates else []):
        path = spec.args.get("path")
        if spec.name != "reward_model" or not isinstance(path, str):
            continue
        where = f"train.rl.rewards[{i}].path"
        folder = hub.folder(path)  # a hub id: its cached snapshot (the reward model's own id: no model.revision)
        if folder is None and not looks_local(path):
            found += [p for p in [hub.missing(where, path, what="reward model")] if p is not None]
            continue  # online, the hub supplies it
        config = (folder or Path(path).expanduser()) / "config.json"
        if not config.is_file():
            found.append(Problem.at(where, f"reward model not found: {path} has no config.json",
                                    "point it at a sequence-classification model folder (an `objective: reward` "
                                    "run's final/, or a merged one)"))
            continue
        try:
            cfg = json.loads(config.read_text())
        except ValueError as err:
            found.append(Problem.at(where, f"{config} is not valid JSON: {err}"))
            continue
        arch = cfg.get("architectures") or []
        labels = cfg.get("num_labels", len(cfg.get("id2label") or {}) or 2)
        if not any(a.endswith("ForSequenceClassification") for a in arch):
            found.append(Problem.at(where, f"{path} is not a sequence classifier (architectures: "
                                    f"{', '.join(arch) or 'none'}); a reward model scores a text with one logit",
                                    "train one with `train.objective: reward`, or name a "
                                    "*ForSequenceClassification model"))
        elif labels != 1:
            found.append(Problem.at(where, f"{path} has {labels} labels; a reward model has one output (its logit "
                                    "is the reward)", "train it with `train.objective: reward` (num_labels 1)"))
    return found


def safetensors_problem(file: Path) -> str | None:
    """Why a .safetensors file can't be read (truncated, not safetensors), from its header alone; None if whole."""
    import json
    import struct

    try:
        size = file.stat().st_size
        with open(file, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                return f"{file} is truncated ({size} bytes)"
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                return f"{file} is truncated: its header says {n} bytes, the file has {size}"
            header = json.loads(fh.read(n))
    except OSError as err:
        return f"{file} can't be read: {err.strerror}"
    except ValueError:
        return f"{file} is not a safetensors file (its header is not JSON)"
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__" and isinstance(t, dict)),
              default=0)
    if 8 + n + end > size:
        return f"{file} is truncated: {size} bytes of {8 + n + end}"
    return None


def checkpoint_problem(folder: Path) -> str | None:
    """Why a marked checkpoint can't be resumed (a weights file cut short, an unreadable trainer state)."""
    import json

    for file in sorted(folder.glob("*.safetensors")):
        problem = safetensors_problem(file)
        if problem is not None:
            return problem
    try:
        json.loads((folder / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return f"{folder / 'trainer_state.json'} is missing or unreadable"
    return None


def model_files(recipe: Recipe) -> list[Problem]:
    """The model folder's weights are whole (a truncated download fails here, naming the file); a hub id's cached
    snapshot too."""
    folder = hub.folder(recipe.model.path, recipe.model.revision)
    if recipe.model.init == "random" or folder is None or is_adapter(folder):  # ftune.plan.adapter checks it
        return []
    for file in sorted(folder.glob("*.safetensors")):
        problem = safetensors_problem(file)
        if problem is not None:
            return [Problem.at("model.path", problem, "download or copy the model again (the file is incomplete)")]
    return []


PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")


def image_processor(recipe: Recipe) -> list[Problem]:
    """A vision-language model's local folder holds its image processor (AutoProcessor reads it from there)."""
    if recipe.model.task != "image-text-to-text":
        return []
    key = "model.tokenizer" if recipe.model.tokenizer else "model.path"
    folder = hub.folder(recipe.model.tokenizer or recipe.model.path, recipe.model.revision)
    if folder is None or is_adapter(folder):
        return []
    config = folder / "processor_config.json"
    has = (folder / "preprocessor_config.json").is_file() or (config.is_file() and "image_processor" in
                                                               config.read_text(errors="replace"))
    if has:
        return []
    return [Problem.at(key, f"{folder} has no image processor (no preprocessor_config.json, nor an image_processor "
                       "in processor_config.json): model.task image-text-to-text reads images through it",
                       "copy the processor files from the model's hub repository into the folder (or point "
                       "model.tokenizer at a folder holding them)")]


TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
TEMPLATE_CONFIGS = ("processor_config.json", "tokenizer_config.json")


def processor_chat_template(recipe: Recipe) -> list[Problem]:
    """A vision-language model's local folder holds the chat template vision-chat rows are rendered with, unless
    `data.chat_template` names one (the data stage's `dataset.vision.template_of`, before launch, in its words)."""
    import json

    if recipe.model.task != "image-text-to-text" or recipe.data.chat_template:
        return []
    key = "model.tokenizer" if recipe.model.tokenizer else "model.path"
    value = recipe.model.tokenizer or recipe.model.path
    folder = Path(value).expanduser()
    if not folder.is_dir() or is_adapter(folder) or any((folder / f).is_file() for f in TEMPLATE_FILES):
        return []
    for name in TEMPLATE_CONFIGS:
        try:
            if json.loads((folder / name).read_text()).get("chat_template"):
                return []
        except (OSError, ValueError, AttributeError):
            continue
    return [Problem.at(key, f"the processor of {value} has no chat template: vision-chat rows are rendered with it",
                       "set data.chat_template to a Jinja template that renders image parts (`{type: image}`) as "
                       "the model's image placeholder")]
