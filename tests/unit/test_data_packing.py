"""Packing: first-fit-decreasing bins, restarting positions, and no attention across samples.

The loss test runs the tiny Llama on packed rows and on the same samples one by one: per-sample
losses must agree within 1e-4 in fp32, for every CPU attention implementation and both mechanisms.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftune.recipe.schema import Recipe
from ftune.datastage import DataReport
from ftune.datastage import build as stage
from tests.data_stage import build, decided
from ftune.plan.batching import collator
from ftune.datastage.packing import (
    ClassificationCollator,
    PackedCollator,
    PaddingCollator,
    PaddingFreeCollator,
    first_fit_decreasing,
)


def make_recipe(path, source: dict | None = None, **data) -> Recipe:
    train = [{"path": str(path), **(source or {})}]
    return Recipe.model_validate({"name": "t", "model": {"path": "unused"}, "data": {"train": train, **data}})


@given(st.lists(st.integers(1, 64), min_size=0, max_size=300), st.integers(64, 128))
@settings(max_examples=60, deadline=None)
def test_ffd_puts_every_item_once_and_never_overflows(lengths, capacity):
    bins = first_fit_decreasing(lengths, capacity)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= capacity for b in bins)
    # First fit: no item of a later bin fits in the free space an earlier bin had when it was placed,
    # so at most one bin is half empty or less.
    assert sum(1 for b in bins if sum(lengths[i] for i in b) <= capacity // 2) <= 1


def test_ffd_is_first_fit_decreasing_on_a_known_case():
    # 7 -> bin 0, 6 -> bin 1, 5 fits neither -> bin 2, 3 -> bin 0 (first with room), 2 -> bin 1
    assert first_fit_decreasing([5, 7, 3, 2, 6], 10) == [[1, 2], [4, 3], [0]]


def test_batching_per_attention_implementation():
    def decide(attn=None, remote=False, packing=True, task="causal-lm"):
        return collator(Recipe.model_validate({
            "name": "t", "model": {"path": "m", "attn_implementation": attn, "trust_remote_code": remote, "task": task},
            "data": {"train": [{"path": "d"}], "packing": packing, "max_seq_length": 64}}))

    assert decide("sdpa") == decide("eager") == decide(None) == "position_ids"
    assert decide("eager", remote=True) == "block_mask"
    assert decide("flash_attention_2") == decide("flash_attention_2", True) == "padding_free"
    assert decide("flex_attention") == "position_ids"  # see ftune.plan.batching
    assert decide("flash_attention_2", packing=False) == "padding"
    assert decide("flash_attention_2", task="sequence-classification") == "padding"


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir)


@pytest.fixture(scope="module")
def packed(tokenizer, instruction_data_file, tmp_path_factory):
    """Instruction data (prompt masked) packed into rows of 96 tokens."""
    cache = tmp_path_factory.mktemp("cache")
    src = {"format": "instruction", "template": "### Instruction:\n{instruction}\n### Response:\n"}
    r = make_recipe(instruction_data_file, src, max_seq_length=96, packing=True,
                    cache_dir=str(cache))
    return build(r, tokenizer, log=lambda _: None)


def test_packed_rows_restart_positions_and_mask_each_samples_first_label(packed):
    rep = packed.report
    assert rep.packed_rows == len(packed.train) < rep.train_samples
    assert rep.fill == pytest.approx(rep.tokens / (rep.packed_rows * 96))
    seen = 0
    for row in packed.train.select(range(10)):
        pos, labels = row["position_ids"], row["labels"]
        assert len(row["input_ids"]) <= 96
        starts = [i for i, p in enumerate(pos) if p == 0]
        assert starts[0] == 0 and len(starts) >= 2  # several samples per row
        for s, e in zip(starts, starts[1:] + [len(pos)]):
            assert pos[s:e] == list(range(e - s))
            assert labels[s] == -100
        seen += len(starts)
    total = sum(len(r) for r in packed.train["input_ids"])
    assert total == packed.report.tokens


def test_packed_collator_pads_as_a_separate_segment():
    c = PackedCollator(pad_token_id=0)
    batch = c([{"input_ids": [5, 6, 7], "labels": [-100, 6, 7], "position_ids": [0, 1, 0]},
               {"input_ids": [8], "labels": [-100], "position_ids": [0]}])
    assert batch["position_ids"].tolist() == [[0, 1, 0], [0, 0, 1]]
    assert batch["labels"].tolist() == [[-100, 6, 7], [-100, -100, -100]]
    assert "attention_mask" not in batch
    assert batch["use_cache"] is False  # else transformers makes a cache and ignores the packing
    block = PackedCollator(pad_token_id=0, mode="block_mask", attn_implementation="sdpa")(
        [{"input_ids": [5, 6, 7], "labels": [-100, 6, 7], "position_ids": [0, 1, 0]}])
    assert block["attention_mask"][0, 0].tolist() == [[True, False, False], [True, True, False], [False, False, True]]


def test_padding_free_batch_gives_the_padded_batch_loss_and_gradients(packed, tiny_model_dir):
    """The flattened micro-batch (one row, no pad token) trains exactly as today's padded packed batch. Run with
    sdpa, where transformers builds the block-causal mask from the position restarts (flash, not installed here,
    takes cu_seqlens from the same restarts)."""
    import torch
    from transformers import AutoModelForCausalLM

    rows = [packed.train[i] for i in (0, 1, 2, 3)]
    lengths = [len(r["input_ids"]) for r in rows]
    assert len(set(lengths)) > 1  # the padded batch does pad, so the comparison means something
    flat = PaddingFreeCollator()(rows)
    padded = PackedCollator(pad_token_id=0)(rows)
    assert flat["input_ids"].shape == (1, sum(lengths))
    assert sum(lengths) < padded["input_ids"].numel()
    assert flat["input_ids"][0].tolist() == [t for r in rows for t in r["input_ids"]]  # zero pad tokens
    assert flat["position_ids"][0].tolist() == [p for r in rows for p in r["position_ids"]]
    assert "attention_mask" not in flat and flat["use_cache"] is False

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="sdpa", dtype=torch.float32)
    model.train()

    def loss_and_grads(batch):
        model.zero_grad()
        loss = model(**batch).loss
        loss.backward()
        return float(loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters()}

    want, want_grads = loss_and_grads(padded)
    got, got_grads = loss_and_grads(flat)
    assert 2.0 < want < 10.0 and got == pytest.approx(want, abs=1e-5)
    for name, g in want_grads.items():
        assert torch.allclose(got_grads[name], g, atol=1e-6, rtol=1e-4), name
    # the control: the same flat row read as one sequence (positions 0..n-1) trains on other losses
    control = dict(flat, position_ids=torch.arange(sum(lengths))[None])
    assert abs(loss_and_grads(control)[0] - want) > 1e-3


def test_build_honours_the_plans_collator(packed, tokenizer, instruction_data_file):
    src = {"format": "instruction", "template": "### Instruction:\n{instruction}\n### Response:\n"}
    r = make_recipe(instruction_data_file, src, max_seq_length=96, packing=True,
                    cache_dir=str(packed.report.cache_path).rsplit("/", 1)[0])
    flash = r.model_copy(update={"model": r.model.model_copy(update={"attn_implementation": "flash_attention_2"})})
    b = build(flash, tokenizer, log=lambda _: None)
    assert b.mechanism == "padding_free" and isinstance(b.collator, PaddingFreeCollator)
    assert b.report.cache_hit  # the attention implementation is not part of the data
    b = stage(flash, tokenizer, decided(flash, collator="position_ids"), log=lambda _: None)  # the Plan's word wins
    assert b.mechanism == "position_ids" and isinstance(b.collator, PackedCollator)


def _token_losses(model, batch):
    """Per-token losses of the shifted causal-LM objective, aligned to the label positions."""
    import torch

    model.train()  # as in training (dropout is 0 in the tiny model); use_cache stays the config's default
    with torch.no_grad():
        inputs = {k: v.to(model.device) if torch.is_tensor(v) else v for k, v in batch.items() if k != "labels"}
        logits = model(**inputs).logits.float().cpu()
    labels = batch["labels"]
    losses = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), reduction="none", ignore_index=-100
    ).view(labels.shape[0], -1)
    return torch.nn.functional.pad(losses, (1, 0)), labels


def _per_sample_losses_packed(model, packed_ds, collator, rows):
    out = {}
    batch = collator([packed_ds[i] for i in rows])
    losses, labels = _token_losses(model, batch)
    for r in range(len(rows)):
        pos = batch["position_ids"][r].tolist()
        ids = batch["input_ids"][r].tolist()
        n = len(packed_ds[rows[r]]["input_ids"])
        starts = [i for i in range(n) if pos[i] == 0] + [n]
        for s, e in zip(starts, starts[1:]):
            out[tuple(ids[s:e])] = float(losses[r, s:e].sum())
    return out


def _per_sample_losses_alone(model, samples):
    import torch

    out = {}
    for ids, labels in samples:
        batch = {"input_ids": torch.tensor([ids]), "labels": torch.tensor([labels])}
        losses, _ = _token_losses(model, batch)
        out[tuple(ids)] = float(losses.sum())
    return out


# Every attention implementation ftune allows on CPU (flash needs CUDA). flex_attention runs on CUDA only: ftune
# refuses it on CPU (ftune.plan.checks.environment.FLEX_CPU: no CPU backward, and a compiled CPU forward that is wrong for
# grouped-query models without AVX-512), so its case is a GPU test; it compiles for half a minute: slow.
CASES = [
    ("eager", "position_ids"),
    ("sdpa", "position_ids"),
    ("eager", "block_mask"),
    ("sdpa", "block_mask"),
    pytest.param("flex_attention", "position_ids", marks=[pytest.mark.slow, pytest.mark.gpu, pytest.mark.skipif(
        "not __import__('torch').cuda.is_available()", reason="flex_attention runs on CUDA only in ftune")]),
]


@pytest.mark.parametrize(("attn", "how"), CASES)
def test_packed_losses_equal_unpacked_losses(attn, how, packed, tiny_model_dir):
    """The reference (each sample alone, no padding, no mask) runs on sdpa: exact attention whatever kernel is
    under test, and for flex one compiled shape instead of one per sample length (a recompile each)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    device = "cuda" if attn == "flex_attention" else "cpu"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation=attn, dtype=torch.float32)
    model.to(device)
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="sdpa", dtype=torch.float32)
    collator = PackedCollator(pad_token_id=0, mode=how, attn_implementation=attn)
    rows = [0, 1, 2, 3, 4, 5]
    got = _per_sample_losses_packed(model, packed.train, collator, rows)
    samples = []
    for key in got:
        ids = list(key)
        row = next(packed.train[i] for i in rows if _contains(packed.train[i]["input_ids"], ids))
        start = _find(row["input_ids"], ids, row["position_ids"])
        labels = row["labels"][start : start + len(ids)]
        samples.append((ids, labels))
    want = _per_sample_losses_alone(reference, samples)
    assert len(got) >= 8  # distinct samples (a few repeat)
    for key, loss in got.items():
        assert loss > 0.1
        assert abs(loss - want[key]) < 1e-4, (attn, how, loss, want[key])


