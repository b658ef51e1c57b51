"""The plain side of bench/gpu.py: a hand-written transformers Trainer script (peft, bitsandbytes, torchao and Liger
through what those libraries offer directly) that trains what one ftune variant trains, with the settings
bench/gpu.py passes as JSON. It prints one JSON line: tokens/s counted in its collator, steps/s, peak memory.

    python bench/plain_trainer.py '{"model": DIR, "data": FILE, "out": DIR, "seq": 2048, "batch": 4, ...}'

cfg: model, data, out, seq, batch, steps, lr, seed, and the levers (each off when null or false):
  lora              {"r", "alpha"}: LoRA on every linear layer (null: full fine-tuning)
  quantization      {"quant_type", "double_quant", "compute_dtype"}: QLoRA's 4-bit bitsandbytes base, k-bit prepared
  liger             TrainingArguments(use_liger_kernel=True)
  packing           padding-free batches: DataCollatorWithFlattening (the rows as they are, not packed first)
  attn_implementation   passed to from_pretrained (null: transformers' default)
  compile_backend   TrainingArguments(torch_compile=True) with this backend
  fp8               torchao's float8 training on every linear layer but the output head (dimensions multiples of 16)
Nothing of ftune runs here but the optional step profiler (FTUNE_PROFILE=DIR), the callback ftune's worker loads.
"""

import json
import sys

import torch
from datasets import load_dataset
from transformers import (AutoModelForCausalLM, AutoTokenizer, DataCollatorWithFlattening, Trainer, TrainingArguments,
                          set_seed)

cfg = json.loads(sys.argv[1])
cuda = torch.cuda.is_available()
tok = AutoTokenizer.from_pretrained(cfg["model"])
ds = load_dataset("json", data_files=cfg["data"], split="train")


def encode(b):  # as ftune's text format: BOS, EOS appended, cut to SEQ
    ids = [x + [tok.eos_token_id] if x[-1] != tok.eos_token_id else x for x in tok(b["text"])["input_ids"]]
    return {"input_ids": [x[: cfg["seq"]] for x in ids]}


ds = ds.map(encode, batched=True, remove_columns=ds.column_names)
seen = [0]


def padded(rows):  # pad to the longest row; labels -100 on padding only
    width = max(len(r["input_ids"]) for r in rows)
    ids = torch.full((len(rows), width), tok.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        ids[i, :n] = labels[i, :n] = torch.tensor(r["input_ids"])
        mask[i, :n] = 1
    seen[0] += int(mask.sum())
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


flatten = DataCollatorWithFlattening()  # one row [1, tokens], positions restarting per row, first label -100


def flattened(rows):
    batch = flatten(rows)
    seen[0] += batch["input_ids"].numel()  # no pad token: every token is a row's
    return batch


load = {"dtype": torch.bfloat16 if cuda else torch.float32}
if cfg.get("attn_implementation"):
    load["attn_implementation"] = cfg["attn_implementation"]
q = cfg.get("quantization")
if q:
    from transformers import BitsAndBytesConfig

    load["quantization_config"] = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type=q["quant_type"], bnb_4bit_use_double_quant=q["double_quant"],
        bnb_4bit_compute_dtype=getattr(torch, q["compute_dtype"]))
model = AutoModelForCausalLM.from_pretrained(cfg["model"], **load)
if cfg.get("packing"):
    # no KV cache: only without one do transformers' sdpa/eager masks find the rows from position_ids (training
    # with checkpointing turns it off too)
    model.config.use_cache = False
if q:
    from peft import prepare_model_for_kbit_training

    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=cfg.get("checkpointing", True),
                                            gradient_checkpointing_kwargs={"use_reentrant": False})
set_seed(cfg["seed"])
if cfg.get("fp8"):  # before LoRA wraps the layers, so its frozen base runs in float8
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name("tensorwise"),
                               module_filter_fn=lambda m, fqn: fqn.rsplit(".", 1)[-1] != "lm_head"
                               and m.in_features % 16 == 0 and m.out_features % 16 == 0)
if cfg["lora"]:
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(model, LoraConfig(r=cfg["lora"]["r"], lora_alpha=cfg["lora"]["alpha"], lora_dropout=0.0,
                                             target_modules="all-linear", task_type="CAUSAL_LM"))
if cuda:
    torch.cuda.reset_peak_memory_stats()
compiled = {}
if cfg.get("compile_backend"):
    compiled = {"torch_compile": True, "torch_compile_backend": cfg["compile_backend"]}
args = TrainingArguments(output_dir=cfg["out"], max_steps=cfg["steps"], per_device_train_batch_size=cfg["batch"],
                         gradient_accumulation_steps=cfg.get("accumulation", 1), learning_rate=cfg["lr"], logging_steps=5, save_strategy="no", report_to="none",
                         seed=cfg["seed"], data_seed=cfg["seed"], disable_tqdm=True, optim="adamw_torch_fused",
                         bf16=cuda, use_cpu=not cuda, gradient_checkpointing=cfg.get("checkpointing", True),
                         use_liger_kernel=bool(cfg.get("liger")), **compiled)
from ftune.worker.profile import callback  # noqa: E402 - FTUNE_PROFILE=DIR: the same step profiler as ftune's worker

profiler = callback()
metrics = Trainer(model=model, args=args, train_dataset=ds, data_collator=flattened if cfg.get("packing") else padded,
                  callbacks=[profiler] if profiler else None).train().metrics
mean_row = sum(len(x) for x in ds["input_ids"]) / len(ds)
print(json.dumps({"tokens_per_s": seen[0] / metrics["train_runtime"],
                  "steps_per_s": metrics["train_steps_per_second"],
                  "tokens_per_s_mean_row": mean_row * cfg["batch"] * cfg.get("accumulation", 1)
                  * metrics["train_steps_per_second"],
                  "peak_memory_bytes": torch.cuda.max_memory_allocated() if cuda else None}))
