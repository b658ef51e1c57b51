"""N-D parallelism (`distributed.parallelism`): decided and checked here, once, before launch.

The recipe's four sizes become `Plan.parallelism`; the worker turns it into transformers'
`DistributedConfig(tp_size=...)` when loading (tensor parallelism shards the weights at load time, by the
model's `base_model_tp_plan`) and accelerate's `ParallelismConfig` for the Trainer (`ftune.worker.parallel`).

What accelerate 1.15, transformers 5.23 and torch 2.13 support, as measured (docs/distributed.md#n-d-parallelism):
- tp (strategy ddp: accelerate keeps a tensor-parallel model out of DDP), alone or with dp_shard (transformers'
  own FSDP2 at load, `DistributedConfig(tp_size, fsdp_size)`), trains on CPU over gloo (DTensor), with the losses
  of one process (tp 2 on 2 processes; tp 2 x dp_shard 2 on 4);
- dp_shard / dp_replicate without tp are FSDP2 / HSDP over accelerate's device mesh (strategy fsdp, version 2);
- cp needs CUDA: torch's ring attention has no sharding rule for the CPU SDPA kernel
  (`aten._scaled_dot_product_flash_attention_for_cpu`), and the Trainer accepts only `sdpa` with it;
- a model sharded at load time can't checkpoint its optimizer state (transformers refuses to resume it).
Each combination that can't work is a located problem with the reason. Light module: no torch.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from ftune.errors import Problem
from ftune.recipe.schema import Recipe

WHERE = "distributed.parallelism"
CPU_SDPA = "aten._scaled_dot_product_flash_attention_for_cpu"


class Parallel(BaseModel):
    """The job's N-D layout, recorded in plan.json as `parallelism`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    cp: int = 1

    @property
    def dp(self) -> int:
        """Ranks that each see their own batch (the others of a tp x cp group see the same one)."""
        return self.dp_replicate * self.dp_shard

    @property
    def total(self) -> int:
        return self.dp_replicate * self.dp_shard * self.tp * self.cp

    def load_kwargs(self) -> dict[str, int] | None:
        """transformers' `DistributedConfig(**...)` when the model is sharded at load (tp; dp_shard is then
        transformers' own FSDP2 of the loaded model), else None."""
        return {"tp_size": self.tp, "fsdp_size": self.dp_shard} if self.tp > 1 else None

    def accelerate_kwargs(self) -> dict[str, int]:
        """accelerate's `ParallelismConfig(**...)`."""
        return {"dp_replicate_size": self.dp_replicate, "dp_shard_size": self.dp_shard, "tp_size": self.tp,
                "cp_size": self.cp}


def decide(recipe: Recipe) -> Parallel | None:
    p = recipe.distributed.parallelism
    if p is None:
        return None
    return Parallel(dp_replicate=p.dp_replicate, dp_shard=p.dp_shard, tp=p.tp, cp=p.cp)


