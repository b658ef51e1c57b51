"""A plugin package the test suite puts on PYTHONPATH (a dist-info folder makes it "installed"): one callback,
one data format, one PEFT method and one objective (in the sft family), registered for ftune by name. Light:
nothing heavy at import."""

from pydantic import BaseModel, ConfigDict, Field

from ftune.plugins import CallbackPlugin, FormatPlugin, Plugin
from ftune.recipe.objectives import Objective


class StepLogArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    every: int = Field(gt=0)
    file: str = "steps.log"


PLUGIN = Plugin(
    callbacks={"step-log": CallbackPlugin("ftune_testplugin.callbacks:make_step_log", args=StepLogArgs)},
    methods={"embed-only": "ftune_testplugin.embed_only"},
    formats={"qa": FormatPlugin(fields=("question", "answer"), encode="ftune_testplugin.qa:encode")},
    objectives={"counted-sft": Objective("counted-sft", "ftune_testplugin.objective", "TrainingArguments",
                                         "CountingTrainer", None, (), family="sft")},
)
