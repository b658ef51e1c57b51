"""Dequantize a GGUF once into a plain Hugging Face folder in ftune's cache (the parent does it, before launch).

transformers loads a GGUF (`from_pretrained(dir, gguf_file=...)`, dequantized to float32) but refuses to
`save_pretrained` the result; its weights copied into a model built from the same config save as an ordinary
folder: config.json, model.safetensors, the tokenizer with the GGUF's chat template and special tokens. The
folder is written under a temporary name and renamed into place last, so a failure (or Ctrl-C) caches nothing.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from ftune.gguf import _RENAMED, MARKER, GgufInfo, _header, converted_folder, is_converted, metadata_config_folder
from ftune.outputs import publish_entry


def convert(info: GgufInfo, log=print) -> Path:
    """The converted folder of `info` (converting now unless the cache has it)."""
    dest = converted_folder(info)
    if is_converted(dest):
        return dest
    log(f"model.path {info.file.name}: dequantizing the GGUF ({info.architecture}, {info.tensors} tensors) into "
        f"{dest} (once; keyed by its sha256)")

    def fill(tmp: Path) -> None:
        _write(info, tmp)
        (tmp / MARKER).write_text(json.dumps({"gguf": str(info.file), "sha256": info.sha256,
                                              "architecture": info.architecture, "name": info.name}, indent=2))

    return _published(dest, fill, done=is_converted)


def _published(dest: Path, fill, done) -> Path:
    """`dest` filled by `fill(folder)` under a temporary sibling name and renamed into place last (same filesystem:
    atomic), so a failure or Ctrl-C caches nothing. When `done(dest)` another process finished first: its folder is
    kept; a folder that isn't done is a leftover, never a cache entry."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{dest.name}.tmp-", dir=dest.parent))
    try:
        fill(tmp)
        publish_entry(tmp, dest, done)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def _write(info: GgufInfo, out: Path) -> None:
    import torch
    import transformers
    from transformers import AutoTokenizer, modeling_gguf_pytorch_utils

    from ftune.quiet import no_bars, quiet_libraries

    quiet_libraries()  # the parent converts before launch: no weight-loading or shard-writing bars
    folder, name = str(info.file.parent), info.file.name
    with no_bars(modeling_gguf_pytorch_utils):
        loaded = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    config.quantization_config = None
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if k not in _tied(plain)]
    if missing or unexpected:
        raise RuntimeError(f"GGUF weights don't fit the model built from its config: missing {missing[:5]}, "
                           f"unexpected {unexpected[:5]}")
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    template = _chat_template(info)
    if template and not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = template
    tokenizer.save_pretrained(out)


def _tied(model) -> set[str]:
    keys = getattr(model, "_tied_weights_keys", None) or {}
    return set(keys if not isinstance(keys, dict) else keys)


def _chat_template(info: GgufInfo) -> str | None:
    template = _header.read(info.file).metadata.get("tokenizer.chat_template")
    return template if isinstance(template, str) else None


def metadata_config(info: GgufInfo) -> Path:
    """A folder with the model's config.json read from the GGUF's metadata alone (no tensor read): what `ftune
    plan` and the estimate build the model from before the file is converted. Written atomically."""
    dest = metadata_config_folder(info)
    if (dest / "config.json").is_file():
        return dest
    config = config_from_metadata(_header.read(info.file), info.architecture)
    return _published(dest, config.save_pretrained, done=lambda d: (d / "config.json").is_file())


def ensure(source: dict, log=print) -> Path:
    """Convert the GGUF a plan names (`plan.model_load.gguf`, as a dict) unless the cache has it; the file must
    still be the one planned (same sha256)."""
    from ftune.gguf import GgufError, GgufInfo, sha256

    info = GgufInfo(file=Path(source["file"]), sha256=source["sha256"], architecture=source["architecture"],
                    name=source.get("name"), tensors=source["tensors"], version=source["version"])
    if is_converted(converted_folder(info)):
        return converted_folder(info)
    if sha256(info.file) != info.sha256:
        raise GgufError(f"{info.file} changed since the plan was made", "run `ftune run` again")
    try:
        return convert(info, log=log)
    except (OSError, RuntimeError, ValueError) as err:
        raise GgufError(f"converting {info.file} failed: {type(err).__name__}: {str(err).splitlines()[0]}",
                        "nothing was cached; check the file (ftune plan reads its metadata) and the free space in "
                        f"{converted_folder(info).parent}") from err


_SPECIAL_IDS = {"bos": "bos", "eos": "eos", "padding": "pad", "unknown": "unk"}
_TEXT_TYPES = {"gemma3": "gemma3_text", "gemma4": "gemma4_text"}


def config_from_metadata(header, arch: str):
    """The transformers config a GGUF's metadata describes, through transformers' own GGUF key table (the part of
    its loader that needs no tensor): for planning only; the converted folder keeps the loader's own config."""
    from transformers import AutoConfig
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    model_type = _RENAMED.get(arch, arch)
    table = GGUF_CONFIG_MAPPING.get(model_type) or GGUF_CONFIG_MAPPING.get(arch, {})
    values: dict = {}
    for key, value in header.metadata.items():
        prefix, _, rest = key.partition(".")
        target = table.get(rest) if prefix == arch else None
        if target not in (None, -1) and not isinstance(value, tuple):
            values[target] = value
    values["tie_word_embeddings"] = all(t.name != "output.weight" for t in header.tensors)
    if "vocab_size" not in values:
        tokens = header.metadata.get("tokenizer.ggml.tokens")
        if tokens is not None:
            values["vocab_size"] = tokens[1] if isinstance(tokens, tuple) else len(tokens)
    for gguf_name, name in _SPECIAL_IDS.items():
        token = header.metadata.get(f"tokenizer.ggml.{gguf_name}_token_id")
        if isinstance(token, int):
            values[f"{name}_token_id"] = token
    return AutoConfig.for_model(_TEXT_TYPES.get(model_type, model_type), **values)
