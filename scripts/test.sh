#!/usr/bin/env bash
# Install what the tests need (scripts/setup.sh: the Python environment;
# scripts/setup_system.sh: SLURM, munge and shellcheck from Debian's packages),
# then run the whole suite on CPU. Arguments go to pytest, e.g. `-m slurm`.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "${repo}/scripts/setup.sh"
bash "${repo}/scripts/setup_system.sh"
cd "${repo}"
exec "${repo}/.venv/bin/python" -m pytest "$@"
