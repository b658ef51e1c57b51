"""vision-chat data (#26): every bad input is located at the row and field, images are read one way (RGB, resized,
CMYK and 16-bit converted with a note), labels follow the processor's expansion of the image placeholders, the
collator adds the pixel inputs, and the recipe rules refuse what can't combine with a VLM, located."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ftune.datafiles.images import ImageProblem, open_image, parse_row
from ftune.datafiles.masking import IGNORE
from ftune.errors import RecipeError
from ftune.recipe.schema import DataSource, ImageSettings, Recipe
from ftune.datastage.vision_chat import expand_labels

FIT = ImageSettings()


def _png(path: Path, size=(28, 28), mode="RGB", colour=(200, 10, 10)) -> Path:
    from PIL import Image

    Image.new(mode, size, colour).save(path)
    return path


def _src(path: Path):
    from ftune.datafiles.sources import resolve

    return resolve(DataSource(path=str(path), format="vision-chat"), "data.train[0]")


def _row(*parts, answer="red") -> dict:
    return {"messages": [{"role": "user", "content": list(parts)}, {"role": "assistant", "content": answer}]}


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ------------------------------------------------------------------------------------------ images
def test_a_missing_image_a_non_image_and_a_truncated_one_are_refused_at_their_field(tmp_path):
    with pytest.raises(ImageProblem) as err:
        open_image(str(tmp_path / "nope.png"), FIT, "messages[0].content[0].image")
    assert "does not exist" in err.value.message and err.value.field == "messages[0].content[0].image"
    (tmp_path / "notes.png").write_text("not an image")
    with pytest.raises(ImageProblem, match="is not an image PIL can read"):
        open_image(str(tmp_path / "notes.png"), FIT)
    whole = _png(tmp_path / "whole.png", (64, 64))
    (tmp_path / "cut.png").write_bytes(whole.read_bytes()[:80])
    with pytest.raises(ImageProblem, match="can't be read") as err:
        open_image(str(tmp_path / "cut.png"), FIT)
    assert "truncated" in err.value.hint


def test_a_huge_image_is_scaled_into_max_pixels_or_refused_without_resize(tmp_path):
    big = _png(tmp_path / "big.png", (200, 100))
    image, notes = open_image(str(big), ImageSettings(max_pixels=5000))
    assert image.size[0] * image.size[1] <= 5000 and image.size[0] == 2 * image.size[1] and notes == []
    with pytest.raises(ImageProblem) as err:
        open_image(str(big), ImageSettings(max_pixels=5000, resize="none"), "messages[0].content[0].image")
    assert "200x100 = 20,000 pixels, beyond data.images.max_pixels (5,000)" in err.value.message
    assert "resize: fit" in err.value.hint
    small, _ = open_image(str(_png(tmp_path / "s.png", (4, 4))), ImageSettings(min_pixels=64))
    assert small.size[0] * small.size[1] >= 64


def test_cmyk_and_16_bit_images_are_converted_to_rgb_with_a_note(tmp_path):
    import numpy as np
    from PIL import Image

    cmyk, notes = open_image(str(_png(tmp_path / "c.jpg", mode="CMYK", colour=(0, 255, 255, 0))), FIT)
    assert cmyk.mode == "RGB" and notes == ["a CMYK image was converted to RGB"]
    assert cmyk.getpixel((5, 5))[0] > 200 and cmyk.getpixel((5, 5))[1] < 50  # cyan-free, magenta+yellow: red
    Image.fromarray(np.full((8, 8), 65535 // 2, dtype=np.uint16)).save(tmp_path / "deep.png")
    deep, notes = open_image(str(tmp_path / "deep.png"), FIT)
    assert deep.mode == "RGB" and notes == ["a high-bit-depth image (I;16) was converted to 8-bit RGB"]
    assert deep.getpixel((1, 1)) == (127, 127, 127)  # 32767 / 65535 of the range


def test_row_problems_name_the_field(tmp_path):
    src = _src(_jsonl(tmp_path / "d.jsonl", [{}]))
    cases = [
        (_row({"type": "image", "image": "http://x/cat.png"}), "is a URL", "messages[0].content[0].image"),
        (_row({"type": "image"}), "needs `image`", "messages[0].content[0].image"),
        (_row({"type": "audio", "audio": "a.wav"}), "needs `type: text` or `type: image`",
         "messages[0].content[0].type"),
        (_row({"type": "text", "text": ["a"]}), "needs a string `text`", "messages[0].content[0].text"),
        ({"messages": [{"role": "assistant", "content": [{"type": "image", "image": "a.png"}]}]},
         "assistant message carries an image", "messages[0].content[0].image"),
    ]
    for row, message, field in cases:
        with pytest.raises(ImageProblem) as err:
            parse_row(row["messages"], src, tmp_path)
        assert message in err.value.message and err.value.field == field, (row, err.value.message)
    ok = parse_row(_row({"type": "image", "image": "sub/a.png"}, {"type": "text", "text": "hi"})["messages"], src,
                   tmp_path)
    assert ok.images == [str((tmp_path / "sub" / "a.png").resolve())]
    assert ok.messages[0]["content"] == [{"type": "image"}, {"type": "text", "text": "hi"}]


# ------------------------------------------------------------------------------------------ labels
def test_labels_follow_the_expansion_of_the_image_placeholders():
    img, vs, ve = 9, 7, 8
    # Qwen: <vision_start><image_pad><vision_end> -> the pad repeated
    short, labels = [1, vs, img, ve, 2, 3, 4], [IGNORE] * 5 + [3, 4]
    long = [1, vs, img, img, img, img, ve, 2, 3, 4]
    assert expand_labels(short, labels, long, {img}) == [IGNORE] * 8 + [3, 4]
    # Idefics3: <image> -> <fake><global><image>x2<fake>, and the expansion holds the token after the placeholder
    short, labels = [1, img, 5, 6, 4], [IGNORE, IGNORE, IGNORE, 6, 4]
    long = [1, 20, 21, img, img, 5, 20, 5, 6, 4]
    assert expand_labels(short, labels, long, {img}) == [IGNORE] * 8 + [6, 4]
    assert expand_labels([1, 2], [1, 2], [1, 3], {img}) is None  # rewritten beyond the placeholders


# ------------------------------------------------------------------------------- the data stage
@pytest.fixture(scope="module")
def processor(tiny_tokenizer_dir, tmp_path_factory):
    from transformers import AutoProcessor, AutoTokenizer, CLIPImageProcessor, LlavaProcessor

    from ftune.tiny import VLM_TEMPLATE, VLM_TOKENS

    tok = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    tok.add_special_tokens({"additional_special_tokens": VLM_TOKENS})
    folder = tmp_path_factory.mktemp("proc")
    LlavaProcessor(image_processor=CLIPImageProcessor(size={"shortest_edge": 28},
                                                      crop_size={"height": 28, "width": 28}),
                   tokenizer=tok, chat_template=VLM_TEMPLATE, patch_size=14,
                   vision_feature_select_strategy="default", num_additional_image_tokens=1).save_pretrained(folder)
    return AutoProcessor.from_pretrained(folder)


def _encode(processor, path: Path, max_images=None, max_len=None):
    import numpy as np

    from ftune.datafiles.images import read_rows
    from ftune.datastage.vision_chat import Settings, encode_source

    src = _src(path)
    rows = read_rows(src)
    settings = Settings(processor, processor.chat_template, FIT, max_len, "completion", max_images)
    return encode_source(src, rows, np.arange(len(rows)), settings)


def test_rows_encode_with_image_tokens_masked_and_the_collator_adds_pixels(processor, tmp_path):
    from ftune.datastage.vision_chat import VisionCollator

    _png(tmp_path / "a.png")
    _png(tmp_path / "b.png", (56, 40))
    path = _jsonl(tmp_path / "d.jsonl", [
        _row({"type": "image", "image": "a.png"}, {"type": "text", "text": "what colour"}),
        {"messages": [{"role": "user", "content": "no image here"}, {"role": "assistant", "content": "ok"}]},
        _row({"type": "text", "text": "two"}, {"type": "image", "image": "a.png"},
             {"type": "image", "image": "b.png"}, answer="blue"),
    ])
    ds, notes = _encode(processor, path)
    image = processor.tokenizer.convert_tokens_to_ids("<image>")
    assert ds["_image_tokens"] == [4, 0, 8] and ds["_sizes"] == [[28, 28], [], [28, 28, 56, 40]] and notes == []
    for ids, labels in zip(ds["input_ids"], ds["labels"]):
        trained = processor.tokenizer.decode([t for t, lab in zip(ids, labels) if lab != IGNORE])
        assert image not in [lab for lab in labels] and trained.endswith("<|im_end|>")
    assert processor.tokenizer.decode([t for t, lab in zip(ds[2]["input_ids"], ds[2]["labels"]) if lab != IGNORE]) \
        == "blue<|im_end|>"
    batch = VisionCollator(0, processor, FIT)([ds[0], ds[1], ds[2]])
    assert tuple(batch["pixel_values"].shape) == (3, 3, 28, 28)  # three images, rows in order; row 2 has none
    assert batch["labels"].shape == batch["input_ids"].shape and (batch["labels"][1, len(ds[1]["input_ids"]):]
                                                                  == IGNORE).all()


def test_mllama_batches_get_the_cross_attention_mask_its_processor_builds(tiny_tokenizer_dir, tmp_path):
    """Mllama's text attends to an image through `cross_attention_mask`, which its processor builds from the text:
    the collator builds it from the padded batch the same way (each image from its `<|image|>` token to the next
    image's, the last to the row's end; nothing before the first), equal to the processor's own on the same text."""
    import torch
    from PIL import Image
    from transformers import AutoProcessor, AutoTokenizer

    from ftune.datastage.vision_chat import VisionCollator
    from ftune.tiny_vision import mllama_parts

    mllama_parts(AutoTokenizer.from_pretrained(tiny_tokenizer_dir))[1].save_pretrained(tmp_path / "m")
    processor = AutoProcessor.from_pretrained(tmp_path / "m")  # as the run loads it
    _png(tmp_path / "a.png")
    _png(tmp_path / "b.png", (56, 40))
    rows = [_row({"type": "image", "image": "a.png"}, {"type": "text", "text": "what colour"}),
            _row({"type": "text", "text": "two"}, {"type": "image", "image": "a.png"}, {"type": "text", "text": "and"},
                 {"type": "image", "image": "b.png"}, answer="blue")]
    ds, _ = _encode(processor, _jsonl(tmp_path / "d.jsonl", rows))
    batch = VisionCollator(processor.tokenizer.pad_token_id, processor, FIT)([ds[0], ds[1]])
    mask, ids = batch["cross_attention_mask"], batch["input_ids"]
    assert tuple(mask.shape) == (2, ids.shape[1], 2, 1)  # rows, tokens, images, tiles
    image = processor.image_token_id
    first, (second, third) = [(row == image).nonzero().flatten().tolist() for row in ids]
    positions = torch.arange(ids.shape[1])
    assert mask[0, :, 0, 0].tolist() == (positions >= first[0]).int().tolist() and not mask[0, :, 1].any()
    assert mask[1, :, 0, 0].tolist() == ((positions >= second) & (positions < third)).int().tolist()
    assert mask[1, :, 1, 0].tolist() == (positions >= third).int().tolist()
    texts = [processor.tokenizer.decode(row[:len(d["input_ids"])]) for row, d in zip(ids, [ds[0], ds[1]])]
    images = [[Image.open(tmp_path / "a.png")], [Image.open(tmp_path / "a.png"), Image.open(tmp_path / "b.png")]]
    own = processor(text=texts, images=images, add_special_tokens=False, padding=True, return_tensors="pt")
    assert own["input_ids"].equal(ids) and own["cross_attention_mask"].equal(mask)