def test_without_restarting_positions_samples_contaminate_each_other(packed, tiny_model_dir):
    """The control: the same packed rows with plain positions and a causal mask give different losses."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="sdpa", dtype=torch.float32)
    model.eval()
    rows = [0, 1]
    good = _per_sample_losses_packed(model, packed.train, PackedCollator(pad_token_id=0), rows)
    batch = PackedCollator(pad_token_id=0)([packed.train[i] for i in rows])
    pos = batch["position_ids"].clone()
    batch["position_ids"] = torch.arange(pos.shape[1]).repeat(pos.shape[0], 1)
    losses, _ = _token_losses(model, batch)
    diffs = []
    for r in range(2):
        p, ids = pos[r].tolist(), batch["input_ids"][r].tolist()
        starts = [i for i, x in enumerate(p) if x == 0] + [len(p)]
        for s, e in zip(starts[1:-1], starts[2:]):  # every sample after the first of its row
            if tuple(ids[s:e]) in good:
                diffs.append(abs(float(losses[r, s:e].sum()) - good[tuple(ids[s:e])]))
    assert diffs and max(diffs) > 1e-2


def _contains(hay, needle):
    return any(hay[i : i + len(needle)] == needle for i in range(len(hay) - len(needle) + 1))


def _find(hay, needle, pos):
    return next(i for i in range(len(hay) - len(needle) + 1) if pos[i] == 0 and hay[i : i + len(needle)] == needle)


@pytest.mark.parametrize("kind", [list, tuple, "numpy"])
def test_padding_collators_build_exact_int64_batches_from_any_int_sequence(kind):
    """The collators build each tensor from padded rows in one call (half the CPU of a tensor per row): the batch
    is exact for ragged rows of lists, tuples or numpy arrays (datasets' numpy format), with pad_to_multiple_of."""
    import numpy as np
    import torch

    def rows(*lists):
        return [np.asarray(x, dtype=np.int32) if kind == "numpy" else kind(x) for x in lists]

    ids, labels = rows([5, 6, 7], [8]), rows([-100, 6, 7], [8])
    batch = PaddingCollator(pad_token_id=2, pad_to_multiple_of=4)(
        [{"input_ids": i, "labels": lab} for i, lab in zip(ids, labels)])
    assert {k: v.dtype for k, v in batch.items()} == dict.fromkeys(batch, torch.long)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 2], [8, 2, 2, 2]]
    assert batch["labels"].tolist() == [[-100, 6, 7, -100], [8, -100, -100, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 0, 0, 0]]
    packed_batch = PackedCollator(pad_token_id=2, pad_to_multiple_of=4)(
        [{"input_ids": i, "labels": lab, "position_ids": p} for i, lab, p in zip(ids, labels, rows([0, 1, 0], [0]))])
    assert packed_batch["position_ids"].dtype == torch.long
    assert packed_batch["position_ids"].tolist() == [[0, 1, 0, 0], [0, 0, 1, 2]]
    assert packed_batch["input_ids"].tolist() == [[5, 6, 7, 2], [8, 2, 2, 2]]
    cls = ClassificationCollator(pad_token_id=0)([{"input_ids": i, "labels": n} for i, n in zip(ids, (1, 0))])
    assert cls["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]] and cls["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert cls["labels"].tolist() == [1, 0] and cls["input_ids"].dtype == torch.long


def test_unpacked_padding_collator_masks_padding(tokenizer, text_data_file, tmp_path):
    r = make_recipe(text_data_file, max_seq_length=32, cache_dir=str(tmp_path))
    b = build(r, tokenizer, log=lambda _: None)
    assert b.mechanism == "padding"
    feats = [b.train[0], b.train[1]]
    batch = b.collator(feats)
    n0, n1 = len(feats[0]["input_ids"]), len(feats[1]["input_ids"])
    assert batch["attention_mask"].sum(1).tolist() == [n0, n1]
    short = 0 if n0 < n1 else 1
    assert (batch["labels"][short, min(n0, n1):] == -100).all()
    assert DataReport.from_dict(json.loads(json.dumps(b.report.as_dict()))) == b.report  # JSON keeps it whole


def test_the_hf_trainer_trains_and_evaluates_on_packed_batches(packed, tiny_model_dir, tmp_path):
    """The bundle plugs into transformers' Trainer as is: position_ids survive column pruning and the
    non-tensor `use_cache=False` passes through accelerate's dataloader to the model."""
    import torch
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    seen = []

    def collate(features):
        batch = packed.collator(features)
        seen.append(sorted(batch))
        return batch

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2,
                             per_device_eval_batch_size=2, report_to=[], use_cpu=True, save_strategy="no",
                             disable_tqdm=True, logging_steps=1)
    trainer = Trainer(model=model, args=args, train_dataset=packed.train, eval_dataset=packed.train.select(range(4)),
                      data_collator=collate)
    result = trainer.train()
    metrics = trainer.evaluate()
    assert seen[0] == ["input_ids", "labels", "position_ids", "use_cache"]
    assert 2.0 < result.training_loss < 10.0 and 2.0 < metrics["eval_loss"] < 10.0


