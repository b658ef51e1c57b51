"""A saved PEFT adapter folder (a run's final/, a checkpoint, any peft `save_pretrained` output): its
adapter_config.json, the ftune.json record beside it, the base it was trained on and its task.

Light (json only), shared by both moments that read one: the compiler, to continue training an adapter
(`model.path` pointing at it), and `ftune eval/merge/generate`, to load one over its base.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ftune.errors import FtuneError, Location
from ftune.outputs import ADAPTER_CONFIG, RECORD  # noqa: F401  (ftune's file names live with the output policy)

PEFT_TASKS = {"causal-lm": "CAUSAL_LM", "sequence-classification": "SEQ_CLS"}
"""ftune's model.task -> peft's task_type."""


def is_adapter(folder: Path) -> bool:
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def read_json(file: Path, hint: str | None = None) -> dict:
    """A JSON object from `file`, or a located FtuneError saying why not (unreadable, cut short, not an object)."""
    try:
        data = json.loads(Path(file).read_text())
    except OSError as err:
        raise FtuneError(f"{file} can't be read: {err.strerror}", location=Location(file=str(file))) from None
    except ValueError as err:
        raise FtuneError(f"{file} is not valid JSON ({err})", hint=hint, location=Location(file=str(file))) from None
    if not isinstance(data, dict):
        raise FtuneError(f"{file} is not a JSON object", hint=hint, location=Location(file=str(file)))
    return data


@dataclass(frozen=True)
class SavedAdapter:
    folder: Path
    config: dict
    """adapter_config.json."""
    record: dict = field(default_factory=dict)
    """ftune.json (empty for an adapter ftune did not save)."""

    @property
    def base(self) -> str | None:
        """The base it was trained on: ftune's record, else peft's `base_model_name_or_path`."""
        return self.record.get("base_model") or self.config.get("base_model_name_or_path") or None

    @property
    def peft_type(self) -> str | None:
        return self.config.get("peft_type")

    @property
    def task(self) -> str | None:
        """ftune's model.task it was trained for: the record's, else from peft's task_type (None if unknown)."""
        if self.record.get("task"):
            return self.record["task"]
        return {v: k for k, v in PEFT_TASKS.items()}.get(self.config.get("task_type") or "")


def read(folder: Path, hint: str | None = None) -> SavedAdapter:
    """The adapter in `folder` (its adapter_config.json must exist)."""
    folder = Path(folder)
    record = read_json(folder / RECORD, hint) if (folder / RECORD).is_file() else {}
    return SavedAdapter(folder, read_json(folder / ADAPTER_CONFIG, hint), record)


CONFIG_TYPES: dict[str, tuple[type, ...]] = {
    "peft_type": (str,), "base_model_name_or_path": (str, type(None)), "task_type": (str, type(None)),
    "r": (int,), "lora_alpha": (int, float), "lora_dropout": (int, float), "target_modules": (list, str, type(None)),
    "modules_to_save": (list, type(None)), "num_virtual_tokens": (int,), "fan_in_fan_out": (bool,),
}
"""Types peft reads these adapter_config.json keys as (a wrong type fails deep inside peft, unlocated)."""


def checked_config(folder: Path) -> dict:
    """adapter_config.json of `folder`, whole (valid JSON, an object) and with the types peft expects, or a located
    error naming the key: a truncated or hand-edited file is the user's to fix, never an internal error."""
    file = Path(folder) / ADAPTER_CONFIG
    hint = "the adapter's config was cut short or edited: copy it again from the run that saved it"
    config = read_json(file, hint)
    for key, types in CONFIG_TYPES.items():
        value = config.get(key)
        if key in config and (not isinstance(value, types) or (isinstance(value, bool) and bool not in types)):
            want = " or ".join("null" if t is type(None) else {"str": "a string", "int": "an integer", "float":
                               "a number", "list": "a list", "bool": "true/false"}[t.__name__] for t in types)
            raise FtuneError(f"{file}: `{key}` is {value!r}, expected {want}", hint=hint,
                             location=Location(file=str(file)))
    if "peft_type" not in config:
        raise FtuneError(f"{file} has no `peft_type`: not a peft adapter config", hint=hint,
                         location=Location(file=str(file)))
    return config


def unplaced_lora_tensors(model, folder: Path) -> list[str]:
    """LoRA A/B tensors of the adapter file in `folder` that match no parameter of `model` (a base with fewer
    layers or other module names), by the file's header alone. peft only warns about them: those layers would
    keep their base weights (eval) or a fresh init (training on), silently."""
    import struct

    file = Path(folder) / "adapter_model.safetensors"
    if not file.is_file():
        return []
    with open(file, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        names = [k for k in json.loads(fh.read(n)) if ".lora_A." in k or ".lora_B." in k]
    present = {name.replace(".default.", ".") for name, _ in model.named_parameters()}
    return [k for k in names if k not in present]
