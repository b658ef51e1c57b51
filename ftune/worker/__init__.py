"""The worker side: `accelerate launch ... -m ftune.worker <run>/plan.json` runs the stages in order
(tokenizer → data → model → peft → distributed → train → save), each a plain function of the Plan.
Heavy libraries are imported inside functions. Nothing on the parent side (`ftune.launch`) imports this package."""
