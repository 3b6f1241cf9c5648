#!/usr/bin/env bash
# Install what the tests need (scripts/setup.sh), then run the whole suite on CPU.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "${repo}/scripts/setup.sh"
cd "${repo}"
exec "${repo}/.venv/bin/python" -m pytest "$@"
