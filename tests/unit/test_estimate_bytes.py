"""Estimated bytes against measured tensors of real (tiny) training steps, and the pure accounting rules."""

from __future__ import annotations

import pytest

from ftune.estimate.estimate import estimate
from ftune.estimate.facts import ActivationProfile, ParamFact
from ftune.estimate.memory import Layout, per_device, quantized_weight_bytes
from ftune.estimate.optimizer import optimizer_state_bytes, optimizer_spec
from ftune.recipe.schema import Recipe

METHODS = {
    "lora": {"method": "lora", "r": 4, "target_modules": ["q_proj", "v_proj", "down_proj"]},
    "full": {"method": "full"},
    "freeze": {"method": "freeze", "trainable": [r"layers\.1\.", "lm_head"]},
    "prefix": {"method": "prefix", "num_virtual_tokens": 6},
    "llama-adapter": {"method": "llama-adapter", "adapter_len": 4, "adapter_layers": 1},
}
BATCH, SEQ = 2, 48


def recipe(model_dir, peft: dict, dtype: str = "float32", **train) -> Recipe:
    return Recipe.model_validate({
        "name": "t",
        "model": {"path": str(model_dir), "dtype": dtype},
        "data": {"train": [{"path": "d.jsonl"}], "max_seq_length": SEQ},
        "peft": peft,
        "train": {"per_device_batch_size": BATCH, **train},
    })


def by_kind(est) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in est.memory:
        if item.kind in ("weights", "gradients", "optimizer"):
            out[item.kind] = out.get(item.kind, 0) + item.bytes
    return out


def forward_saved_bytes(model, batch: int = BATCH, seq: int = SEQ) -> int:
    """Bytes of the storages a real forward (train mode) saves for backward, the weights left out: what the meta
    probe must equal."""
    import torch

    model.train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    ids = torch.randint(3, 300, (batch, seq))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, labels=ids)
    return sum(seen.values())


def real_step(model_dir, r: Recipe, dtype):
    """One real forward/backward/AdamW step; the bytes of weights, gradients and optimizer states."""
    import torch
    from transformers import AutoModelForCausalLM

    from ftune.methods import method_module

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa")
    model = method_module(r.peft.method).inject(model, r.peft, "causal-lm")
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3)
    ids = torch.randint(3, 300, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    measured = {
        "weights": sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values()),
        "gradients": sum(p.grad.numel() * p.grad.element_size() for p in params),
    }
    opt.step()
    measured["optimizer"] = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values())
    return model, measured, float(loss)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_weights_gradients_optimizer_equal_measured_tensor_bytes(tiny_model_dir, method):
    import torch

    r = recipe(tiny_model_dir, METHODS[method])
    est = estimate(r, world_size=1, num_processes=1, gpu_memory=None, device="cpu")
    _, measured, loss = real_step(tiny_model_dir, r, torch.float32)
    assert loss > 0
    assert by_kind(est) == measured


def test_bf16_full_keeps_bf16_gradients_and_states(tiny_model_dir):
    import torch

    r = recipe(tiny_model_dir, METHODS["full"], dtype="bfloat16")
    est = estimate(r, world_size=1, num_processes=1, gpu_memory=None, device="cpu")
    model, measured, _ = real_step(tiny_model_dir, r, torch.bfloat16)
    n = sum(p.numel() for p in model.parameters())
    assert by_kind(est) == measured
    assert measured["optimizer"] == 2 * 2 * n + 4 * len(list(model.parameters()))  # exp_avg, exp_avg_sq, step


@pytest.mark.parametrize(("method", "attn"), [("lora", "sdpa"), ("full", "sdpa"), ("freeze", "sdpa"),
                                             ("prefix", "sdpa"), ("lora", "eager"), ("full", "eager")])
