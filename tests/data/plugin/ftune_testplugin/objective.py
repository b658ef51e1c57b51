"""An objective in the sft family: transformers' TrainingArguments, and a Trainer that counts its loss calls into
`objective.log` (relative to the working directory), so a test sees that the run trained with this trainer."""

from transformers import Trainer, TrainingArguments

__all__ = ["CountingTrainer", "TrainingArguments"]


class CountingTrainer(Trainer):
    def compute_loss(self, model, inputs, *args, **kwargs):
        if model.training and self.is_world_process_zero():
            with open("objective.log", "a") as f:
                f.write("loss\n")
        return super().compute_loss(model, inputs, *args, **kwargs)
