"""The wheels a lent GPU window carries (bench/gpu_wheels.py) and the one command it runs (bench/gpu_window.sh):
the pins are the versions ftune's ranges allow, bitsandbytes' wheel slims to the CUDA 13 libraries and still
installs, and the window's script is valid shell that runs the suite into $OUT. The download itself needs a package
index: `make gpu-wheels` (measured: 17 wheels, 33.1 MiB, within a call's 64 MiB with the repository)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def module():
    spec = importlib.util.spec_from_file_location("gpu_wheels", REPO / "bench" / "gpu_wheels.py")
    found = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(found)
    return found


def test_the_pins_are_within_ftunes_ranges():
    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    ranges = {}
    for line in project["dependencies"] + [d for extra in project["optional-dependencies"].values() for d in extra]:
        if not line.startswith("ftune"):
            req = Requirement(line)
            ranges.setdefault(req.name.lower().replace("_", "-"), []).append(req.specifier)
    pins = {p.split("==")[0].lower().replace("_", "-"): p.split("==")[1] for p in module().PINS}
    for name in ("transformers", "peft", "datasets", "trl", "bitsandbytes", "liger-kernel", "torchao", "pydantic",
                 "omegaconf"):
        assert all(spec.contains(pins[name]) for spec in ranges[name]), (name, pins[name], ranges[name])


def fake_wheel(folder: Path) -> Path:
    """A bitsandbytes-shaped wheel: the package, one library per CUDA release and platform, and its RECORD."""
    wheel = folder / "bitsandbytes-0.50.2-py3-none-manylinux_2_24_x86_64.whl"
    libs = ["cpu", "cuda118", "cuda128", "cuda130", "cuda132", "rocm72", "xpu2025"]
    files = {"bitsandbytes/__init__.py": "__version__ = '0.50.2'\n",
             **{f"bitsandbytes/libbitsandbytes_{lib}.so": "x" * 1000 for lib in libs},
             "bitsandbytes-0.50.2.dist-info/METADATA": "Metadata-Version: 2.1\nName: bitsandbytes\nVersion: 0.50.2\n",
             "bitsandbytes-0.50.2.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                    "Tag: py3-none-any\n"}
    record = "".join(f"{name},,\n" for name in files) + "bitsandbytes-0.50.2.dist-info/RECORD,,\n"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in {**files, "bitsandbytes-0.50.2.dist-info/RECORD": record}.items():
            z.writestr(name, text)
    return wheel


def test_bitsandbytes_slims_to_the_cuda_13_libraries_and_installs(tmp_path):
    wheel = module().slim(fake_wheel(tmp_path))
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        record = z.read("bitsandbytes-0.50.2.dist-info/RECORD").decode()
    libs = sorted(n.rsplit("_", 1)[1] for n in names if n.endswith(".so"))
    assert libs == ["cpu.so", "cuda130.so", "cuda132.so"]  # the CPU one stays: not a GPU library
    assert "cuda128" not in record and "cuda130" in record and "rocm" not in record
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--target", str(target), str(wheel)], check=True)
    assert sorted(p.name for p in (target / "bitsandbytes").glob("*.so")) == [
        "libbitsandbytes_cpu.so", "libbitsandbytes_cuda130.so", "libbitsandbytes_cuda132.so"]


def test_the_window_script_installs_the_carried_wheels_and_runs_the_suite_into_out():
    script = (REPO / "bench" / "gpu_window.sh").read_text()
    assert subprocess.run(["bash", "-n", str(REPO / "bench" / "gpu_window.sh")]).returncode == 0
    assert "--no-index --no-deps" in script and "--target /tmp/site .whl/*.whl" in script
    assert 'bench/gpu_suite.py --budget "${BUDGET:-500}" --out "$OUT/gpu-' in script


@pytest.mark.parametrize("path", [".whl/x.whl"])
def test_the_carried_folder_is_ignored_so_the_device_tool_can_carry_it(path):
    assert subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO).returncode == 0


def test_without_a_package_index_it_says_so_instead_of_a_traceback(tmp_path):
    import os

    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    got = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_wheels.py"), "--dest", str(tmp_path / "w")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert got.returncode == 1 and "Traceback" not in got.stderr
    assert "gpu-wheels: pip could not download the wheels" in got.stderr and "package index" in got.stderr
