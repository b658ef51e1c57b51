"""The compiler and its decisions: a validated recipe -> the frozen Plan (`plan.py`), by `compile.py`.

The modules here decide (trainer arguments, model loading, batching, accelerate, quantization, threads, the cluster's
shape, parallelism, a continued adapter, a GGUF's converted folder); `checks/` holds the table of pre-launch checks
by tier and the checks on files, this machine and the meta-device model that the compiler runs beside them."""