def test_activation_probe_equals_what_autograd_saves_on_cpu(tiny_model_dir, method, attn):
    """The meta probe records exactly the bytes a real CPU forward saves for backward."""
    from transformers import AutoModelForCausalLM

    from ftune.methods import method_module
    from ftune.estimate.estimate import _apply_method
    from ftune.models.meta import _build, resolve_config
    from ftune.estimate.probe import probe_activations

    r = recipe(tiny_model_dir, METHODS[method])
    meta, _, _ = _build(r, resolve_config(r)[0])
    meta = _apply_method(meta, r).to("meta")
    profile = probe_activations(meta, batch=BATCH, seq=SEQ, attn_implementation=attn,
                                layer_classes={"LlamaDecoderLayer"}, quantized=set())

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation=attn)
    model = method_module(method).inject(model, r.peft, "causal-lm")
    saved = forward_saved_bytes(model)
    # prefix: peft's prompt-token ids are an expanded CPU view (6 ids) in the real model and a copied
    # (2, 6) tensor on meta: 48 bytes more on meta, the only difference
    slack = 48 if method == "prefix" else 0
    assert profile.saved(False) - saved == slack
    assert profile.head_bytes == BATCH * SEQ * model.config.vocab_size * 4  # fp32 log-probs


# ------------------------------------------------------------------------------------ pure accounting
def fact(shape, dtype="bfloat16", trainable=True, quant=None):
    size = {"bfloat16": 2, "float32": 4}[dtype]
    return ParamFact("w", tuple(shape), dtype, size, trainable, quant)


def test_nf4_layout_bytes():
    p = fact((4096, 4096), trainable=False, quant="nf4")
    n = 4096 * 4096
    assert quantized_weight_bytes(p, double_quant=False) == n // 2 + (n // 64) * 4 + 64
    # double quantization: 8-bit absmax + one fp32 absmax per 256 of them + 256-entry code + offset
    assert quantized_weight_bytes(p, double_quant=True) == n // 2 + n // 64 + (n // 64 // 256) * 4 + 1024 + 4 + 64
    int8 = fact((1024, 4096), trainable=False, quant="int8")
    assert quantized_weight_bytes(int8, double_quant=False) == 1024 * 4096 + 1024 * 4


