#!/usr/bin/env bash
# Install what the tests need (scripts/setup.sh: the Python environment and this
# package; scripts/setup_system.sh: SLURM, munge and shellcheck from Debian's
# packages), run the gates (ruff lint and format, mypy, shellcheck), then the
# whole suite on CPU. Arguments go to pytest, e.g. `-m slurm`; GATES=0 skips
# the gates (for a quick local pytest run; CI always runs them).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "${repo}/scripts/setup.sh"
bash "${repo}/scripts/setup_system.sh"
cd "${repo}"
py="${repo}/.venv/bin/python"

if [[ "${GATES:-1}" != 0 ]]; then
  echo "gates: ruff check, ruff format --check, mypy, shellcheck"
  "${py}" -m ruff check --quiet .
  "${py}" -m ruff format --check --quiet .
  "${py}" -m mypy
  command -v shellcheck >/dev/null || {
    echo "shellcheck is missing: as root, bash scripts/setup_system.sh" >&2
    exit 1
  }
  shellcheck --external-sources recipes/*.sh scripts/*.sh
fi

exec "${py}" -m pytest "$@"