def test_too_many_images_and_a_cut_image_are_refused_at_the_row(processor, tmp_path):
    _png(tmp_path / "a.png")
    path = _jsonl(tmp_path / "d.jsonl", [
        _row({"type": "image", "image": "a.png"}, {"type": "text", "text": "one"}),
        _row({"type": "image", "image": "a.png"}, {"type": "image", "image": "a.png"}),
    ])
    from ftune.datafiles.errors import DataError

    with pytest.raises(DataError) as err:
        _encode(processor, path, max_images=1)
    assert "row 2 of" in err.value.message and "field messages[0].content[1].image" in err.value.message
    assert "2 images, but the model takes at most 1 per sample" in err.value.message
    assert err.value.location.line == 2
    with pytest.raises(DataError, match="beyond data.max_seq_length"):
        _encode(processor, path, max_len=6)


# ------------------------------------------------------------------------------ pre-launch checks
def _recipe(data: Path, **extra) -> Recipe:
    body = {"name": "v", "model": {"path": "m", "task": "image-text-to-text"},
            "data": {"train": [{"path": str(data), "format": "vision-chat"}]}, "train": {"max_steps": 1}}
    for key, value in extra.items():
        body[key] = {**body.get(key, {}), **value}
    return Recipe.model_validate(body)


def test_the_compiler_check_locates_a_bad_image_in_the_first_rows(tmp_path):
    from ftune.datafiles.check import check_fields

    _png(tmp_path / "a.png")
    path = _jsonl(tmp_path / "d.jsonl", [_row({"type": "image", "image": "a.png"}),
                                         _row({"type": "text", "text": "x"}, {"type": "image", "image": "gone.png"})])
    [problem] = check_fields(_recipe(path))
    assert problem.path == "data.train[0].path"
    assert problem.message.startswith("row 2 of") and "field messages[0].content[1].image" in problem.message
    assert "gone.png does not exist" in problem.message


