#!/usr/bin/env bash
# A corpus too big for one machine: tools/preprocess_data.py as a SLURM job array,
# one task per share of the input files (balanced by bytes, fixed at the first
# submission), then a last job that verifies every dataset and writes the blend
# (or merges). Run it on the login node; it submits both jobs itself:
#
#   INPUT='/lustre/fineweb/data/*/*.parquet' OUTPUT=/lustre/data/fineweb TASKS=64 \
#   PREPROCESS_ARGS='--tokenizer-type GPTSentencePieceTokenizer --tokenizer-model /lustre/tok.model --append-eod' \
#     bash recipes/preprocess_corpus.sh
#   DRY_RUN=1 ... bash recipes/preprocess_corpus.sh      # the plan and the sbatch commands, nothing submitted
#
# Then train on it: DATA_ARGS_PATH=OUTPUT/blend_text.txt (or DATA_PATH=OUTPUT/corpus_text_document with MERGE=1).
# Submitting again reuses the plan and runs only the tasks without a completion
# record: a failed or preempted task runs again alone. docs/data.md has the details.
#
# Variables
#   INPUT            files and globs, space-separated (as tools/preprocess_data.py --input)
#   OUTPUT           the job's directory: datasets/task-K/, job/ (plan, records), blend_KEY.txt
#   TASKS            array tasks (8); fewer when there are fewer files
#   PREPROCESS_ARGS  tools/preprocess_data.py's options other than input and output
#   MERGE            1: the last step also merges each key into OUTPUT/corpus_KEY_document (0)
#   SUBMIT_ARGS      more sbatch arguments for both jobs, split on whitespace (e.g. '-p cpu -A proj')
#   TASK_TIME        each task's time limit (04:00:00); SLURM warns it 5 minutes before, and a
#                    task stopped so is requeued (REQUEUE=1) and starts its share again
#   REQUEUE          1: requeue a task stopped by its time limit or a preemption (1)
#   DRY_RUN          1: print the plan and the commands, submit nothing (0)
#   PYTHON           interpreter (REPO_DIR/.venv/bin/python, else python3)
#
#SBATCH --job-name=preprocess_corpus
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --open-mode=append
set -euo pipefail

log() { printf '[preprocess] %s\n' "$*"; }
die() {
  printf '[preprocess] error: %s\n' "$*" >&2
  exit 2
}

# sbatch runs a spooled copy of this file: the repository is then PREPROCESS_REPO (set at submission).
if [[ -z "${PREPROCESS_REPO:-}" ]]; then
  PREPROCESS_REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
fi
: "${OUTPUT:?set OUTPUT, the directory of the job}"
: "${TASKS:=8}" "${MERGE:=0}" "${SUBMIT_ARGS:=}" "${TASK_TIME:=04:00:00}" "${REQUEUE:=1}" "${DRY_RUN:=0}"
: "${PREPROCESS_ARGS:=}" "${PREPROCESS_STEP:=submit}"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "${PREPROCESS_REPO}/.venv/bin/python" ]]; then PYTHON="${PREPROCESS_REPO}/.venv/bin/python"; else PYTHON=python3; fi
fi
# shellcheck source=recipes/words.sh
source "${PREPROCESS_REPO}/recipes/words.sh"
export PREPROCESS_REPO PYTHONPATH="${PREPROCESS_REPO}${PYTHONPATH:+:${PYTHONPATH}}"
job=("${PYTHON}" -m megatron_ext.cli.preprocess_job)

case "${PREPROCESS_STEP}" in
submit)
  : "${INPUT:?set INPUT, the files and globs to preprocess}"
  read -r -a inputs <<<"${INPUT}"
  read -r -a submit_args <<<"${SUBMIT_ARGS}"
  plan=("${job[@]}" plan --input "${inputs[@]}" --output "${OUTPUT}" --tasks "${TASKS}"
    --preprocess-args "${PREPROCESS_ARGS}")
  ((DRY_RUN)) && plan+=(--dry-run)
  pending="$("${plan[@]}")" || exit $?
  self="${PREPROCESS_REPO}/recipes/preprocess_corpus.sh"
  logs="${OUTPUT}/job/logs"
  array=(sbatch --parsable "${submit_args[@]}" --array="${pending}" --time="${TASK_TIME}" --signal=B:USR1@300
    --requeue --output="${logs}/task-%a.%A.out" --export="ALL,PREPROCESS_STEP=task" "${self}")
  last=(sbatch --parsable "${submit_args[@]}" --time=01:00:00 --output="${logs}/finish.%j.out"
    --export="ALL,PREPROCESS_STEP=finish" "${self}")
  if ((DRY_RUN)); then
    log "dry run: nothing submitted; would run:"
    [[ -z "${pending}" ]] || show "${array[@]}"
    show "${last[@]:0:2}" "--dependency=afterok:ARRAY_JOB_ID" "${last[@]:2}"
    exit 0
  fi
  mkdir -p "${logs}"
  dependency=()
  if [[ -n "${pending}" ]]; then
    array_id="$("${array[@]}")"
    array_id="${array_id%%;*}"
    log "array job ${array_id}: tasks ${pending} (logs in ${logs})"
    dependency=(--dependency="afterok:${array_id}")
  else
    log "every task has finished before: only the last step is submitted"
  fi
  finish_id="$("${last[@]:0:2}" "${dependency[@]}" "${last[@]:2}")"
  log "last step: job ${finish_id%%;*} (after the array), writes ${OUTPUT}/blend_KEY.txt"
  ;;
task)
  : "${SLURM_ARRAY_TASK_ID:?the task step runs inside a SLURM array task}"
  # In the background, so that SLURM's warning (USR1, --signal=B:USR1@300) reaches it at once.
  "${job[@]}" task --output "${OUTPUT}" --task "${SLURM_ARRAY_TASK_ID}" &
  child=$!
  # shellcheck disable=SC2064
  for sig in USR1 TERM INT; do trap "kill -s ${sig} ${child} 2>/dev/null || true" "${sig}"; done
  rc=0
  wait "${child}" || rc=$?
  while kill -0 "${child}" 2>/dev/null; do # a forwarded signal interrupted wait
    rc=0
    wait "${child}" || rc=$?
  done
  if ((rc == 75)) && ((REQUEUE)); then
    trap '' TERM # the requeue signals this script too
    if scontrol requeue "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"; then
      log "task ${SLURM_ARRAY_TASK_ID} stopped before its end: requeued, it starts its share again"
    else
      log "task ${SLURM_ARRAY_TASK_ID} stopped before its end; requeue refused: submit the recipe again"
    fi
  fi
  exit "${rc}"
  ;;
finish)
  args=(finish --output "${OUTPUT}")
  ((MERGE)) && args+=(--merge)
  exec "${job[@]}" "${args[@]}"
  ;;
*) die "PREPROCESS_STEP=${PREPROCESS_STEP}: submit, task or finish" ;;
esac
