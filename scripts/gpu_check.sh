#!/usr/bin/env bash
# The GPU check (bench/gpu_check.py) in one command, on a machine that may lack
# this project's Python packages and the network:
#
#   bash scripts/gpu_check.sh OUT [--cpu-rehearsal] [--step STEP]... [--budget STEP=SECONDS]...
#
# Interpreter: PYTHON, else the project's .venv, else python3. When it cannot
# import megatron.core, the wheels in .whl/ (.venv/bin/python
# scripts/fetch_gpu_wheels.py, on a machine with network) are installed into
# .whl/site, without dependencies and without touching the interpreter's own
# packages (its torch stays). Figures go to OUT: one JSON per step,
# summary.json and summary.md. Exit 0 when every step finished.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:?usage: bash scripts/gpu_check.sh OUT [--cpu-rehearsal] [--step STEP]... [--budget STEP=SECONDS]...}"
shift
python="${PYTHON:-}"
if [[ -z "${python}" ]]; then
  if [[ -x "${repo}/.venv/bin/python" ]]; then python="${repo}/.venv/bin/python"; else python=python3; fi
fi
site="${repo}/.whl/site"
export PYTHONPATH="${repo}:${site}${PYTHONPATH:+:${PYTHONPATH}}"
# The import a run makes (megatron_ext.mcore_import first: on a machine without CUDA, the CPU rehearsal's, it
# leaves Megatron-Core's fusions uncompiled and the probe takes 2 s less; with a GPU it changes nothing).
if ! "${python}" -c "from megatron_ext.mcore_import import install; install(); import megatron.core" 2>/dev/null; then
  shopt -s nullglob
  wheels=("${repo}"/.whl/*.whl)
  if [[ ${#wheels[@]} -eq 0 ]]; then
    echo "gpu check: ${python} cannot import megatron.core and ${repo}/.whl has no wheels;" \
      "fetch them on a machine with network: .venv/bin/python scripts/fetch_gpu_wheels.py" >&2
    exit 1
  fi
  echo "gpu check: installing ${#wheels[@]} wheels from .whl into ${site}"
  "${python}" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --target "${site}" "${wheels[@]}"
fi
exec "${python}" "${repo}/bench/gpu_check.py" --out "${out}" "$@"
