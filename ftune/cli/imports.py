"""Start-up time of the commands that plan: keep heavy libraries they never use out of the `ftune` process."""

from __future__ import annotations

import sys


def block_bitsandbytes(recipe=None) -> bool:
    """Keep peft/transformers from importing bitsandbytes in this `ftune` process (it pulls in torch._inductor:
    about 2 s of CPU per `ftune run` measured, a quarter of the parent's start-up). The parent plans and checks,
    it never quantizes; the worker decides for itself from `plan.uses_bitsandbytes`. A `recipe` that quantizes
    with bitsandbytes keeps it: its checks look for the package.

    Only in the `ftune` process itself, before peft is imported: peft decides once, at import, whether
    bitsandbytes exists, so doing this in a process that trains later (a test session) would break it.
    Returns whether it blocked.
    """
    if recipe is not None:
        from ftune.plan.quantization import needs_bitsandbytes

        if needs_bitsandbytes(recipe):
            return False
    own_process = sys.argv[0].endswith(("/ftune", "ftune/cli/main.py"))
    if own_process and "peft" not in sys.modules and "bitsandbytes" not in sys.modules:
        sys.modules["bitsandbytes"] = None  # type: ignore[assignment]  # find_spec -> None: treated as absent
        return True
    return False
