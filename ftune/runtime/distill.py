"""The distill family's trainer: TRL's GKD trainer (`plan.trainer_class`) on the student ftune loaded and adapted,
with the teacher the Plan names (`plan.teacher`) loaded frozen. TRL computes the divergence; ftune brings the rows
(tokenized, prompt masked, unpacked) and a collator that also hands GKD each row's prompt, left-padded, for the
completions the student (or teacher) samples."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

IGNORE = -100


def load_teacher(plan, token=None):
    """The teacher, as `plan.teacher` says: whole, in eval mode, no parameter trained."""
    import transformers

    spec = plan.teacher
    teacher = getattr(transformers, spec.auto_class).from_pretrained(spec.path, token=token, **spec.kwargs)
    teacher.eval()
    teacher.requires_grad_(False)
    return teacher


@dataclass
class PromptCollator:
    """The padded batch of `collate` (input_ids, labels, attention_mask) plus GKD's `prompts` and
    `prompt_attention_mask`: each row's tokens before its first trained label, left-padded, so generation starts
    where the completion does."""

    collate: Any
    pad_token_id: int

    def __call__(self, features: list[dict]) -> dict:
        import torch

        batch = self.collate(features)
        prompts = []
        for f in features:
            labels = list(f["labels"])
            start = next((i for i, v in enumerate(labels) if v != IGNORE), len(labels))
            prompts.append(list(f["input_ids"][:start]))
        width = max(1, max(len(p) for p in prompts))
        batch["prompts"] = torch.tensor([[self.pad_token_id] * (width - len(p)) + p for p in prompts],
                                        dtype=torch.long)
        batch["prompt_attention_mask"] = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts],
                                                      dtype=torch.long)
        return batch


def build_trainer(plan, trainer_class, model, tokenizer, bundle, args, callbacks: list, ref_model=None):
    """GKDTrainer(student, teacher) for the Plan: TRL's loss, ftune's rows, collator, callbacks and progress."""
    from transformers import PrinterCallback

    teacher = load_teacher(plan, plan.secret("model.hub_token"))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    trainer = trainer_class(
        model=model,
        teacher_model=teacher,
        args=args,
        data_collator=PromptCollator(bundle.collator, pad),
        train_dataset=bundle.train,
        eval_dataset=bundle.eval,
        processing_class=tokenizer,
        callbacks=list(callbacks),
    )
    trainer.remove_callback(PrinterCallback)
    return trainer
