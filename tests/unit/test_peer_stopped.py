"""A collective that fails because a peer rank stopped becomes a clear error naming the rank and its host
(ftune.worker.distributed.peer_stopped); other errors pass through unchanged."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ftune.worker import distributed


def _plan(world: int, timeout: int | None = 30):
    return SimpleNamespace(world_size=world,
                           recipe=SimpleNamespace(distributed=SimpleNamespace(timeout=timeout)))


@pytest.fixture
def hosts(monkeypatch):
    monkeypatch.setattr(distributed, "_HOSTS", ["gpu-a1", "gpu-b7", "gpu-b7", "gpu-c2"])
    monkeypatch.setenv("RANK", "0")


def test_the_other_rank_of_two_is_named(hosts):
    err = RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error [10.0.0.7]:3775: Connection reset by peer")
    found = distributed.peer_stopped(err, _plan(2))
    assert found.message.startswith("rank 1 on host gpu-b7 stopped; rank 0 can't go on without it")
    assert found.exit_code == 3 and "resume from the last one" in found.hint


def test_a_silent_peer_is_named_with_the_timeout(hosts):
    err = type("DistBackendError", (RuntimeError,), {})("[gloo] Timed out waiting 30000ms for recv operation")
    found = distributed.peer_stopped(err, _plan(2, timeout=30))
    assert found.message.startswith("rank 1 on host gpu-b7 did not answer within distributed.timeout (30 s)")


def test_in_a_bigger_world_the_candidates_are_listed(hosts):
    found = distributed.peer_stopped(RuntimeError("Connection closed by peer [10.0.0.9]:4000"), _plan(4))
    assert "one of rank 1 on host gpu-b7, rank 2 on host gpu-b7, rank 3 on host gpu-c2 stopped" in found.message


@pytest.mark.parametrize("err", [RuntimeError("CUDA out of memory"), ValueError("Connection closed by peer"),
                                 KeyError("timeout")])
def test_other_errors_pass_through(hosts, err):
    assert distributed.peer_stopped(err, _plan(2)) is None


def test_one_process_has_no_peer(hosts):
    assert distributed.peer_stopped(RuntimeError("Connection closed by peer"), _plan(1)) is None
