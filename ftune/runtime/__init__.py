"""What a process holding the model does, on either side of training: the model loaded as the Plan says
(`model`), the Trainer or TRL trainer built for the Plan (`train`, `rl`, with their guards and `precision`), a
saved folder's tensors read back (`saved`) and a quantized base guarded and reloaded (`quantized`).

Below both the worker (the run) and `infer` (eval, merge, generate, chat): it imports neither, nor cli or launch
(tests/unit/test_import_graph.py). What only the run does (its callbacks, the process group, final/'s save and
verification, stop handling, the stage driver) stays in `ftune/worker/`.
"""