def test_an_image_part_in_a_text_model_s_chat_data_is_refused_at_the_row(tmp_path, tiny_tokenizer_dir):
    from ftune.datafiles.chat_rows import normalize_messages

    src = _src(_jsonl(tmp_path / "d.jsonl", [{}]))

    def fail(i, message, hint=None):
        return ValueError(f"row {i + 1}: {message} | {hint}")

    with pytest.raises(ValueError) as err:
        normalize_messages(_row({"type": "image", "image": "a.png"})["messages"], src, 0, fail)
    assert "holds image (or other media) parts, not text" in str(err.value)
    assert "`format: vision-chat` with `model.task: image-text-to-text`" in str(err.value)


RULES = [
    ("  path: m\n", "data:\n  train:\n    - {path: d.jsonl, format: vision-chat}\n", "data.train[0].format",
     "carries images, but model.task is 'causal-lm'"),
    ("  path: m\n  task: image-text-to-text\n", "data:\n  train:\n    - {path: d.jsonl, format: chat}\n",
     "data.train[0].format", "trains on rows with images (vision-chat, vision-preference, vision-prompt)"),
    ("  path: m\n  task: image-text-to-text\n",
     "data:\n  packing: true\n  max_seq_length: 64\n  train:\n    - {path: d.jsonl, format: vision-chat}\n",
     "data.packing", "vision-chat rows can't be packed"),
    ("  path: m\n  task: image-text-to-text\n",
     "data:\n  train:\n    - {path: d.jsonl, format: vision-chat}\ntrain:\n  objective: dpo\n",
     "data.train[0].format", "vision-chat rows are conversations for sft, but train.objective is 'dpo'"),
    ("  path: m\n", "data:\n  train:\n    - {path: d.jsonl}\npeft:\n  modules: {vision: lora}\n", "peft.modules",
     "splits a vision-language model"),
    ("  path: m\n", "data:\n  train:\n    - {path: d.jsonl}\npeft:\n  method: full\n  modules: {vision: frozen}\n",
     "peft.modules", "splits a vision-language model"),
    ("  path: m\n  task: image-text-to-text\n", "data:\n  train:\n    - {path: d.jsonl, format: vision-chat}\n"
     "peft:\n  method: full\n  modules: {vision: frozen, projector: frozen, language: frozen}\n", "peft.modules",
     "every part of the model is frozen under peft.method full"),
    ("  path: m\n  task: image-text-to-text\n", "data:\n  train:\n    - {path: d.jsonl, format: vision-chat}\n"
     "peft:\n  method: full\n  modules: {language: lora}\n", "peft.modules.language", "invalid value 'lora'"),  # hint: allowed values: frozen, full
    ("  path: m\n  task: image-text-to-text\n",
     "data:\n  images: {min_pixels: 100, max_pixels: 10}\n  train:\n    - {path: d.jsonl, format: vision-chat}\n",
     "data.images.min_pixels", "is above max_pixels"),
]


