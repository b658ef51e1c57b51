"""The embedded demo: an offline fine-tuning run that visibly learns (`make demo` / `python -m ftune.demo`).

Stage A pretrains a tiny Llama from scratch on a corpus this project writes; stage B LoRA-fine-tunes
it on `x + 1` / `x - 1` questions about numbers it never trains on. Both stages go through
`ftune run recipes/demo/<stage>.yaml`; the demo then measures eval loss and generation accuracy
before and after. Modules: `tasks` (seeded data), `assets` (files, tokenizer, model), `evaluate`
(figures), `__main__` (the driver).
"""
