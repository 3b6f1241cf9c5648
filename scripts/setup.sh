#!/usr/bin/env bash
# Create (or update) the project's virtual environment in .venv. Idempotent:
# does nothing when the pinned requirements and pyproject.toml are unchanged
# since the last run. Ends with `pip install --no-deps --editable .` (this package).
#
#   TORCH_SPEC   torch requirement to install when none is available (default torch==2.13.0)
#   PYTHON       interpreter to build the venv from (default: the first of python3,
#                python3.12, python3.13 and pyenv's 3.12+ versions that is Python >= 3.12,
#                which megatron-core 0.17 and later require)
#
# A .venv that this script made from an older Python is rebuilt; one it did not
# make (no stamp) is left alone and named.
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
min_python=(3 12)

# True when "$1" runs and is Python >= 3.12.
new_enough() {
  "$1" -c "import sys; sys.exit(sys.version_info[:2] < (${min_python[0]}, ${min_python[1]}))" 2>/dev/null
}

find_python() {
  if [[ -n "${PYTHON:-}" ]]; then
    if new_enough "${PYTHON}"; then
      echo "${PYTHON}"
      return 0
    fi
    echo "setup: PYTHON=${PYTHON} is not Python >= ${min_python[0]}.${min_python[1]}; point it at one (megatron-core 0.19 needs it)" >&2
    return 1
  fi
  local candidate
  local -a candidates=(python3 python3.12 python3.13)
  if command -v pyenv >/dev/null; then
    # pyenv's shims answer only for enabled versions: take the interpreters themselves.
    candidates+=("$(pyenv root)"/versions/3.1[2-9]*/bin/python3)
  fi
  for candidate in "${candidates[@]}"; do
    if new_enough "${candidate}"; then
      command -v "${candidate}"
      return 0
    fi
  done
  echo "setup: no Python >= ${min_python[0]}.${min_python[1]} found (megatron-core 0.19 needs it): install python3.12 (e.g. 'pyenv install 3.12', or your distribution's python3.12 with its venv module) or set PYTHON=/path/to/python3.12" >&2
  return 1
}

torch_spec="${TORCH_SPEC:-torch==2.13.0}"
stamp="${venv}/.requirements.sha256"

want="$(cat "${repo}/requirements.txt" "${repo}/requirements-dev.txt" "${repo}/pyproject.toml" | sha256sum | cut -d' ' -f1)"
if [[ -f "${stamp}" && "$(cat "${stamp}")" == "${want}" && -x "${venv}/bin/python" ]] && new_enough "${venv}/bin/python"; then
  exit 0
fi

python="$(find_python)"

if [[ -x "${venv}/bin/python" ]] && ! new_enough "${venv}/bin/python"; then
  if [[ ! -f "${stamp}" ]]; then
    echo "setup: ${venv} is older than Python ${min_python[0]}.${min_python[1]} and was not made by this script; move it away and run again" >&2
    exit 1
  fi
  echo "setup: ${venv} is $("${venv}/bin/python" -V 2>&1); rebuilding it from ${python} ($("${python}" -V 2>&1))"
  rm -rf "${venv}"
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
