"""The Python packages a lent GPU machine lacks, as wheels to carry there (it reaches no package index).

The H200 machines' image holds torch 2.11 (CUDA 13.0), torchvision, accelerate 1.15, peft, tokenizers, safetensors,
pyarrow, pandas, rich, PyYAML and pytest (the device tool's KINDS.md lists them), but transformers 5.17 and none
of pydantic, omegaconf, datasets, trl, bitsandbytes, liger-kernel or torchao. This downloads the versions ftune is
tested with, for that machine's Python (3.12, x86-64 manylinux), into `.whl/` (git ignores it), and slims
bitsandbytes to the CUDA 13 builds of its library: its wheel carries one per CUDA release (43 MB), over what a
call can carry with the repository (64 MiB in all).

    python bench/gpu_wheels.py [--dest .whl]        (make gpu-wheels)

Then, in the GPU window, one call of the device tool: `bash bench/gpu_window.sh` with `.whl` carried
(docs/performance.md, "The prepared suite for the next GPU window").
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PINS = ("transformers==5.23.0", "peft==0.21.2", "datasets==5.2.0", "trl==1.16.0", "bitsandbytes==0.50.2",
        "liger-kernel==0.8.5", "torchao==0.18.0", "pydantic==2.14.4", "pydantic_core==2.50.5",
        "annotated-types==0.8.0", "typing-inspection==0.4.5", "typing_extensions==4.16.0", "omegaconf==2.4.0",
        "dill==0.4.1", "multiprocess==0.70.19", "huggingface_hub==2.4.0", "tokenizers==0.23.3")
"""ftune's runtime and its benchmarks' packages at the versions tested here (transformers needs the newer
huggingface_hub and tokenizers), and what they need that the image lacks (pydantic's parts, datasets' dill and
multiprocess)."""
PLATFORM = ["--python-version", "3.12", "--implementation", "cp", *[a for n in (
    "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
    "manylinux2014_x86_64", "manylinux1_x86_64") for a in ("--platform", n)]]
"""The device tool's advice for the H200 machines' Python."""
KEEP_CUDA = ("cuda130", "cuda132")
"""bitsandbytes' libraries kept: the machine's torch is built for CUDA 13.0 (bitsandbytes loads the library named
after torch's CUDA version)."""
LIMIT = 56 * 2**20
"""What the wheels may take of a call's 64 MiB, leaving the repository's share."""


def slim(wheel: Path, keep: tuple[str, ...] = KEEP_CUDA) -> Path:
    """`wheel` rewritten in place without the GPU libraries (`lib*_cuda*.so`, ROCm, XPU) whose name holds none of
    `keep`, its RECORD listing what is left."""
    def dropped(name: str) -> bool:
        base = name.rsplit("/", 1)[-1]
        gpu = base.startswith("lib") and base.endswith(".so") and any(t in base for t in ("_cuda", "_rocm", "_xpu"))
        return gpu and not any(k in base for k in keep)

    with zipfile.ZipFile(wheel) as z:
        entries = [(info, z.read(info)) for info in z.infolist() if not dropped(info.filename)]
    out = wheel.with_suffix(".slim")
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for info, data in entries:
            if info.filename.endswith(".dist-info/RECORD"):
                lines = [line for line in data.decode().splitlines() if line and not dropped(line.split(",")[0])]
                data = ("\n".join(lines) + "\n").encode()
            z.writestr(info, data)
    out.replace(wheel)
    return wheel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=REPO / ".whl")
    args = parser.parse_args(argv)
    args.dest.mkdir(parents=True, exist_ok=True)
    got = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                          *PLATFORM, "-d", str(args.dest), *PINS])
    if got.returncode != 0:  # pip said which one above
        print(f"gpu-wheels: pip could not download the wheels (exit {got.returncode}): this needs a package index; "
              "run it where pip reaches one", file=sys.stderr)
        return 1
    for wheel in args.dest.glob("bitsandbytes-*.whl"):
        slim(wheel)
    total = sum(w.stat().st_size for w in args.dest.glob("*.whl"))
    print(f"{len(list(args.dest.glob('*.whl')))} wheels, {total / 2**20:.1f} MiB in {args.dest}")
    if total > LIMIT:
        print(f"more than the {LIMIT / 2**20:.0f} MiB a call can carry beside the repository: remove older "
              "versions from the folder", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
