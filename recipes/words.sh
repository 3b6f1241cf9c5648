# shellcheck shell=bash
# Printing commands as copy-pastable lines, for recipes/common.sh and recipes/preprocess_corpus.sh.

# One argument per word, quoted only where the shell needs it: a copy-pastable line.
# A bare $SLURM_* reference (the per-task lines) stays unquoted: each task expands it.
quote() {
  local arg out=()
  for arg in "$@"; do
    if [[ "${arg}" =~ ^[A-Za-z0-9_@%+=:,./-]+$ || "${arg}" =~ ^([A-Z_]+=)?\$SLURM_[A-Z]+$ ]]; then
      out+=("${arg}")
    else
      out+=("'${arg//\'/\'\\\'\'}'")
    fi
  done
  printf '%s' "${out[*]}"
}

# Print a command over several lines, breaking before options once a line is long.
show() {
  local arg line="" quoted
  for arg in "$@"; do
    quoted="$(quote "${arg}")"
    if [[ -n "${line}" && "${arg}" == --* && ${#line} -gt 90 ]]; then
      printf '%s \\\n' "${line}"
      line="    ${quoted}"
    else
      line="${line:+${line} }${quoted}"
    fi
  done
  printf '%s\n' "${line}"
}
