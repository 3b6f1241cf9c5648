#!/usr/bin/env bash
# Install the Debian packages the tests use beyond Python: SLURM's controller and
# node daemons with munge (tests/recipes/test_slurm.py starts a two-node cluster on this
# machine) and shellcheck (tests/recipes/test_recipes.py lints the recipes).
# Idempotent: does nothing when they are installed. Needs root and apt-get;
# without them it says what is missing and leaves it to the tests to skip.
#
#   SYSTEM_PACKAGES   the packages (default: slurm-wlm munge shellcheck)
set -euo pipefail

read -r -a packages <<<"${SYSTEM_PACKAGES:-slurm-wlm munge shellcheck}"
commands=(slurmctld slurmd sbatch srun scontrol munged shellcheck)

missing=()
for cmd in "${commands[@]}"; do
  command -v "${cmd}" >/dev/null 2>&1 || [[ -x "/usr/sbin/${cmd}" ]] || missing+=("${cmd}")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi

if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
  echo "setup_system: missing ${missing[*]}; as root on Debian: apt-get install ${packages[*]}" \
    "(the SLURM and shellcheck tests skip without them)" >&2
  exit 0
fi
echo "setup_system: installing ${packages[*]} (missing: ${missing[*]})"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
