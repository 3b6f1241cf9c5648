"""Fetch the wheels a GPU machine without network lacks into ``.whl/``, for ``scripts/gpu_check.sh`` to install::

    .venv/bin/python scripts/fetch_gpu_wheels.py

The GPU machine has Python 3.12 and its own CUDA torch; it lacks Megatron-Core and the packages the check
runs (``transformers`` for the Hugging Face comparison). The set is what this project's environment holds:
the closure of those packages' requirements as installed in ``.venv``, minus torch's own closure, each at its
installed version (the combination the tests passed with), for CPython 3.12 on x86-64 Linux. The folder is
ignored by git and carried to the device (``carry: [".whl"]``); it must stay under ``LIMIT_MIB``.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROOTS = ("megatron-core", "numpy", "sentencepiece", "psutil", "regex", "safetensors", "tokenizers", "PyYAML",
         "transformers", "zstandard")  # fmt: skip
"""What the check imports beyond torch: pretrain_gpt.py's runtime (requirements.txt without the columnar
corpus readers) and transformers."""
LIMIT_MIB = 64
"""What a device call carries in all."""
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64")


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots: tuple[str, ...], *, leave_out: frozenset[str] = frozenset()) -> dict[str, str]:
    """{name: installed version} of ``roots`` and everything they require (extras and packages this interpreter
    does not have, such as back-ports for older Pythons, left out), without ``leave_out``."""
    found: dict[str, str] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if _key(name) in found or _key(name) in leave_out:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        found[_key(name)] = dist.version
        todo += [re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0] for r in dist.requires or [] if "extra ==" not in r]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=REPO / ".whl")
    args = parser.parse_args(argv)
    wanted = closure(ROOTS, leave_out=frozenset(closure(("torch",))))
    args.dest.mkdir(exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
               "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", "--dest", str(args.dest)]  # fmt: skip
    command += [part for platform in PLATFORMS for part in ("--platform", platform)]
    command += [f"{name}=={version}" for name, version in sorted(wanted.items())]
    subprocess.run(command, check=True)
    wheels = sorted(args.dest.glob("*.whl"))
    stale = [w for w in wheels if wanted.get(_key(w.name.split("-")[0])) != w.name.split("-")[1]]
    for wheel in stale:  # another version's, or a package no longer needed: this folder is ours alone
        wheel.unlink()
    size = sum(w.stat().st_size for w in wheels if w not in stale) / 2**20
    print(f"{len(wheels) - len(stale)} wheels, {size:.1f} MiB in {args.dest}")
    if size > LIMIT_MIB:
        print(f"more than the {LIMIT_MIB} MiB a device call carries", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
