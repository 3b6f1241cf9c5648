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
#   INPUT            files and globs, separated by spaces or newlines (a path with a space: a glob)
#   OUTPUT           the job's directory: datasets/task-K/, job/ (plan, records), blend_KEY.txt
#   TASKS            array tasks (8); fewer when there are fewer files
#   PREPROCESS_ARGS  tools/preprocess_data.py's options other than input and output
#   MERGE            1: the last step also merges each key into OUTPUT/corpus_KEY_document (0)
#   SUBMIT_ARGS      more sbatch arguments for both jobs, split on whitespace (e.g. '-p cpu -A proj')
#   TASK_CPUS        CPUs per task ('': the whole node, --exclusive; the tool uses one worker per CPU)
#   TASK_TIME        each task's time limit (04:00:00, at least 15 minutes); SLURM warns it 5 minutes
#                    before, and a task stopped so is requeued (REQUEUE=1) and starts its share again
#   REQUEUE          1: requeue a task stopped by its time limit or a preemption (1)
#   MAX_REQUEUES     requeues of one task before it gives up and says to raise TASK_TIME or TASKS (3)
#   FINISH_TIME      the last step's time limit (01:00:00; 08:00:00 with MERGE=1)
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
: "${PREPROCESS_ARGS:=}" "${PREPROCESS_STEP:=submit}" "${TASK_CPUS:=}" "${MAX_REQUEUES:=3}"
if ((MERGE)); then : "${FINISH_TIME:=08:00:00}"; else : "${FINISH_TIME:=01:00:00}"; fi
OUTPUT="$(realpath -m "${OUTPUT}")" # the tasks may start in another directory
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
  read -r -d '' -a inputs <<<"${INPUT}" || true # spaces and newlines both separate
  read -r -d '' -a submit_args <<<"${SUBMIT_ARGS}" || true
  plan=("${job[@]}" plan --input "${inputs[@]}" --output "${OUTPUT}" --tasks "${TASKS}"
    --preprocess-args "${PREPROCESS_ARGS}" --task-time "${TASK_TIME}")
  ((DRY_RUN)) && plan+=(--dry-run)
  running="${OUTPUT}/job/array_job"
  if [[ -f "${running}" ]] && [[ -n "$(squeue -h -j "$(cat "${running}")" 2>/dev/null)" ]]; then
    die "array job $(cat "${running}") of ${OUTPUT} is still queued or running: wait for it, or scancel it first"
  fi
  pending="$("${plan[@]}")" || exit $?
  self="${PREPROCESS_REPO}/recipes/preprocess_corpus.sh"
  logs="${OUTPUT}/job/logs"
  cpus=(--exclusive)
  [[ -z "${TASK_CPUS}" ]] || cpus=(--cpus-per-task="${TASK_CPUS}")
  array=(sbatch --parsable ${submit_args[@]+"${submit_args[@]}"} "${cpus[@]}" --array="${pending}"
    --time="${TASK_TIME}" --signal=B:USR1@300 --requeue --output="${logs}/task-%a.%A.out"
    --export="ALL,PREPROCESS_STEP=task" "${self}")
  # afterany: the last step also runs after a failed task, and names what is missing.
  last=(sbatch --parsable ${submit_args[@]+"${submit_args[@]}"} --time="${FINISH_TIME}"
    --output="${logs}/finish.%j.out" --export="ALL,PREPROCESS_STEP=finish" "${self}")
  if ((DRY_RUN)); then
    log "dry run: nothing submitted; would run:"
    [[ -z "${pending}" ]] || show "${array[@]}"
    show "${last[@]:0:2}" "--dependency=afterany:ARRAY_JOB_ID" "${last[@]:2}"
    exit 0
  fi
  mkdir -p "${logs}"
  dependency=()
  if [[ -n "${pending}" ]]; then
    array_id="$("${array[@]}")"
    array_id="${array_id%%;*}"
    printf '%s\n' "${array_id}" >"${running}"
    log "array job ${array_id}: tasks ${pending} (logs in ${logs})"
    dependency=(--dependency="afterany:${array_id}")
  else
    log "every task has finished before: only the last step is submitted"
  fi
  finish_id="$("${last[@]:0:2}" ${dependency[@]+"${dependency[@]}"} "${last[@]:2}")"
  log "last step: job ${finish_id%%;*} (after the array), writes ${OUTPUT}/blend_KEY.txt"
  ;;
task)
  : "${SLURM_ARRAY_TASK_ID:?the task step runs inside a SLURM array task}"
  # The task runs in the background, so that SLURM's warning (USR1, --signal=B:USR1@300) reaches it at once;
  # a signal before it has started is passed on as soon as it has.
  child="" pending_signal="" stopped=0
  # shellcheck disable=SC2317  # called by the traps below
  forward() {
    stopped=1
    if [[ -n "${child}" ]]; then kill -s "$1" "${child}" 2>/dev/null || true; else pending_signal="$1"; fi
  }
  for sig in USR1 TERM INT; do
    # shellcheck disable=SC2064
    trap "forward ${sig}" "${sig}"
  done
  "${job[@]}" task --output "${OUTPUT}" --task "${SLURM_ARRAY_TASK_ID}" &
  child=$!
  [[ -z "${pending_signal}" ]] || kill -s "${pending_signal}" "${child}" 2>/dev/null || true
  rc=0
  wait "${child}" || rc=$?
  while kill -0 "${child}" 2>/dev/null; do # a forwarded signal interrupted wait
    rc=0
    wait "${child}" || rc=$?
  done
  if ((rc == 75 || (rc != 0 && stopped))) && ((REQUEUE)); then
    if ((${SLURM_RESTART_COUNT:-0} >= MAX_REQUEUES)); then
      log "task ${SLURM_ARRAY_TASK_ID} stopped before its end ${SLURM_RESTART_COUNT} times: not requeued;" \
        "raise TASK_TIME, or TASKS (smaller shares), and submit the recipe again"
    else
      trap '' TERM # the requeue signals this script too
      if scontrol requeue "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"; then
        log "task ${SLURM_ARRAY_TASK_ID} stopped before its end: requeued, it starts its share again"
      else
        log "task ${SLURM_ARRAY_TASK_ID} stopped before its end; requeue refused: submit the recipe again"
      fi
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