@pytest.mark.parametrize(
    ("optimizer", "expected"),
    [
        ("adamw_torch", 2 * 2 * 8192 + 4),  # bf16 states + fp32 step
        ("adamw_8bit", 2 * (8192 + 8192 // 256 * 4 + 1024)),  # 8-bit + blockwise absmax + qmap
        ("paged_adamw_32bit", 2 * 4 * 8192),
        ("sgd", 0),
        ("adafactor", (64 + 128) * 4),  # factored second moment: rows + columns
    ],
)
def test_optimizer_states_by_optimizer(optimizer, expected):
    spec, known = optimizer_spec(optimizer)
    assert known
    assert optimizer_state_bytes([fact((64, 128))], spec) == expected


def test_small_tensors_keep_32bit_states_in_8bit_adam():
    spec, _ = optimizer_spec("adamw_8bit")
    assert optimizer_state_bytes([fact((16, 64))], spec) == 2 * 4 * 1024


def test_unknown_optimizer_is_assumed_adamw():
    spec, known = optimizer_spec("my_optimizer")
    assert not known and spec.states == 2


PROFILE = ActivationProfile(layer_bytes=(100, 100), layer_input_bytes=(10, 10), outside_bytes=30, head_bytes=20)


def test_checkpointing_keeps_layer_inputs_and_recomputes_one_layer():
    assert PROFILE.saved(False) == 230 and PROFILE.saved(True) == 50
    assert PROFILE.transient(False) == (40, "head gradients (logits-sized)")
    assert PROFILE.transient(True) == (80, "one layer recomputed in backward")


def test_peak_is_weights_and_states_plus_the_larger_phase():
    params = [fact((1000,), "float32"), fact((500,), "float32", trainable=False)]
    mem = per_device(params, PROFILE, Layout(device="cpu"))
    # weights 6000 + states (2*4000 + 4) always; backward 230 + 40 < update: grads 4000 + scratch 2*4000
    assert mem.peak_phase == "update"
    assert mem.total == 6000 + 8004 + 4000 + 8000
    gpu = per_device(params, PROFILE, Layout(device="cuda"))
    assert gpu.total == 6000 + 8004 + 4000 + 4000 + 2 * 32 * 1024**2  # foreach: one state-sized copy; cuBLAS


def test_fsdp_shards_weights_gradients_and_states():
    params = [fact((8000,), "float32")]
    one = per_device(params, PROFILE, Layout(device="cuda"))
    eight = per_device(params, PROFILE, Layout(device="cuda", strategy="fsdp", shard_ranks=8,
                                               largest_unit_bytes=1000, root_unit_bytes=0))
    shard = {i.detail: i.bytes for i in eight.items}
    assert shard["float32"] == 32000 // 8 and shard["all-gathered FSDP units"] == 2000
    workspaces = 2 * 32 * 1024**2  # per device, not sharded
    assert eight.total - workspaces < (one.total - workspaces) / 3
    ddp = per_device(params, PROFILE, Layout(device="cuda", strategy="ddp", shard_ranks=8))
    assert {i.detail: i.bytes for i in ddp.items}["DDP gradient buckets"] == 32000


def test_zero3_offload_moves_states_and_weights_to_host():
    params = [fact((8000,), "bfloat16")]
    mem = per_device(params, PROFILE, Layout(strategy="deepspeed", shard_ranks=4, zero_stage=3,
                                             offload_optimizer=True, offload_params=True, master_weights=True))
    kinds = {(i.kind, i.detail): i.bytes for i in mem.items}
    assert kinds["weights", "bfloat16"] == 0 and kinds["optimizer", "AdamW (torch)"] == 0
    assert kinds["gradients", "bfloat16"] == 2 * 8000 // 4  # ZeRO-2/3 shard gradients
    assert mem.offloaded == (2 * 4 * 8000 + 4) // 4 + 4 * 8000 // 4 + 2 * 8000 // 4  # fp32 moments of the master


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_mixed_precision_adam_is_16_bytes_per_parameter(stage):
    """bf16 weights (2) + bf16 gradients (2) + fp32 master (4) + two fp32 Adam moments (8), as DeepSpeed counts;
    the moments were counted at the weights' 2 bytes (12 B/param)."""
    params = [fact((8000,), "bfloat16")]
    mem = per_device(params, PROFILE, Layout(strategy="deepspeed", shard_ranks=1, zero_stage=stage,
                                             master_weights=True))
    kinds = {(i.kind, i.detail): i.bytes for i in mem.items}
    per_param = (kinds["weights", "bfloat16"] + kinds["gradients", "bfloat16"] + kinds["optimizer", "AdamW (torch)"]
                 - 4 + kinds["optimizer", "fp32 master weights"]) / 8000  # less torch's 4-byte step tensor
    assert per_param == 16


def test_qlora_probe_equals_a_real_4bit_forward_on_cpu(tiny_model_dir):
    """bitsandbytes' 4-bit matmul keeps only its weight for backward: the probe's stand-in Linear must
    agree with the real quantized model (k-bit preparation included), byte for byte."""
    pytest.importorskip("bitsandbytes")
    import torch
    from transformers import AutoModelForCausalLM

    from ftune.methods import method_module
    from ftune.estimate.estimate import _apply_method, _quantize_layout
    from ftune.models.meta import _build, resolve_config
    from ftune.estimate.probe import probe_activations
    from ftune.plan.quantization import bnb_config, upcasts
    from ftune.worker import quantize

    r = Recipe.model_validate({
        "name": "t", "model": {"path": str(tiny_model_dir), "dtype": "float32"},
        "data": {"train": [{"path": "d.jsonl"}], "max_seq_length": SEQ},
        "peft": METHODS["lora"], "quantization": {"bits": 4, "compute_dtype": "float32"},
    })
    meta, _, _ = _build(r, resolve_config(r)[0])
    assert len(_quantize_layout(meta, r)) == 2 * 7  # every linear of the 2 layers, not the head
    meta = _apply_method(meta, r).to("meta")
    profile = probe_activations(meta, batch=BATCH, seq=SEQ, attn_implementation="sdpa",
                                layer_classes={"LlamaDecoderLayer"}, quantized=set())

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, quantization_config=bnb_config(r.quantization),
                                                 dtype=torch.float32, attn_implementation="sdpa")
    model = method_module("lora").inject(quantize.prepare(model, upcast=upcasts(r), checkpointing=False), r.peft, "causal-lm")
    assert profile.saved(False) == forward_saved_bytes(model)


def test_galore_keeps_projected_moments_and_layerwise_one_gradient():
    """GaLore (rank r) keeps its Adam moments on the projected gradient, r x max(m, n) each, plus an r x min(m, n)
    projector; untargeted tensors keep full moments. Layer-wise, each parameter is updated in its own backward
    hook: one gradient at a time. It was planned as plain AdamW (59.8 GiB for an 8B GaLore run of about 16 GB)."""
    params = [ParamFact("model.layers.0.mlp.up_proj.weight", (4096, 1024), "bfloat16", 2, True),
              ParamFact("model.layers.0.self_attn.q_proj.weight", (1024, 1024), "bfloat16", 2, True),
              ParamFact("model.norm.weight", (1024,), "bfloat16", 2, True)]
    galore = Layout(optimizer="galore_adamw", low_rank=(128, ("mlp",)))
    mem = per_device(params, PROFILE, galore)
    opt = {i.kind: i.bytes for i in mem.items}["optimizer"]
    assert opt == 2 * 128 * 4096 * 2 + 128 * 1024 * 2 + 2 * (1024 * 1024 + 1024) * 2
    adamw = {i.kind: i.bytes for i in per_device(params, PROFILE, Layout(optimizer="adamw_torch")).items}["optimizer"]
    assert opt < adamw
    layerwise = per_device(params, PROFILE, Layout(optimizer="galore_adamw_layerwise", low_rank=(128, ("mlp",))))
    grads = sum(i.bytes for i in layerwise.items if i.kind == "gradients")
    assert grads == 4096 * 1024 * 2  # the largest parameter's gradient only
    every = per_device(params, PROFILE, Layout(optimizer="galore_adamw", low_rank=(64, "all-linear")))
    assert {i.kind: i.bytes for i in every.items}["optimizer"] == (2 * 64 * 4096 * 2 + 64 * 1024 * 2
                                                                   + 2 * 64 * 1024 * 2 + 64 * 1024 * 2 + 2 * 1024 * 2)


def test_cuda_plan_counts_two_cublas_workspaces_and_cpu_none(tiny_model_dir, monkeypatch):
    """Measured on an H200 (torch 2.11): a tiny model's CUDA peak was ~61 MiB over its tensors, cuBLAS's two
    handles (forward thread, autograd's backward thread) at 32 MiB each; CUBLAS_WORKSPACE_CONFIG resizes them."""
    from ftune.estimate.memory import cublas_workspace

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    r = recipe(tiny_model_dir, METHODS["lora"])
    cpu = estimate(r, world_size=1, num_processes=1, gpu_memory=None, device="cpu")
    cuda = estimate(r, world_size=1, num_processes=1, gpu_memory=80 * 1024**3, device="cuda")
    workspaces = [i for i in cuda.memory if "cuBLAS" in i.detail]
    assert [i.bytes for i in workspaces] == [2 * 32 * 1024**2]
    assert not [i for i in cpu.memory if "cuBLAS" in i.detail]
    assert cuda.total_bytes == cpu.total_bytes + 2 * 32 * 1024**2
    assert cublas_workspace(":4096:2:16:8") == 4096 * 1024 * 2 + 16 * 1024 * 8
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    assert cublas_workspace() == 32 * 1024**2
