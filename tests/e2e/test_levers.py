"""Speed levers on real runs through `ftune run`: torch.compile and activation offloading train the same model
(loss curves match the plain run), on CPU."""

from __future__ import annotations

import pytest

from tests.e2e._util import base_recipe, ftune, losses, write_recipe

pytestmark = pytest.mark.slow

LEVERS = {
    "plain": {},
    # aot_eager: dynamo + AOT autograd without inductor's C++ codegen (the default inductor costs ~40 s to start
    # here); both levers in one run to keep the suite short: either one changing the numbers fails the test
    "levers": {"compile": True, "compile_backend": "aot_eager", "activation_offloading": True},
}


@pytest.mark.extended  # about 90 s on 2 cores (torch.compile on CPU): make test-all
def test_compile_and_activation_offloading_match_the_plain_run(tmp_path, tiny_model_dir, text_data_file):
    curves = {}
    for name, train in LEVERS.items():
        r = base_recipe(tiny_model_dir, text_data_file, name=f"lever-{name}",
                        train={"max_steps": 10, "logging_steps": 2, **train},
                        eval={"strategy": "no"}, checkpoint={"strategy": "no"},
                        output={"dir": str(tmp_path / name), "report_to": ["none"], "loss_curve": False})
        r["data"].pop("eval")
        res = ftune("run", str(write_recipe(tmp_path, r, f"{name}.yaml")), cwd=tmp_path)
        assert res.code == 0, res.text[-2000:]
        curves[name] = losses(tmp_path / name)
    assert len(curves["plain"]) == 6 and curves["plain"][-1] < curves["plain"][0]
    # offloading moves saved tensors to host memory and back (the same numbers); a compiled graph may reorder
    # float ops: equal within float32 tolerance
    assert curves["levers"] == pytest.approx(curves["plain"], rel=1e-4)
