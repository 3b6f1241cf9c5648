#!/usr/bin/env bash
# Create (or update) the project's virtual environment in .venv. Idempotent:
# does nothing when the pinned requirements and pyproject.toml are unchanged
# since the last run. Ends with `pip install --no-deps --editable .` (this package).
#
#   TORCH_SPEC   torch requirement to install when none is available (default torch==2.13.0)
#   PYTHON       interpreter to build the venv from (default python3)
#
# When the interpreter already has torch (a GPU container), the venv sees the
# system site-packages and that torch is kept, not replaced, together with the
# packages its extensions were built against: megatron-core is installed at its
# pinned version without dependencies (its torch>=2.6.0 does not admit an NGC
# pre-release build such as 2.6.0a0+…nv25.01), the other runtime requirements
# only where the environment lacks them, and the test tools under a constraint
# that keeps that torch.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${repo}/.venv"
python="${PYTHON:-python3}"
torch_spec="${TORCH_SPEC:-torch==2.13.0}"
stamp="${venv}/.requirements.sha256"

want="$(cat "${repo}/requirements.txt" "${repo}/requirements-dev.txt" "${repo}/pyproject.toml" | sha256sum | cut -d' ' -f1)"
if [[ -f "${stamp}" && "$(cat "${stamp}")" == "${want}" && -x "${venv}/bin/python" ]]; then
  exit 0
fi

if [[ ! -x "${venv}/bin/python" ]]; then
  if "${python}" -c "import torch" 2>/dev/null; then
    echo "setup: using the interpreter's own torch ($("${python}" -c 'import torch; print(torch.__version__)'))"
    "${python}" -m venv --system-site-packages "${venv}"
  else
    "${python}" -m venv "${venv}"
  fi
fi

pip=("${venv}/bin/python" -m pip install --quiet --disable-pip-version-check)
if ! grep -q "include-system-site-packages = true" "${venv}/pyvenv.cfg"; then
  if ! "${venv}/bin/python" -c "import torch" 2>/dev/null; then
    echo "setup: installing ${torch_spec}"
    "${pip[@]}" "${torch_spec}"
  fi
  echo "setup: installing pinned requirements"
  "${pip[@]}" -r "${repo}/requirements.txt" -r "${repo}/requirements-dev.txt"
else
  torch_version="$("${venv}/bin/python" -c 'import torch; print(torch.__version__)')"
  missing=()
  while read -r line; do
    [[ -z "${line}" || "${line}" == \#* ]] && continue
    name="${line%%[=<>]*}"
    if [[ "${name}" == megatron-core ]] || ! "${venv}/bin/python" -m pip show "${name}" >/dev/null 2>&1; then
      missing+=("${line}")
    else
      echo "setup: keeping the environment's ${name}"
    fi
  done <"${repo}/requirements.txt"
  echo "setup: installing ${missing[*]} (without dependencies; torch ${torch_version} is the environment's)"
  "${pip[@]}" --no-deps "${missing[@]}"
  constraints="$(mktemp)"
  trap 'rm -f "${constraints}"' EXIT
  echo "torch==${torch_version}" >"${constraints}"
  "${pip[@]}" -c "${constraints}" -r "${repo}/requirements-dev.txt"
fi
# This project itself, editable: the megatron_ext package and its console scripts (mcore-layout, ...).
echo "setup: installing megatron_ext (editable)"
"${pip[@]}" --no-deps --editable "${repo}"
echo "${want}" >"${stamp}"
