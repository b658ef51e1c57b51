"""Every command silences bitsandbytes' optional-kernel notice before anything imports it (it prints "Failed to load
CPU gemm_4bit_forward from kernels-community" on CPUs with AVX512-BF16 only: the logger's level is what is checked,
so the test means the same on every CPU)."""

from __future__ import annotations

import logging

from ftune.cli.main import main


def test_every_command_sets_bitsandbytes_to_errors_only(capsys, monkeypatch):
    monkeypatch.chdir(__import__('pathlib').Path(__file__).resolve().parents[2])
    logger = logging.getLogger("bitsandbytes")
    logger.setLevel(logging.NOTSET)
    assert main(["validate", "recipes/"]) in (0, 1)
    capsys.readouterr()
    assert logger.level == logging.ERROR
    logger.warning("Failed to load CPU gemm_4bit_forward from kernels-community")  # what bitsandbytes logs
    logging.getLogger("bitsandbytes.backends.cpu.ops").warning("child logger too")
    assert capsys.readouterr().err == ""
