from transformers import TrainerCallback


def make_step_log(args):
    class StepLog(TrainerCallback):
        """Appends the step number every `every` steps to `file` (relative to the working directory)."""

        def on_step_end(self, targs, state, control, **kwargs):
            if state.is_world_process_zero and state.global_step % args.every == 0:
                with open(args.file, "a") as f:
                    f.write(f"{state.global_step}\n")

    return StepLog()
