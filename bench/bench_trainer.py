"""ftune vs a plain, hand-written HF Trainer script doing the same work, in interleaved rounds: two cases.

`tiny`: the tiny Llama with LoRA (causal LM). `minilm`: a MiniLM-shaped BERT (all-MiniLM-L6's shape: 6 layers,
hidden 384, 12 heads, intermediate 1536, vocab 30522, 512 positions; 22.7M parameters), sequence classification,
full fine-tune. Its weights are random and its WordPiece tokenizer is trained here, because no hub is reachable:
step time depends on shapes, not on weight values, so the ratio is the one a pretrained MiniLM would give.

Same work on both sides: the tiny Llama, the same rows (tokenized with BOS, EOS appended, truncated to SEQ),
the same collator semantics (pad to the longest row, labels -100 on padding only), fused AdamW (ftune's and
transformers' default), the same seed, steps and OMP_NUM_THREADS. The ratio is taken per round (ftune and
plain run back to back, in an order rotated each round: `round_order`) and reported as median and min–max, so a 2% gap can be told from the load swings of
a shared 2-core machine.

Ablation: `plain+tokens` is the plain script with `include_num_input_tokens_seen="non_padding"` (a gather and
`.item()` every micro-batch: what ftune did before it took tokens/s from the data stage's counts); its ratio to
plain is that extra's cost. The callbacks' own cost is timed in-process (`callback_cost`).

`tiny-cpu` (run only when named): the tiny case's CPU seconds per step on each side, from runs of two lengths so
that start-up cancels out; for a machine too busy for wall-clock steps/s (docs/performance.md).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import yaml

STEPS = 150
ROUNDS = 6  # a multiple of 3: see round_order
SEQ = 128
BATCH = 8
THREADS = "2"

PLAIN = textwrap.dedent('''
    import json, sys
    import torch
    from datasets import load_dataset
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments, set_seed
    model_dir, data_file, out, steps, seq, batch, count_tokens = sys.argv[1:8]
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.pad_token = tok.pad_token or tok.eos_token
    ds = load_dataset("json", data_files=data_file, split="train")

    def encode(b):  # as ftune's text format: BOS, EOS appended, truncated
        ids = [x + [tok.eos_token_id] if x[-1] != tok.eos_token_id else x for x in tok(b["text"])["input_ids"]]
        return {"input_ids": [x[: int(seq)] for x in ids]}

    ds = ds.map(encode, batched=True, remove_columns=ds.column_names)

    def collate(rows):  # pad to the longest row; labels -100 on padding only (EOS is trained)
        width = max(len(r["input_ids"]) for r in rows)
        ids = torch.full((len(rows), width), tok.pad_token_id)
        labels = torch.full((len(rows), width), -100)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            n = len(r["input_ids"])
            ids[i, :n] = labels[i, :n] = torch.tensor(r["input_ids"])
            mask[i, :n] = 1
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32")
    set_seed(0)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                                             task_type="CAUSAL_LM"))
    args = TrainingArguments(output_dir=out, max_steps=int(steps), per_device_train_batch_size=int(batch),
                             learning_rate=1e-3, logging_steps=10, save_strategy="no", report_to="none",
                             use_cpu=True, seed=0, data_seed=0, disable_tqdm=True, optim="adamw_torch_fused",
                             include_num_input_tokens_seen="non_padding" if count_tokens == "1" else "no")
    trainer = Trainer(model=model, args=args, train_dataset=ds, data_collator=collate)
    result = trainer.train()
    print(json.dumps(result.metrics))
''')


def _assets(folder: Path) -> tuple[Path, Path]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from ftune.tiny import corpus

    from ftune.tiny import build_tiny_llama, train_tokenizer

    model_dir = folder / "model"
    tok = train_tokenizer(corpus(), model_dir, vocab_size=512)
    build_tiny_llama(model_dir, tok, hidden_size=128, intermediate_size=256, num_layers=4)
    data = folder / "data.jsonl"
    lines = corpus(2000, seed=5)
    data.write_text("".join(json.dumps({"text": " ".join(lines[i:i + 4])}) + "\n" for i in range(0, 2000, 2)))
    return model_dir, data


def callback_cost(steps: int = 2000) -> dict:
    """Microseconds per training step that ftune's callbacks add (progress bar, metrics.jsonl every 10 steps),
    timed in-process on a fake step loop."""
    from rich.console import Console
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from ftune.worker.callbacks import make_callbacks

    from ftune.recipe.schema import Recipe
    from ftune.rundir import RunDir

    class _Plan:  # what make_callbacks reads: a real recipe and a run dir
        recipe = Recipe.model_validate({"name": "b", "model": {"path": "m"}, "data": {"train": [{"path": "d"}]},
                                        "train": {"max_steps": steps}})

        def __init__(self, root: Path) -> None:
            self.run = RunDir(root)

    with tempfile.TemporaryDirectory() as tmp:
        console = Console(file=open(os.devnull, "w"), force_terminal=True)  # noqa: SIM115
        cbs = make_callbacks(_Plan(Path(tmp)), console, tokens_per_step=1000.0)
        args = TrainingArguments(output_dir=tmp, use_cpu=True, report_to="none")
        state, control = TrainerState(max_steps=steps, is_world_process_zero=True), TrainerControl()
        for cb in cbs:
            cb.on_train_begin(args, state, control)
        t0 = time.perf_counter()
        for step in range(1, steps + 1):
            state.global_step = step
            for cb in cbs:
                cb.on_step_end(args, state, control)
                if step % 10 == 0:
                    cb.on_log(args, state, control, logs={"loss": 1.0, "learning_rate": 1e-3})
        per_step = (time.perf_counter() - t0) / steps
        for cb in cbs:
            cb.on_train_end(args, state, control)
    return {"callbacks_us_per_step": round(per_step * 1e6, 1)}


def tiny() -> dict:
    folder = Path(tempfile.mkdtemp(prefix="ftune-bench-trainer-"))
    model_dir, data = _assets(folder)
    recipe = {
        "name": "bench-trainer",
        "model": {"path": str(model_dir), "dtype": "float32"},
        "data": {"train": [{"path": str(data), "format": "text"}], "max_seq_length": SEQ, "shuffle": False,
                 "train_on": "all"},
        "peft": {"method": "lora", "r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
        "train": {"max_steps": STEPS, "per_device_batch_size": BATCH, "learning_rate": 1e-3, "logging_steps": 10,
                  "seed": 0},
        "checkpoint": {"strategy": "no", "resume": False},
        "output": {"dir": str(folder / "run"), "report_to": ["none"], "loss_curve": False},
    }
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    script = folder / "plain.py"
    script.write_text(PLAIN)
    env = dict(os.environ, OMP_NUM_THREADS=THREADS)

    def plain(count_tokens: bool) -> float:
        out = subprocess.run([sys.executable, str(script), str(model_dir), str(data), str(folder / "plain"),
                              str(STEPS), str(SEQ), str(BATCH), "1" if count_tokens else "0"],
                             capture_output=True, text=True, check=True, env=env)
        return json.loads(out.stdout.strip().splitlines()[-1])["train_steps_per_second"]

    def ftune(i: int) -> tuple[float, float]:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "ftune.cli.main", "run", str(path), f"output.dir={folder}/run{i}"],
                       capture_output=True, text=True, check=True, env=env)
        wall = time.perf_counter() - t0
        records = [json.loads(x) for x in (folder / f"run{i}" / "metrics.jsonl").read_text().splitlines()]
        return next(r for r in records if "train_steps_per_second" in r)["train_steps_per_second"], wall

    ratios, token_ratios, rows = [], [], []
    for i in range(ROUNDS):  # interleaved: each ratio compares runs made seconds apart
        got = {}
        for side in round_order(i):  # each side takes each place in the round equally often
            got[side] = ftune(i) if side == "ftune" else (plain(side == "plain+tokens"), None)
        (p, _), (f, wall), (pt, _) = got["plain"], got["ftune"], got["plain+tokens"]
        ratios.append(f / p)
        token_ratios.append(pt / p)
        rows.append({"plain": round(p, 3), "ftune": round(f, 3), "plain+tokens": round(pt, 3), "ftune_wall_s": round(wall, 1),
                     "order": " ".join(round_order(i))})

    shutil.rmtree(folder, ignore_errors=True)
    result = {"steps": STEPS, "rounds": rows, "ftune_over_plain": spread(ratios),
              "token_counting_over_plain": spread(token_ratios), **callback_cost()}
    r, t = result["ftune_over_plain"], result["token_counting_over_plain"]
    print(f"trainer: ftune/plain steps/s median {r['median']:.3f} (min {r['min']:.3f}, max {r['max']:.3f}; "
          f"goal >= 0.98) over {ROUNDS} interleaved rounds")
    print(f"  ablation: plain with per-step token counting ÷ plain steps/s median {t['median']:.3f} "
          f"(min {t['min']:.3f}, max {t['max']:.3f}); ftune's callbacks {result['callbacks_us_per_step']} µs/step")
    return result


SIDES = ("plain", "ftune", "plain+tokens")


def round_order(i: int) -> tuple[str, ...]:
    """The tiny case's run order in round `i`: rotated each round, so over ROUNDS (a multiple of 3) every side runs
    first, second and third equally often. With a fixed order (plain, ftune, plain+tokens) the place in the round
    biased the ratio: on the quiet machine plain+tokens, the same script as plain with ~0.1% more work, ran at
    0.743 of plain (docs/performance.md)."""
    return SIDES[i % 3:] + SIDES[:i % 3]


def spread(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3), "max": round(max(values), 3)}


MINILM_STEPS = 20
MINILM_ROUNDS = 5
MINILM_SEQ = 128
MINILM_BATCH = 8
MINILM_THREADS = "1"  # one compute thread: on a shared 2-core machine a 2-thread step stalls whenever either core
# is taken, which swings step times far more than any gap between the two sides

PLAIN_CLS = textwrap.dedent('''
    import json, sys
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, Trainer, TrainingArguments
    model_dir, data_file, out, steps, seq, batch = sys.argv[1:7]
    names = ["negative", "positive"]
    tok = AutoTokenizer.from_pretrained(model_dir)
    ds = load_dataset("json", data_files=data_file, split="train")

    def encode(b):  # as ftune's classification format: [CLS] text [SEP], cut to seq tokens
        return {"input_ids": [x[: int(seq)] for x in tok(b["text"])["input_ids"]],
                "labels": [names.index(x) for x in b["label"]]}

    ds = ds.map(encode, batched=True, remove_columns=ds.column_names)

    def collate(rows):  # pad to the longest row, attention mask, one label per row
        width = max(len(r["input_ids"]) for r in rows)
        ids = torch.full((len(rows), width), tok.pad_token_id)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r["input_ids"])] = torch.tensor(r["input_ids"])
            mask[i, : len(r["input_ids"])] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([r["labels"] for r in rows])}

    model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype="float32", num_labels=2,
                                                               id2label=dict(enumerate(names)))
    args = TrainingArguments(output_dir=out, max_steps=int(steps), per_device_train_batch_size=int(batch),
                             learning_rate=5e-5, logging_steps=10, save_strategy="no", report_to="none",
                             use_cpu=True, seed=0, data_seed=0, disable_tqdm=True, optim="adamw_torch_fused")
    trainer = Trainer(model=model, args=args, train_dataset=ds, data_collator=collate)
    print(json.dumps(trainer.train().metrics))
''')


def minilm_assets(folder: Path) -> tuple[Path, Path]:
    """A MiniLM-shaped BertForSequenceClassification (random weights) with a WordPiece tokenizer trained on the
    test corpus ([CLS] text [SEP], [PAD] = 0), and 1000 labelled rows of about 64 tokens."""
    import random

    import torch
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from ftune.tiny import corpus

    model_dir = folder / "minilm"
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(corpus(), trainers.WordPieceTrainer(vocab_size=2000, special_tokens=special,
                                                                show_progress=False))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]")
    fast.save_pretrained(str(model_dir))
    config = BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                        intermediate_size=1536, max_position_embeddings=512, pad_token_id=fast.pad_token_id,
                        num_labels=2, id2label={0: "negative", 1: "positive"})
    torch.manual_seed(0)
    BertForSequenceClassification(config).save_pretrained(str(model_dir))
    data = folder / "cls.jsonl"
    lines, rng = corpus(2000, seed=5), random.Random(0)
    data.write_text("".join(json.dumps({"text": " ".join(lines[i:i + 4]), "label": rng.choice(["negative", "positive"])})
                            + "\n" for i in range(0, 2000, 2)))
    return model_dir, data


def minilm() -> dict:
    """ftune vs plain on the MiniLM-shaped BERT: full fine-tune, classification, rounds alternating which goes
    first (so a load drift within a round does not always favour one side)."""
    folder = Path(tempfile.mkdtemp(prefix="ftune-bench-minilm-"))
    model_dir, data = minilm_assets(folder)
    recipe = {
        "name": "bench-minilm",
        "model": {"path": str(model_dir), "task": "sequence-classification", "dtype": "float32",
                  "labels": ["negative", "positive"]},
        "data": {"train": [{"path": str(data), "format": "classification"}], "max_seq_length": MINILM_SEQ,
                 "shuffle": False, "cache_dir": str(folder / "cache")},
        "peft": {"method": "full"},
        "train": {"max_steps": MINILM_STEPS, "per_device_batch_size": MINILM_BATCH, "learning_rate": 5e-5,
                  "logging_steps": 10, "seed": 0},
        "checkpoint": {"strategy": "no", "resume": False},
        "output": {"dir": str(folder / "run"), "report_to": ["none"], "loss_curve": False},
    }
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    script = folder / "plain.py"
    script.write_text(PLAIN_CLS)
    env = dict(os.environ, OMP_NUM_THREADS=MINILM_THREADS)

    def plain() -> dict:
        out = subprocess.run([sys.executable, str(script), str(model_dir), str(data), str(folder / "plain"),
                              str(MINILM_STEPS), str(MINILM_SEQ), str(MINILM_BATCH)],
                             capture_output=True, text=True, check=True, env=env)
        return json.loads(out.stdout.strip().splitlines()[-1])

    def ftune(i: int) -> dict:
        subprocess.run([sys.executable, "-m", "ftune.cli.main", "run", str(path), f"output.dir={folder}/run{i}"],
                       capture_output=True, text=True, check=True, env=env)
        records = [json.loads(x) for x in (folder / f"run{i}" / "metrics.jsonl").read_text().splitlines()]
        return next(r for r in records if "train_steps_per_second" in r)

    rows, ratios = [], []
    for i in range(MINILM_ROUNDS):
        if i % 2 == 0:
            p = plain()
            f = ftune(i)
        else:
            f = ftune(i)
            p = plain()
        ratios.append(f["train_steps_per_second"] / p["train_steps_per_second"])
        rows.append({"plain": round(p["train_steps_per_second"], 4), "ftune": round(f["train_steps_per_second"], 4),
                     "plain_loss": round(p["train_loss"], 4), "ftune_loss": round(f["train_loss"], 4),
                     "first": "plain" if i % 2 == 0 else "ftune"})
    shutil.rmtree(folder, ignore_errors=True)
    r = spread(ratios)
    print(f"minilm: ftune/plain steps/s median {r['median']:.3f} (min {r['min']:.3f}, max {r['max']:.3f}; goal >= 0.98) "
          f"over {MINILM_ROUNDS} interleaved rounds, {MINILM_STEPS} steps at batch {MINILM_BATCH}")
    return {"steps": MINILM_STEPS, "batch": MINILM_BATCH, "threads": MINILM_THREADS, "rounds": rows,
            "ftune_over_plain": r}


def _tree_cpu(cmd: list[str], env: dict) -> float:
    """CPU seconds (user + system) of a command and every process it waited for."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


