"""The embedded demo: an offline fine-tuning run that visibly learns (`make demo` / `python -m ftune.demo`).

Stage A pretrains a tiny Llama from scratch on a corpus this project writes; stage B LoRA-fine-tunes
it on `x + 1` / `x - 1` questions about numbers it never trains on; stage B2 continues that adapter with GRPO
and the `numeric` reward on the training questions. Every stage goes through
`ftune run recipes/demo/<stage>.yaml`; the demo then measures eval loss and generation accuracy
before and after, and B2's reward curve. Modules: `tasks` (seeded data), `assets` (files, tokenizer, model), `evaluate`
(figures), `__main__` (the driver).
"""
