"""Worker stages, run in order by `ftune.launch.worker`: tokenizer → data → model → peft → distributed →
train → save. Each is a plain function of the Plan (and what earlier stages returned); heavy libraries
are imported inside the functions."""
