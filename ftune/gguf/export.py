"""GGUF out: a plain HF folder (a merged run, a model) written as one GGUF file with llama.cpp's own writer, verified.

The writer is PyPI's `gguf`, the reader/writer and tensor-name map llama.cpp itself ships (gguf-py): the
tensor names, the q/k row permutation and the metadata keys are llama.cpp's, as in its reference
`convert_hf_to_gguf.py`, for the architectures listed in `ARCHITECTURES` (the Llama family: Llama, SmolLM2,
Mistral-style without sliding windows). Every export is reloaded through transformers' GGUF loader and its logits
compared with the source model's on a fixed batch (`TOLERANCE`); the file is written under a temporary name and
renamed only when that holds, so a failed export leaves no file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

OUTTYPES = ("f16", "bf16", "q8_0")
TOLERANCE = {"f16": 0.02, "bf16": 0.1, "q8_0": 0.25}
"""Largest |reloaded - source| logit on the check batch, relative to the source's largest |logit| (at least 1),
per outtype. f16 rounds each weight to 11 significant bits, bf16 to 8, q8_0 to 8-bit blocks of 32 with one f16
scale: measured on SmolLM2-135M (docs/gguf.md), with headroom."""
ARCHITECTURES = {"LlamaForCausalLM": "llama"}
CHECK_TEXTS = ("The capital of France is", "1 2 3 4 5 6 7 8", "def add(a, b):\n    return a + b",
               "<|im_start|>user\nWhat is 2 plus 2?<|im_end|>\n<|im_start|>assistant\n")


class ExportError(ValueError):
    """The folder can't be exported (an architecture llama.cpp's writer isn't wired for here, a tokenizer kind)."""


@dataclass
class Exported:
    file: str
    outtype: str
    tensors: int
    max_diff: float
    tolerance: float
    greedy_equal: bool
    """The reloaded GGUF's next-token argmax equals the source's at every position of the check batch."""


