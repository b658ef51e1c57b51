"""`ftune plan` counts the parameters model.add_tokens / model.special_tokens add and train, as the worker builds them."""

from __future__ import annotations

from ftune.estimate.estimate import estimate
from ftune.recipe.schema import Recipe

TOKENS = {"add_tokens": ["<|im_start|>", "the"], "special_tokens": {"eos_token": "<|im_end|>", "pad_token": "<p>"}}


def _recipe(path: str, **model) -> Recipe:
    return Recipe.model_validate({"name": "t", "model": {"path": path, **model}, "data": {"train": [{"path": "d"}]},
                                  "peft": {"method": "lora", "r": 4, "target_modules": ["q_proj"]},
                                  "train": {"max_steps": 1}})


def test_tiny_model_counts_equal_the_worker_built_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ftune.methods import lora
    from ftune.worker.peft import count_parameters
    from ftune.datastage.tokenizer import apply_tokens, trained_token_ids

    recipe = _recipe(str(tiny_model_dir), **TOKENS)
    planned = estimate(recipe, world_size=1, num_processes=1, gpu_memory=None, device="cpu", seq_length=16)

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    apply_tokens(tok, recipe.model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.resize_token_embeddings(len(tok))
    built = count_parameters(lora.inject(model, recipe.peft, "causal-lm", trained_token_ids(tok, recipe.model)))
    assert (planned.params_total, planned.params_trainable) == (built.total, built.trainable)
    assert "tokens: 3 added (embedding rows 387), 3 trained row(s)" in planned.notes[0]  # "the" exists already


def test_catalog_model_without_a_tokenizer_counts_every_listed_token_as_new():
    base = estimate(_recipe("meta-llama/Llama-3.1-8B"), world_size=1, num_processes=1, gpu_memory=80 << 30)
    more = estimate(_recipe("meta-llama/Llama-3.1-8B", **TOKENS), world_size=1, num_processes=1,
                    gpu_memory=80 << 30)
    rows, hidden = 4, 4096  # <|im_start|>, the, <|im_end|>, <p>: no tokenizer to say "the" exists
    assert more.params_total - base.params_total == 2 * rows * hidden + 2 * 3 * hidden  # untied head; 3 trained
    assert more.params_trainable - base.params_trainable == 2 * 3 * hidden
    assert "no local tokenizer.json" in more.notes[0]
