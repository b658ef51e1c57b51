"""Library noise off: ftune prints its own progress, and advisory warnings and progress bars that carry nothing
for the user (datasets' map bars, transformers' weight-loading bar, FutureWarnings about its own internals)
would drown it. `--verbose` (FTUNE_VERBOSE=1, which the workers inherit) leaves them all on."""

from __future__ import annotations

import functools
import os
from contextlib import contextmanager

VERBOSE_ENV = "FTUNE_VERBOSE"


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV) == "1"


def quiet_bitsandbytes() -> None:
    """bitsandbytes logs, when it is imported on a CPU with AVX512-BF16, that an optional kernels package is missing
    ("Failed to load CPU gemm_4bit_forward from kernels-community"): harmless, and it tells the user nothing. Every
    command sets this first (`ftune.cli.main`), whatever imports bitsandbytes later (plan's 4-bit estimate, TRL)."""
    import logging

    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    quiet_torchao()


def quiet_torchao() -> None:
    """torchao (`quantization.qat`; transformers imports it when installed) logs the GPU extensions a CPU build
    lacks ("Failed to load .../_C_cutlass_90a.abi3.so"), and torch's pytree logs a deprecation for its enums:
    harmless, and nothing the user can act on."""
    import logging

    logging.getLogger("torchao").setLevel(logging.ERROR)
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)


def quiet_libraries() -> None:
    import warnings

    quiet_bitsandbytes()
    if verbose():
        return
    import datasets
    from transformers.utils import logging as hf_logging

    datasets.disable_progress_bars()
    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*use_reentrant.*")
    warnings.filterwarnings("ignore", message=".*importing from 'trl.experimental'.*")  # orpo/simpo: pinned trl


@contextmanager
def no_bars(module):
    """A library module that draws its bars with plain tqdm, which `quiet_libraries` can't reach (transformers'
    GGUF loader: "Converting and de-quantizing GGUF tensors..."), silenced for the block unless --verbose."""
    original = getattr(module, "tqdm", None)
    if verbose() or original is None:
        yield
        return
    module.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        module.tqdm = original
