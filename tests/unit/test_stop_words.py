"""What a SIGTERM'd worker says: before training, at a step with its checkpoint, at a step without one."""

from ftune.errors import EXIT_TERMINATED
from ftune.worker.stop import terminated_error


def test_before_training_nothing_was_trained():
    err = terminated_error(None, None)
    assert err.exit_code == EXIT_TERMINATED
    assert err.message == "stopped by SIGTERM before training started; nothing was trained"


def test_at_a_step_with_its_checkpoint_names_it():
    err = terminated_error(8, "/runs/x/checkpoints/checkpoint-8")
    assert err.message == "stopped by SIGTERM at step 8; saved a complete checkpoint: /runs/x/checkpoints/checkpoint-8"
    assert "resume" in err.hint


def test_at_a_step_whose_checkpoint_did_not_complete_never_says_before_training():
    err = terminated_error(5, None)
    assert err.message == "stopped by SIGTERM at step 5; no complete checkpoint of this step was saved"
    assert "before training" not in err.message
    assert "last complete checkpoint" in err.hint
