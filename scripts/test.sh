#!/usr/bin/env bash
# Install what the tests need (scripts/setup.sh: the Python environment and this
# package; scripts/setup_system.sh: SLURM, munge and shellcheck from Debian's
# packages), run the gates (ruff lint and format, mypy, the import layers of
# pyproject.toml's [tool.importlinter], shellcheck), then the
# whole suite on CPU. Arguments go to one pytest run, e.g. `-m slurm`; GATES=0
# skips the gates (for a quick local pytest run; CI always runs them).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "${repo}/scripts/setup.sh"
bash "${repo}/scripts/setup_system.sh"
cd "${repo}"
py="${repo}/.venv/bin/python"

if [[ "${GATES:-1}" != 0 ]]; then
  echo "gates: ruff check, ruff format --check, mypy, import layers, shellcheck"
  "${py}" -m ruff check --quiet .
  "${py}" -m ruff format --check --quiet .
  "${py}" -m mypy
  "${repo}/.venv/bin/lint-imports" --no-cache --no-logo
  command -v shellcheck >/dev/null || {
    echo "shellcheck is missing: as root, bash scripts/setup_system.sh" >&2
    exit 1
  }
  shellcheck --external-sources recipes/*.sh scripts/*.sh examples/megatron-lm/*.sh
fi

if [[ $# -gt 0 ]]; then
  exec "${py}" -m pytest "$@"
fi
# The whole suite, in two parts:
# - the SLURM tests, which mostly wait on the scheduler's clock (time limits,
#   requeues), in a pytest of their own beside the rest, on two workers with a
#   cluster each (a test file per worker); their report follows;
# - everything else on two pytest workers, each starting on half of the tests
#   in file order (so a file's tests mostly share its fixtures: runs,
#   checkpoints) and taking work from the other when it runs out.
# The soak (-m soak) is long and runs only when asked.
slurm_log="$(mktemp)"
"${py}" -m pytest -m "slurm and not soak" -n 2 --dist loadfile -p no:cacheprovider >"${slurm_log}" 2>&1 &
slurm_pid=$!
# Interrupted: the SLURM tests stop too (their fixtures stop the cluster).
trap 'kill -INT "${slurm_pid}" 2>/dev/null; wait "${slurm_pid}"; rm -f "${slurm_log}"; exit 130' INT TERM
status=0
"${py}" -m pytest -m "not slurm and not soak" -n 2 --dist worksteal || status=$?
wait "${slurm_pid}" || status=$?
echo "--- the SLURM tests (run beside the others) ---"
cat "${slurm_log}"
rm -f "${slurm_log}"
exit "${status}"
