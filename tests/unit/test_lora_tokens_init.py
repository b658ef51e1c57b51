"""LoRA with added tokens (only their embedding and head rows train, saved with the adapter) and PiSSA/OLoRA
initialisation (the saved adapter, converted, reproduces the trained model on the original base)."""

from __future__ import annotations

import pytest

from ftune.methods import lora
from ftune.recipe.schema import ModelSection
from ftune.worker.save import save_converted, save_initial_adapter
from ftune.datastage.tokenizer import apply_tokens, trained_token_ids


def _base(tiny_model_dir, tok=None):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype="float32")
    if tok is not None and len(tok) > model.get_input_embeddings().num_embeddings:
        model.resize_token_embeddings(len(tok))
    return model


def _step(model, ids):
    import torch

    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad()


def test_added_token_rows_train_and_reload_with_the_adapter(tiny_model_dir, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    spec = ModelSection(path=str(tiny_model_dir), add_tokens=["<|im_start|>"], special_tokens={"eos_token": "<|x|>"})
    apply_tokens(tok, spec)
    ids = trained_token_ids(tok, spec)
    base = _base(tiny_model_dir, tok)
    old_rows = base.get_input_embeddings().weight[: ids[0]].clone()
    cfg = lora.Config(r=4, dropout=0.0, target_modules=["q_proj"])
    model = lora.inject(base, cfg, "causal-lm", trained_tokens=ids)
    hidden = base.config.hidden_size
    trainable = {n: p.numel() for n, p in model.named_parameters() if p.requires_grad}
    tokens = {n: v for n, v in trainable.items() if "trainable_tokens" in n}
    assert sum(tokens.values()) == 2 * len(ids) * hidden  # embedding rows + (untied) head rows, nothing more

    x = torch.tensor([[ids[0], 5, 6, 7, ids[1]]])
    _step(model, x)
    merged = model.get_input_embeddings()
    with torch.no_grad():
        emb = merged(torch.arange(len(tok)))
    assert torch.equal(emb[: ids[0]], old_rows)  # the base vocabulary is untouched
    assert not torch.allclose(emb[ids], _base(tiny_model_dir, tok).get_input_embeddings().weight[ids])

    model.eval()
    with torch.no_grad():
        want = model(input_ids=x).logits
    model.save_pretrained(str(tmp_path / "adapter"))
    reloaded = PeftModel.from_pretrained(_base(tiny_model_dir, tok), str(tmp_path / "adapter")).eval()
    with torch.no_grad():
        assert torch.allclose(reloaded(input_ids=x).logits, want, atol=1e-5)


@pytest.mark.parametrize(("init", "new_tokens"), [("pissa", 0), ("olora", 0), ("pissa", 1)])
def test_converted_adapter_reproduces_the_trained_model_on_the_original_base(tiny_model_dir, tmp_path, init,
                                                                             new_tokens):
    """With an added token too: peft's conversion alone drops the token rows (save_converted puts them back)."""
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file

    torch.manual_seed(0)
    cfg = lora.Config(r=4, dropout=0.0, target_modules=["q_proj", "v_proj"], init=init)
    vocab = _base(tiny_model_dir).config.vocab_size
    base = _base(tiny_model_dir)
    if new_tokens:
        base.resize_token_embeddings(vocab + new_tokens, mean_resizing=False)
    model = lora.inject(base, cfg, "causal-lm", trained_tokens=list(range(vocab, vocab + new_tokens)))
    save_initial_adapter(model, tmp_path / "initial")
    x = torch.tensor([[1, 5, 6, 7, 8, 9] + list(range(vocab, vocab + new_tokens))])
    _step(model, x)
    model.eval()
    with torch.no_grad():
        want = model(input_ids=x).logits
    save_converted(model, tmp_path / "initial", tmp_path / "final")

    saved = load_file(str(tmp_path / "final" / "adapter_model.safetensors"))
    assert {tuple(v.shape)[0] for k, v in saved.items() if "lora_A" in k} == {8}  # twice the rank
    original = _base(tiny_model_dir)
    if new_tokens:
        original.resize_token_embeddings(vocab + new_tokens)  # rows differ: the adapter carries the trained ones
        assert any("trainable_tokens_delta" in k for k in saved)
    reloaded = PeftModel.from_pretrained(original, str(tmp_path / "final")).eval()
    with torch.no_grad():
        got = reloaded(input_ids=x).logits
    assert torch.allclose(got, want, atol=1e-4)
    with torch.no_grad():
        plain = _base(tiny_model_dir)(input_ids=x[:, :6]).logits
    assert not torch.allclose(plain, want[:, :6, :vocab], atol=1e-4)  # the step changed the model


def test_embedding_in_modules_to_save_trains_whole_instead_of_rows(tiny_model_dir):
    """Axolotl's habit (lora_modules_to_save: [embed_tokens, lm_head] with added tokens): whole matrices train."""
    base = _base(tiny_model_dir)
    cfg = lora.Config(r=4, target_modules=["q_proj"], modules_to_save=["embed_tokens", "lm_head"])
    model = lora.inject(base, cfg, "causal-lm", trained_tokens=[3, 4])
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert not any("trainable_tokens" in n for n in names)
    assert any("embed_tokens.modules_to_save" in n for n in names) and any("lm_head.modules_to_save" in n for n in names)
    assert lora.token_layers(_base(tiny_model_dir), [3], ["lm_head"]) == {"model.embed_tokens": [3]}