@pytest.mark.parametrize("model,rest,where,message", RULES)
def test_vision_rules_are_located(tmp_path, model, rest, where, message):
    from ftune.recipe import load_recipe

    f = tmp_path / "r.yaml"
    f.write_text(f"name: t\nmodel:\n{model}{rest}" + ("" if "train:\n  objective" in rest else "train:\n  max_steps: 2\n"))
    with pytest.raises(RecipeError) as err:
        load_recipe(f)
    found = {p.path: p.message for p in err.value.problems}
    assert where in found and message in found[where], found


def test_lora_parts_and_full_parts_resolve_per_part_and_all_frozen_is_refused():
    from ftune.methods._lora_targets import resolve
    from ftune.methods.lora import Config
    from tests.unit.test_vision_parts import _meta

    model = _meta("qwen2_vl")
    targets, problems = resolve(model, Config(target_modules="all-linear"))
    assert problems == [] and targets.modules_to_save == ["model.visual.merger"]
    assert targets.modules and all(n.startswith("model.language_model.") for n in targets.modules)
    targets, problems = resolve(model, Config(target_modules="all-linear",
                                              modules={"vision": "lora", "projector": "frozen", "language": "full"}))
    assert targets.modules_to_save == ["lm_head", "model.language_model"]
    assert targets.modules and all(n.startswith("model.visual.blocks.") for n in targets.modules)
    # Qwen's vision attention is one fused `qkv`: the default q_proj/v_proj targets nothing there, said at the key
    _, problems = resolve(model, Config(modules={"vision": "lora"}))
    assert [p.path for p in problems] == ["peft.target_modules"] and "vision part" in problems[0].message
    _, problems = resolve(model, Config(modules={"vision": "frozen", "projector": "frozen", "language": "frozen"}))
    assert any("nothing trains" in p.message for p in problems)