def _permute(w, n_head: int):
    """llama.cpp's q/k row order (its converter's `permute`; transformers' loader undoes it)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write(folder: Path, out: Path, outtype: str) -> int:
    """Write `folder` (config.json, safetensors, tokenizer) as a GGUF at `out`; returns the tensor count."""
    import gguf
    import numpy as np
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(folder)
    arch_name = (config.architectures or ["?"])[0]
    if arch_name not in ARCHITECTURES or getattr(config, "sliding_window", None):
        raise ExportError(f"{folder} is a {arch_name}; GGUF export here covers {', '.join(ARCHITECTURES)} models")
    arch = ARCHITECTURES[arch_name]
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    writer = gguf.GGUFWriter(str(out), arch)
    n_head, n_kv = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // n_head
    writer.add_name(Path(getattr(config, "_name_or_path", "") or folder.name).name or folder.name)
    from ftune import __version__

    writer.add_string("ftune.exported_by", f"ftune {__version__}")  # early in the header: the output policy's marker
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_rope_dimension_count(head_dim)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_kv)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta") or getattr(config, "rope_theta", None)
    if theta:
        writer.add_rope_freq_base(float(theta))
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type({"f16": gguf.LlamaFileType.MOSTLY_F16, "bf16": gguf.LlamaFileType.MOSTLY_BF16,
                          "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[outtype])
    _write_tokenizer(writer, tokenizer, folder, config.vocab_size)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    qtype = {"f16": gguf.GGMLQuantizationType.F16, "bf16": gguf.GGMLQuantizationType.BF16,
             "q8_0": gguf.GGMLQuantizationType.Q8_0}[outtype]
    count = 0
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue  # tied: llama.cpp reads token_embd for the output
        new = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise ExportError(f"no GGUF name for {name}")
        data = tensor.detach().to(torch.float32).numpy()
        if name.endswith("q_proj.weight"):
            data = _permute(data, n_head)
        elif name.endswith("k_proj.weight"):
            data = _permute(data, n_kv)
        if data.ndim == 1 or (qtype == gguf.GGMLQuantizationType.Q8_0 and data.shape[-1] % 32):
            writer.add_tensor(new, data.astype(np.float32))  # norms stay float32, as llama.cpp keeps them
        elif qtype == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(new, data.astype(np.float16))
        else:
            writer.add_tensor(new, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        count += 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return count


def _write_tokenizer(writer, tokenizer, folder: Path, vocab_size: int) -> None:
    """A byte-level BPE tokenizer (tokenizer.json) as llama.cpp's `gpt2` model: tokens, types, merges, special ids,
    and the chat template."""
    import gguf

    spec = json.loads((folder / "tokenizer.json").read_text()) if (folder / "tokenizer.json").is_file() else {}
    model = spec.get("model", {})
    if model.get("type") != "BPE":
        raise ExportError(f"{folder}'s tokenizer is not byte-level BPE (tokenizer.json model {model.get('type')!r})")
    vocab = tokenizer.get_vocab()
    by_id = {i: t for t, i in vocab.items()}
    special = set(tokenizer.all_special_tokens) | {a["content"] for a in spec.get("added_tokens", [])}
    tokens, types = [], []
    for i in range(vocab_size):
        token = by_id.get(i, f"[PAD{i}]")
        tokens.append(token)
        types.append(gguf.TokenType.CONTROL if token in special else
                     gguf.TokenType.UNUSED if i not in by_id else gguf.TokenType.NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    for attr, add in (("bos_token_id", writer.add_bos_token_id), ("eos_token_id", writer.add_eos_token_id),
                      ("unk_token_id", writer.add_unk_token_id), ("pad_token_id", writer.add_pad_token_id)):
        value = getattr(tokenizer, attr, None)
        if isinstance(value, int):
            add(value)
    writer.add_add_bos_token(False)
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str):
        writer.add_chat_template(template)


def verify(folder: Path, file: Path, outtype: str) -> tuple[float, bool]:
    """Reload `file` through transformers' GGUF loader; (max |logit diff| relative, greedy argmax equal)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, modeling_gguf_pytorch_utils

    from ftune.quiet import no_bars

    tokenizer = AutoTokenizer.from_pretrained(folder)
    source = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with no_bars(modeling_gguf_pytorch_utils):
        reloaded = AutoModelForCausalLM.from_pretrained(str(file.parent), gguf_file=file.name,
                                                        dtype=torch.float32).eval()
    gguf_tok = AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)
    worst, same = 0.0, True
    with torch.no_grad():
        for text in CHECK_TEXTS:
            ids = tokenizer(text, return_tensors="pt").input_ids
            if gguf_tok(text, return_tensors="pt").input_ids.tolist() != ids.tolist():
                raise ExportError(f"the GGUF's tokenizer splits {text!r} differently from the source's")
            a, b = source(ids).logits, reloaded(ids).logits
            worst = max(worst, float((a - b).abs().max() / max(1.0, float(a.abs().max()))))
            same = same and bool((a.argmax(-1) == b.argmax(-1)).all())
    return worst, same


def export(folder: Path, out: Path, outtype: str, log=print) -> Exported:
    """Write, verify, then rename into place; a failure removes the temporary file and raises."""
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    try:
        log(f"writing {outtype} GGUF of {folder}")
        count = write(folder, tmp, outtype)
        log(f"verifying: reloading {out.name} through transformers' GGUF loader, comparing logits")
        diff, same = verify(folder, tmp, outtype)
        if diff > TOLERANCE[outtype]:
            raise ExportError(f"the exported GGUF's logits differ from the model's by {diff:.3g} (relative), over the "
                              f"{outtype} tolerance {TOLERANCE[outtype]}")
        tmp.replace(out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return Exported(file=str(out), outtype=outtype, tensors=count, max_diff=diff, tolerance=TOLERANCE[outtype],
                    greedy_equal=same)