CPU_STEPS = (30, 150)
CPU_ROUNDS = 3


def tiny_cpu() -> dict:
    """The tiny case's per-step cost in CPU seconds rather than steps/s, for a machine too busy for wall time:
    each side runs CPU_STEPS[0] and CPU_STEPS[1] steps, and (CPU of the long run - CPU of the short one) / the
    step difference is a step's own CPU, with start-up (imports, launch, data, model load, save) cancelled out.
    One thread, so no OpenMP spinning is counted as work. Rounds interleave the sides."""
    folder = Path(tempfile.mkdtemp(prefix="ftune-bench-cpu-"))
    model_dir, data = _assets(folder)
    script = folder / "plain.py"
    script.write_text(PLAIN)
    env = dict(os.environ, OMP_NUM_THREADS="1")

    def plain(steps: int) -> float:
        return _tree_cpu([sys.executable, str(script), str(model_dir), str(data), str(folder / "plain"), str(steps),
                          str(SEQ), str(BATCH), "0"], env)

    def ftune(steps: int, tag: str) -> float:
        recipe = {
            "name": "bench-cpu", "model": {"path": str(model_dir), "dtype": "float32"},
            "data": {"train": [{"path": str(data), "format": "text"}], "max_seq_length": SEQ, "shuffle": False,
                     "train_on": "all"},
            "peft": {"method": "lora", "r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
            "train": {"max_steps": steps, "per_device_batch_size": BATCH, "learning_rate": 1e-3, "logging_steps": 10,
                      "seed": 0},
            "checkpoint": {"strategy": "no", "resume": False},
            "output": {"dir": str(folder / f"run-{tag}"), "report_to": ["none"], "loss_curve": False},
        }
        path = folder / f"{tag}.yaml"
        path.write_text(yaml.safe_dump(recipe))
        return _tree_cpu([sys.executable, "-m", "ftune.cli.main", "run", str(path)], env)

    short, long = CPU_STEPS
    rows, ratios = [], []
    for i in range(CPU_ROUNDS):
        p = (plain(long) - plain(short)) / (long - short)
        f = (ftune(long, f"l{i}") - ftune(short, f"s{i}")) / (long - short)
        ratios.append(p / f)  # as steps/s: plain's CPU per step over ftune's
        rows.append({"plain_ms_cpu_per_step": round(p * 1e3, 2), "ftune_ms_cpu_per_step": round(f * 1e3, 2)})
    shutil.rmtree(folder, ignore_errors=True)
    r = spread(ratios)
    print(f"tiny (CPU): plain ÷ ftune CPU per step median {r['median']:.3f} (min {r['min']:.3f}, max {r['max']:.3f}) "
          f"over {CPU_ROUNDS} rounds of {short} and {long} steps, 1 thread")
    return {"steps": CPU_STEPS, "rounds": rows, "ftune_over_plain": r}


CASES = {"tiny": tiny, "minilm": minilm, "tiny-cpu": tiny_cpu}


def main(cases: list[str] | None = None) -> dict:
    """The wall-time cases by default (`make bench`); `tiny-cpu` when named."""
    return {name: CASES[name]() for name in cases or ("tiny", "minilm")}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:]), indent=2))
