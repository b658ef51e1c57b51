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


def quiet_libraries() -> None:
    import logging
    import warnings

    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)  # optional CPU kernels package missing: harmless
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