def test_a_missing_image_processor_is_refused_before_launch_at_model_path(tmp_path):
    from ftune.plan.checks.model_files import image_processor

    model = tmp_path / "vlm"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llava"}')
    data = _jsonl(tmp_path / "d.jsonl", [_row({"type": "text", "text": "x"})])
    recipe = _recipe(data, model={"path": str(model)})
    [problem] = image_processor(recipe)
    assert problem.path == "model.path" and "has no image processor" in problem.message
    (model / "preprocessor_config.json").write_text("{}")
    assert image_processor(recipe) == []


def test_a_second_family_whose_processor_rewrites_the_placeholder_encodes_and_trains_a_step(tmp_path,
                                                                                          tiny_tokenizer_dir):
    """Idefics3 replaces `<image>` with `<fake><global-img><image><fake>`: the labels still train the answer only,
    and the model takes the collator's batch (pixel_values [rows, images, 3, H, W] + pixel_attention_mask)."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

    from ftune.methods.lora import Config, inject
    from ftune.tiny import build_tiny_idefics3
    from ftune.datastage.vision_chat import VisionCollator

    build_tiny_idefics3(tmp_path / "m", AutoTokenizer.from_pretrained(tiny_tokenizer_dir))
    proc = AutoProcessor.from_pretrained(tmp_path / "m")
    _png(tmp_path / "a.png")
    path = _jsonl(tmp_path / "d.jsonl", [_row({"type": "image", "image": "a.png"}, {"type": "text", "text": "what"}),
                                         {"messages": [{"role": "user", "content": "hi"},
                                                       {"role": "assistant", "content": "blue"}]}])
    ds, _ = _encode(proc, path)
    tok = proc.tokenizer
    first = tok.convert_ids_to_tokens(ds[0]["input_ids"])
    assert first[5:9] == ["<fake_token_around_image>", "<global-img>", "<image>", "<fake_token_around_image>"]
    assert [tok.decode([t for t, lab in zip(r["input_ids"], r["labels"]) if lab != IGNORE]) for r in ds] == \
        ["red<|im_end|>", "blue<|im_end|>"]
    model = inject(AutoModelForImageTextToText.from_pretrained(tmp_path / "m"), Config(target_modules="all-linear"),
                   "image-text-to-text")
    batch = VisionCollator(tok.pad_token_id, proc, FIT)([ds[0], ds[1]])
    assert tuple(batch["pixel_values"].shape) == (1, 1, 3, 28, 28)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(3):
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0]
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert any(".connector." in n for n in trained) and not any(".vision_model." in n for n in trained)
