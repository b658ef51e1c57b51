"""The SIGTERM stop agrees on the step over a host group: under NCCL a gloo group beside it (forced here by
reporting the default group as nccl in a one-process gloo world), the default group when it is gloo already; the
flag is a host tensor either way, so no step waits for the GPU to read it."""

from __future__ import annotations

import os
import socket
from types import SimpleNamespace

import pytest


@pytest.fixture
def one_process_world():
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield dist
    dist.destroy_process_group()


def _stop_callback(tmp_path):
    from ftune.rundir import RunDir
    from ftune.worker.callbacks import make_callbacks

    plan = SimpleNamespace(run=RunDir(tmp_path), recipe=SimpleNamespace(output=SimpleNamespace(report=False),
                                                                           peft=SimpleNamespace(uses_peft_library=True)))
    return next(c for c in make_callbacks(plan) if type(c).__name__ == "StopOnSignal")


@pytest.mark.parametrize("backend, own_group", [("nccl", True), ("gloo", False), ("cuda:nccl,cpu:gloo", False)])
def test_the_stop_flag_is_reduced_on_the_host(one_process_world, monkeypatch, tmp_path, backend, own_group):
    import torch
    from transformers import TrainerControl

    from ftune.worker.stop import STOP

    dist = one_process_world
    monkeypatch.setattr(dist, "get_backend", lambda group=None: backend)
    reduced = []
    real = dist.all_reduce

    def spy(tensor, op=None, group=None, **kw):
        reduced.append((tensor.device.type, group))
        return real(tensor, op=op, group=group, **kw)

    monkeypatch.setattr(dist, "all_reduce", spy)
    callback = _stop_callback(tmp_path)
    args = SimpleNamespace(world_size=2, device=torch.device("cpu"))  # the callback reads the world from args
    callback.on_train_begin(args, None, TrainerControl())
    assert (callback.group is not None) == own_group
    control = TrainerControl()
    callback.on_step_end(args, None, control)
    assert not control.should_training_stop
    monkeypatch.setattr(STOP, "signum", 15)
    callback.on_step_end(args, None, control)
    assert control.should_training_stop and control.should_save
    assert reduced == [("cpu", callback.group)] * 2  # a host tensor, over the host group


def test_one_process_makes_no_group(tmp_path):
    from transformers import TrainerControl

    callback = _stop_callback(tmp_path)
    callback.on_train_begin(SimpleNamespace(world_size=1), None, TrainerControl())
    assert callback.group is None
