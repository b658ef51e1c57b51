"""Library noise off: ftune prints its own progress, and advisory warnings and progress bars that carry nothing
for the user (datasets' map bars, transformers' weight-loading bar, FutureWarnings about its own internals)
would drown it. `--verbose` (FTUNE_VERBOSE=1, which the workers inherit) leaves them all on."""

from __future__ import annotations

import os

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