def data_parallel(recipe: Recipe, world_size: int) -> int:
    """Ranks with their own batch: the world divided by the tp x cp groups that share one."""
    p = decide(recipe)
    return world_size if p is None else max(world_size // (p.tp * p.cp), 1)


def problems(recipe: Recipe, device: str | None, world_size: int | None) -> list[Problem]:
    """Every problem of the layout against the strategy, the world, the device and the other recipe keys. A world
    or device not known yet (`None`: `validate`, `launch-script` without a GPU count) skips the checks that read it:
    the recipe tier of `ftune.plan.checks`."""
    p = decide(recipe)
    if p is None:
        return []
    d = recipe.distributed
    found: list[Problem] = []
    sizes = f"dp_replicate {p.dp_replicate} x dp_shard {p.dp_shard} x tp {p.tp} x cp {p.cp} = {p.total}"
    if world_size is not None and p.total != world_size:
        found.append(Problem.at(WHERE, f"{sizes}, but the job has {world_size} process(es) (num_processes "
                                f"{world_size // d.num_machines} x num_machines {d.num_machines})",
                                "make the sizes multiply to num_processes x num_machines"))
    fsdp2 = d.strategy == "fsdp" and (d.fsdp is None or d.fsdp.version == 2)
    model_parallel = p.tp > 1 or p.cp > 1
    if d.strategy == "deepspeed" and p.total > 1:
        found.append(Problem.at("distributed.strategy", "distributed.parallelism with DeepSpeed: accelerate's "
                                "ParallelismConfig composes tp/cp/dp_shard with FSDP2 only (DeepSpeed's own "
                                "tensor parallelism is configured in its JSON)",
                                "use `distributed.strategy: fsdp` (version 2), or drop distributed.parallelism"))
    elif d.strategy == "fsdp" and not fsdp2 and p.total > 1:
        found.append(Problem.at("distributed.fsdp.version", "distributed.parallelism needs FSDP version 2 (the "
                                "device mesh of fully_shard); FSDP version 1 has none", "set distributed.fsdp.version: 2"))
    if p.dp_replicate > 1 and p.dp_shard == 1 and model_parallel:
        found.append(Problem.at(f"{WHERE}.dp_replicate", "tp/cp with pure data-parallel replicas (dp_shard 1) is not "
                                "supported by accelerate 1.15 (DDP + TP/CP)", "shard instead: set dp_shard to the "
                                "replicas and dp_replicate: 1 (FSDP2 + TP/CP), or dp_shard > 1 for HSDP + TP/CP"))
    if p.tp > 1 and (p.dp_replicate > 1 or p.cp > 1):
        key = "dp_replicate" if p.dp_replicate > 1 else "cp"
        found.append(Problem.at(f"{WHERE}.{key}", f"tp with {key} > 1 is refused: ftune has verified tp alone and tp "
                                "x dp_shard, not tp with replicas or context parallelism",
                                "use tp x dp_shard (= the world), or drop tp"))
    if p.tp > 1 and d.strategy not in ("ddp", "deepspeed"):
        found.append(Problem.at("distributed.strategy", "tp: distributed.strategy must be ddp, not "
                                f"{d.strategy}: transformers shards the model at load (tp, and dp_shard with its own "
                                "FSDP2), and accelerate must leave it as loaded (it keeps a tensor-parallel model "
                                "out of DDP)", "set `distributed.strategy: ddp`"))
    elif p.tp == 1 and (p.dp_shard > 1 or p.cp > 1) and d.strategy not in ("fsdp", "deepspeed"):
        what = "dp_shard shards parameters" if p.dp_shard > 1 else "cp splits sequences over FSDP2's mesh"
        found.append(Problem.at("distributed.strategy", f"{what}: it needs distributed.strategy fsdp (version 2), "
                                f"not {d.strategy}", "set `distributed.strategy: fsdp`"))
    elif fsdp2 and p.tp == 1 and p.dp_shard == 1 and p.cp == 1 and p.total > 1:
        found.append(Problem.at(f"{WHERE}.dp_shard", "FSDP2 shards over dp_shard (x cp), and both are 1: accelerate "
                                "1.15 refuses a layout with nothing to shard over", "set dp_shard (to the world "
                                "divided by dp_replicate), or use `distributed.strategy: ddp` for plain replicas"))
    if p.tp > 1:
        found += _tp_problems(recipe)
    if p.cp > 1:
        found += _cp_problems(recipe, p, device)
    return found


def _tp_problems(recipe: Recipe) -> list[Problem]:
    found: list[Problem] = []
    if recipe.checkpoint.strategy != "no":
        found.append(Problem.at("checkpoint.strategy", "tensor parallelism shards the model at load time, and "
                                "transformers 5.23 can't checkpoint or resume such a model's optimizer state",
                                "set `checkpoint.strategy: no` (final/ is still saved, gathered)"))
    if recipe.kbit is not None:
        found.append(Problem.at("quantization", "tensor parallelism splits full-precision weights: a quantized "
                                "(bitsandbytes) model can't be sharded by its tp_plan", "drop quantization, or tp"))
    if not recipe.peft.trains_whole_model:
        found.append(Problem.at("peft.method", f"{recipe.peft.method} with tensor parallelism: peft 0.21 wraps the "
                                "split (DTensor) layers without a plan for the adapter; measured with LoRA and tp 2 "
                                "on CPU: the losses drift from one process's and saving final/ fails",
                                "use `peft.method: full` with tp, or FSDP (dp_shard) for adapters"))
    return found


def _cp_problems(recipe: Recipe, p: Parallel, device: str) -> list[Problem]:
    found: list[Problem] = []
    if device == "cpu":  # None: not known yet
        found.append(Problem.at(f"{WHERE}.cp", f"context parallelism needs CUDA: torch 2.13's ring attention has no "
                                f"sharding rule for the CPU attention kernel ({CPU_SDPA}), measured",
                                "run it on GPUs (tests/gpu), or set cp: 1 on CPU"))
    attn = recipe.model.attn_implementation
    if attn is not None and attn != "sdpa":
        found.append(Problem.at("model.attn_implementation", f"context parallelism with {attn} attention: "
                                "transformers 5.23's Trainer splits sequences only through SDPA",
                                "set `model.attn_implementation: sdpa` (or leave it out: ftune picks sdpa)"))
    length = recipe.data.max_seq_length
    if length is None or length % (2 * p.cp):
        found.append(Problem.at("data.max_seq_length", f"context parallelism over {p.cp} ranks splits each sequence "
                                f"into 2 x {p.cp} = {2 * p.cp} load-balanced chunks; max_seq_length {length} is not "
                                "a multiple of it", f"set data.max_seq_length to a multiple of {2 * p.cp}"))
    return found


def model_problems(recipe: Recipe, config) -> list[Problem]:
    """The model's config against tp: a tensor-parallel plan, and heads / kv-heads / MLP width divisible by tp."""
    p = decide(recipe)
    if p is None or p.tp == 1:
        return []
    plan = getattr(config, "base_model_tp_plan", None)
    name = getattr(config, "model_type", "this model")
    if not plan:
        return [Problem.at(f"{WHERE}.tp", f"{name} has no tensor-parallel plan (its config's base_model_tp_plan is "
                           "empty), so transformers can't split its layers", "use a model whose architecture "
                           "ships a tp_plan (Llama, Qwen2/3, Mistral, Gemma...), or FSDP (dp_shard) instead")]
    found = []
    for attr in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        n = getattr(config, attr, None)
        if isinstance(n, int) and n % p.tp:
            found.append(Problem.at(f"{WHERE}.tp", f"tp {p.tp} does not divide the model's {attr} ({n}): each rank "
                                    "must hold whole heads / an equal slice", f"pick a tp that divides {n}"))
    return found


def notes(p: Parallel | None, world_size: int) -> list[str]:
    if p is None or p.total == 1:
        return []
    out = [f"parallelism: {world_size} processes = dp_replicate {p.dp_replicate} x dp_shard {p.dp_shard} x tp "
           f"{p.tp} x cp {p.cp}; {p.dp} data-parallel rank(s) each read their own batch"]
    if p.tp > 1:
        out.append(f"tp {p.tp}: weights split at load by the model's tp_plan (DTensor); checkpoints off, final/ "
                   "gathered")
    return out