def test_packing_in_shards_keeps_every_sample_and_the_fill(tmp_path):
    """Packed shard by shard into a `load_from_disk` folder (memory flat in rows), every sample lands whole in
    exactly one row within capacity, positions restart per sample, each shard costs at most a few partly filled rows,
    and with a seed the rows are shuffled within their shard only (the same seed, the same rows)."""
    import datasets
    import numpy as np

    from ftune.datastage import packing
    from ftune.datastage.packing import pack, pack_to_disk

    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 60, size=3000)
    samples = [list(range(1000 * i, 1000 * i + int(n))) for i, n in enumerate(lengths)]
    ds = datasets.Dataset.from_dict({"input_ids": samples, "labels": samples})
    whole, fill_whole = pack(ds, 64)
    shards = -(-int(lengths.sum()) // 10_000)
    rows, fill_sharded = pack_to_disk(ds, 64, tmp_path / "a", lengths, shard_tokens=10_000)
    sharded = datasets.load_from_disk(str(tmp_path / "a"))
    assert len(sharded) == rows and len(list((tmp_path / "a").glob("*.arrow"))) == 1
    assert sharded.features == packing._PACKED_FEATURES()
    found = []
    for row in sharded:
        assert len(row["input_ids"]) <= 64
        cuts = [k for k, p in enumerate(row["position_ids"]) if p == 0] + [len(row["input_ids"])]
        found += [tuple(row["input_ids"][a:b]) for a, b in zip(cuts, cuts[1:])]
    assert sorted(found) == sorted(map(tuple, samples))
    extra_rows = int(lengths.sum()) / (64 * fill_sharded) - len(whole)
    assert 0 <= extra_rows <= 4 * shards  # each shard ends on a few partly filled rows (here 10k-token shards)
    pack_to_disk(ds, 64, tmp_path / "one", lengths)  # within one shard: the in-memory result
    assert datasets.load_from_disk(str(tmp_path / "one"))["input_ids"] == whole["input_ids"]

    pack_to_disk(ds, 64, tmp_path / "s1", lengths, seed=7, shard_tokens=10_000)
    pack_to_disk(ds, 64, tmp_path / "s2", lengths, seed=7, shard_tokens=10_000)
    one, two = (datasets.load_from_disk(str(tmp_path / d))["input_ids"] for d in ("s1", "s2"))
    assert one == two and one != sharded["input_ids"]
    assert sorted(map(tuple, one)) == sorted(map(tuple, sharded["input_ids"]))
    # shuffled within shards only: the shard of each row (from its first sample) comes in the unshuffled order
    sample_of = {s[0]: k for k, s in enumerate(samples)}
    stops = [b for _, b in packing._shards(lengths, 10_000)]

    def shards_of(rows):
        return [int(np.searchsorted(stops, sample_of[r[0]], side="right")) for r in rows]

    assert len(stops) == shards and shards_of(one) == shards_of(sharded["input_ids"]) == sorted(shards_of(one))


def test_packing_many_files_one_dataset(tmp_path, monkeypatch):
    """Past FILE_TOKENS a new Arrow file starts; `load_from_disk` reads the files as one dataset, in order."""
    import datasets

    from ftune.datastage import packing

    samples = [[i] * 30 for i in range(100)]
    ds = datasets.Dataset.from_dict({"input_ids": samples, "labels": samples})
    monkeypatch.setattr(packing, "FILE_TOKENS", 600)
    rows, fill = packing.pack_to_disk(ds, 64, tmp_path / "p", [30] * 100, shard_tokens=300)
    assert len(list((tmp_path / "p").glob("*.arrow"))) == 5 and rows == 50 and fill == 60 / 64
    out = datasets.load_from_disk(str(tmp_path / "p"))
    assert out["input_ids"] == [[2 * k] * 30 + [2 * k + 1] * 30 for k in range(50)]
