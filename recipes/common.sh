# shellcheck shell=bash
# The one launcher every recipe sources: resolve the job's geometry, validate
# the layout before anything starts, launch pretrain_gpt.py with srun + torchrun
# (or torchrun alone outside SLURM), and requeue the job when training stopped
# early with a checkpoint (exit code 75: megatron_ext/config/exit_codes.py).
#
# A recipe sets the model shape and hyper-parameters (arrays MODEL and
# TRAINING) and the defaults of the layout variables below, then sources this
# file. Every variable can be overridden from the environment; docs/slurm.md
# has the full table.
#
# Job geometry
#   NNODES            nodes; inside a job the allocation's count wins (recipe default)
#   GPUS_PER_NODE     processes per node: GPUs, or CPU processes with DEVICE=cpu (8)
#   LAUNCHER          torchrun: one srun task per node running torchrun (default);
#                     srun: one srun task per GPU running pretrain_gpt.py directly
#   DEVICE            cuda | cpu | auto, passed as --device (cuda)
#   GPU_PROFILE       GPU for the memory estimate of tools/layout.py: a100-40g,
#                     a100-80g, h100-sxm, h200, a profile FILE.json from
#                     tools/layout.py --calibrate, or none to skip it (h100-sxm)
# Layout, batch, precision, run and data (recipe defaults; each sets pretrain_gpt.py
# flags through megatron_ext.cli.recipe, which lists them: python -m megatron_ext.cli.recipe --variables)
#   TP PP             tensor- and pipeline-parallel sizes
#   CP                context-parallel size (1; more needs Transformer Engine)
#   VP_LAYERS         layers per virtual pipeline stage (interleaved 1F1B, even stages); 0: off
#   VP                virtual stages per pipeline rank (instead of VP_LAYERS)
#   SCHEDULE          1f1b | zb-h1 | zb-interleaved (1f1b; zb-h1: the ZB-H1 zero-bubble schedule, VP_LAYERS=0;
#                     zb-interleaved: the zero-bubble interleaved schedule, with VP_LAYERS)
#   FIRST_STAGE_LAYERS LAST_STAGE_LAYERS   uneven stages: layers on the first / last pipeline rank
#   ACCOUNT_FOR_EMBEDDING ACCOUNT_FOR_LOSS  1: count the embedding / loss as a layer in the split
#   PIPELINE_LAYOUT   a Megatron-Core layout string placing every layer (quote it)
#   MICROBATCH_GROUP_SIZE   interleaved 1F1B's microbatch group (default PP)
#   TIMELINE          write a Chrome trace of every pass of the last steps here
#   SEQUENCE_PARALLEL DISTRIBUTED_OPTIMIZER   1 to enable, 0 to disable
#   MICRO_BATCH GLOBAL_BATCH   sequences per microbatch / per optimizer step
#   PRECISION         bf16 | fp16 | fp32 (bf16)
#   RECOMPUTE         none | selective | full (none; full recomputes uniformly, 1 layer)
#   OVERLAP           1: overlap the DP gradient reduce (and, with the distributed optimizer,
#                     the parameter all-gather) with compute, and fuse the cross entropy
#                     (1 on GPUs, 0 with DEVICE=cpu)
#   TRAIN_ITERS LOG_INTERVAL SAVE_INTERVAL EVAL_INTERVAL EVAL_ITERS   (recipe defaults)
#   EXTRA_ARGS        more pretrain_gpt.py arguments, split on whitespace ('')
#   DATA_PATH         dataset prefixes, optionally weighted: 'W1 PREFIX1 W2 PREFIX2' ('': mock data)
#   DATA_ARGS_PATH    a blend file instead (--data-args-path; tools/merge_datasets.py --write-blend)
#   DATA_SPLIT        train,valid,test split (969,30,1)
#   DATA_CACHE_PATH   where index files are cached ('': next to the data)
#   TOKENIZER_TYPE    (GPTSentencePieceTokenizer)   TOKENIZER_MODEL  (required with DATA_PATH)
# Places
#   RUN_NAME          (the recipe's name)     RUN_DIR  (REPO_DIR/runs/RUN_NAME)
#   CHECKPOINT_DIR    --save and --load (RUN_DIR/checkpoints): a requeued job resumes from it
#   LOG_DIR           one directory per job attempt under it (RUN_DIR/logs)
#   METRICS_FILE      (RUN_DIR/metrics.jsonl)   TENSORBOARD_DIR ('': off)
# Software
#   PYTHON            interpreter (python in a container, else REPO_DIR/.venv/bin/python, else python3)
#   CONTAINER_IMAGE   pyxis/enroot image for srun --container-image ('': no container)
#   CONTAINER_MOUNTS  srun --container-mounts (REPO_DIR:REPO_DIR)
#   SRUN_ARGS         more srun arguments, split on whitespace ('')
# SLURM
#   MASTER_PORT       rendezvous port (10000 + job id mod 50000; 29500 outside SLURM)
#   MASTER_ADDR       rendezvous host (the first node of the job; 127.0.0.1 outside SLURM)
#   REQUEUE           1: on exit code 75, or a failure, run `scontrol requeue` for this job (1)
#   MAX_FAILED_RESTARTS  requeue after a failure until this many attempts in a row failed without the
#                     checkpoint advancing (3)
#   FAILURE_WAIT      seconds srun lets the other tasks run once one has ended, then ends them (60)
#   DRY_RUN           1: print the resolved commands and the validation, launch nothing (0)
# Elastic jobs (submit with sbatch --nodes=MIN-MAX; docs/slurm.md)
#   ELASTIC           1: choose the layout for the allocation (megatron_ext.cli.elastic), save the
#                     distributed optimizer fully reshardable, and after a task failure requeue the
#                     job without the node it failed on (0)
#   MIN_NODES         the fewest nodes the job runs on (1)
#   ELASTIC_LAYOUT    any: the calculator's best layout for the allocation; dp: keep TP, PP and VP (any)
# Account and partition are sbatch's own: `sbatch -A ACCOUNT -p PARTITION`, or
# SBATCH_ACCOUNT / SBATCH_PARTITION in the environment; the node count is `sbatch -N`.

set -euo pipefail

REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readonly REPO_DIR

log() { printf '[recipe] %s\n' "$*"; }
die() {
  printf '[recipe] error: %s\n' "$*" >&2
  exit "${EXIT_INVALID:-2}" # the exit-code table is read below; 2 is its INVALID
}

# quote and show: one argument per word, quoted only where the shell needs it.
# shellcheck source=recipes/words.sh
source "${REPO_DIR}/recipes/words.sh"

# ------------------------------------------------------------------ the recipe
recipe_file="${BASH_SOURCE[1]:-recipe}"
if [[ "$(basename "${recipe_file}")" == "slurm_script" ]]; then
  recipe_name="${SLURM_JOB_NAME:-recipe}" # sbatch runs a spooled copy
else
  recipe_name="$(basename "${recipe_file}" .sh)"
fi
declare -p MODEL TRAINING >/dev/null 2>&1 || die "${recipe_file} must define the arrays MODEL and TRAINING"

# --------------------------------------------------------------- the defaults
# (the defaults of the flag variables are megatron_ext/cli/recipe.py's)
: "${NNODES:=1}" "${GPUS_PER_NODE:=8}" "${LAUNCHER:=torchrun}" "${GPU_PROFILE:=h100-sxm}"
: "${SRUN_ARGS:=}"
: "${RUN_NAME:=${recipe_name}}"
: "${RUN_DIR:=${REPO_DIR}/runs/${RUN_NAME}}"
: "${CHECKPOINT_DIR:=${RUN_DIR}/checkpoints}" "${LOG_DIR:=${RUN_DIR}/logs}"
: "${METRICS_FILE:=${RUN_DIR}/metrics.jsonl}" "${TENSORBOARD_DIR:=}"
: "${CONTAINER_IMAGE:=}" "${CONTAINER_MOUNTS:=${REPO_DIR}:${REPO_DIR}}"
: "${REQUEUE:=1}" "${DRY_RUN:=0}" "${FAILURE_WAIT:=60}" "${MAX_FAILED_RESTARTS:=3}"
: "${ELASTIC:=0}" "${MIN_NODES:=1}" "${ELASTIC_LAYOUT:=any}"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -n "${CONTAINER_IMAGE}" ]]; then
    PYTHON=python
  elif [[ -x "${REPO_DIR}/.venv/bin/python" ]]; then
    PYTHON="${REPO_DIR}/.venv/bin/python"
  else
    PYTHON=python3
  fi
fi

# ------------------------------------------------------------------ arguments
# Python resolves the variables into the pretrain_gpt.py command line (one flag table,
# megatron_ext/config): pretrain_args, calculator_args (what tools/layout.py models),
# DEVICE, serial_cuda_connections, the exit codes EXIT_* and TRACKER_FILENAME.
# It needs only the standard library, so this machine's interpreter runs it.
host_python="${PYTHON}"
if [[ -n "${CONTAINER_IMAGE}" ]]; then
  host_python=python3
  [[ -x "${REPO_DIR}/.venv/bin/python" ]] && host_python="${REPO_DIR}/.venv/bin/python"
fi
export CHECKPOINT_DIR METRICS_FILE TENSORBOARD_DIR
mapfile -t recipe_variables < <(PYTHONPATH="${REPO_DIR}" "${host_python}" -m megatron_ext.cli.recipe --variables)
((${#recipe_variables[@]})) || die "could not run ${host_python} -m megatron_ext.cli.recipe (set PYTHON)"
export "${recipe_variables[@]}"
resolved="$(PYTHONPATH="${REPO_DIR}" "${host_python}" -m megatron_ext.cli.recipe -- "${MODEL[@]}" "${TRAINING[@]}")" ||
  exit "$?"
declare -a pretrain_args calculator_args
DEVICE="" serial_cuda_connections=0 TRACKER_FILENAME="" EXIT_SAVED_AND_STOPPED="" EXIT_DOES_NOT_FIT=""
eval "${resolved}"
pretrain=("${REPO_DIR}/pretrain_gpt.py" "${pretrain_args[@]}")

# --------------------------------------------------------------- job geometry
in_job=0
[[ -n "${SLURM_JOB_ID:-}" ]] && in_job=1
recipe_nodes="${NNODES}" # what the recipe's layout was written for
if ((in_job)); then
  allocated="${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}"
  if [[ "${allocated}" != "${NNODES}" ]]; then
    log "the allocation has ${allocated} nodes (NNODES was ${NNODES}): using ${allocated}"
  fi
  NNODES="${allocated}"
  if [[ "${DEVICE}" != cpu && -n "${SLURM_GPUS_ON_NODE:-}" && "${SLURM_GPUS_ON_NODE}" != "${GPUS_PER_NODE}" ]]; then
    # The layout was chosen for GPUS_PER_NODE: refuse now rather than fail after start-up.
    die "the allocation has ${SLURM_GPUS_ON_NODE} GPUs per node and GPUS_PER_NODE is ${GPUS_PER_NODE}; set GPUS_PER_NODE=${SLURM_GPUS_ON_NODE} (and a layout that fits it) or ask sbatch for ${GPUS_PER_NODE}"
  fi
  : "${MASTER_PORT:=$((10000 + SLURM_JOB_ID % 50000))}"
  if [[ -z "${MASTER_ADDR:-}" ]]; then
    mapfile -t job_hosts < <(scontrol show hostnames "${SLURM_JOB_NODELIST}")
    # The first host's NodeAddr: what SLURM itself uses to reach it (often the name itself).
    node_line="$(scontrol -o show node "${job_hosts[0]}")"
    if [[ "${node_line}" =~ NodeAddr=([^[:space:]]+) ]]; then
      MASTER_ADDR="${BASH_REMATCH[1]}"
    else
      MASTER_ADDR="${job_hosts[0]}"
    fi
  fi
else
  : "${MASTER_PORT:=29500}" "${MASTER_ADDR:=127.0.0.1}"
fi
[[ "${NNODES}" =~ ^[1-9][0-9]*$ ]] || die "NNODES must be a positive integer, got '${NNODES}'"
[[ "${GPUS_PER_NODE}" =~ ^[1-9][0-9]*$ ]] || die "GPUS_PER_NODE must be a positive integer, got '${GPUS_PER_NODE}'"
[[ "${recipe_nodes}" =~ ^[1-9][0-9]*$ ]] || recipe_nodes="${NNODES}"
WORLD_SIZE=$((NNODES * GPUS_PER_NODE))
export MASTER_ADDR MASTER_PORT
[[ "${FAILURE_WAIT}" =~ ^[0-9]+$ ]] || die "FAILURE_WAIT must be a number of seconds, got '${FAILURE_WAIT}'"

# ---------------------------------------------------------------- environment
export PYTHONPATH="${REPO_DIR}${PYTHONPATH:+:${PYTHONPATH}}"
export PYTHONUNBUFFERED=1
if [[ "${DEVICE}" != cpu ]]; then
  # Megatron-Core orders TP/SP communication behind compute on one hardware queue.
  if ((serial_cuda_connections)); then
    export CUDA_DEVICE_MAX_CONNECTIONS="${CUDA_DEVICE_MAX_CONNECTIONS:-1}"
  fi
  export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
  export TORCH_NCCL_ASYNC_ERROR_HANDLING="${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}"
  export TORCH_NCCL_AVOID_RECORD_STREAMS="${TORCH_NCCL_AVOID_RECORD_STREAMS:-1}"
fi

# ----------------------------------------------------------------- containers
container=()
if [[ -n "${CONTAINER_IMAGE}" ]]; then
  container=(--container-image "${CONTAINER_IMAGE}" --container-mounts "${CONTAINER_MOUNTS}"
    --container-workdir "${REPO_DIR}")
fi
read -r -a srun_extra <<<"${SRUN_ARGS}"

# ---------------------------------------------------------- checking commands
# The validating commands run where training would: in a job with a container, as
# a one-task step in that container; outside a job a container's Python is not
# here, so this machine's (the repository's .venv, else python3) stands in.
validator=("${PYTHON}")
if [[ -n "${CONTAINER_IMAGE}" ]]; then
  if ((in_job)); then
    validator=(srun --nodes 1 --ntasks 1 "${container[@]}" "${srun_extra[@]}" "${PYTHON}")
  elif [[ -x "${REPO_DIR}/.venv/bin/python" ]]; then
    validator=("${REPO_DIR}/.venv/bin/python")
  else
    validator=(python3)
  fi
fi

# -------------------------------------------------------------------- elastic
# The layout follows the allocation: the recipe's own where it runs, else re-planned from the
# checkpoint's (megatron_ext/cli/elastic.py); pretrain_args and calculator_args are replaced.
relayout_record=""
if [[ "${ELASTIC}" == 1 ]]; then
  [[ "${MIN_NODES}" =~ ^[1-9][0-9]*$ ]] || die "MIN_NODES must be a positive integer, got '${MIN_NODES}'"
  if ((NNODES < MIN_NODES)); then
    die "${NNODES} nodes is fewer than MIN_NODES=${MIN_NODES}: submit with" \
      "sbatch --nodes=${MIN_NODES}-$((recipe_nodes > MIN_NODES ? recipe_nodes : MIN_NODES))"
  fi
  planned="$("${validator[@]}" -m megatron_ext.cli.elastic --world-size "${WORLD_SIZE}" \
    --gpus-per-node "${GPUS_PER_NODE}" --gpu "${GPU_PROFILE}" --recipe-world-size "$((recipe_nodes * GPUS_PER_NODE))" \
    --checkpoint-dir "${CHECKPOINT_DIR}" --policy "${ELASTIC_LAYOUT}" -- "${pretrain_args[@]}")" || exit "$?"
  eval "${planned}"
  pretrain=("${REPO_DIR}/pretrain_gpt.py" "${pretrain_args[@]}")
fi

# ------------------------------------------------------------- launch command
cpus_on_node="${SLURM_CPUS_ON_NODE:-${GPUS_PER_NODE}}"
torchrun_args=(--nnodes "${NNODES}" --nproc-per-node "${GPUS_PER_NODE}"
  --master-addr "${MASTER_ADDR}" --master-port "${MASTER_PORT}")

# Per-task values (SLURM_NODEID, SLURM_PROCID, ...) exist only inside each srun
# task, so a one-line shim expands them there, on the task's own node.
# shellcheck disable=SC2016
node_task=(bash -c 'exec "$0" -m megatron_ext.cli.launch --node-rank "${SLURM_NODEID}" "$@"')
# shellcheck disable=SC2016
gpu_task=(bash -c 'export RANK="${SLURM_PROCID}" LOCAL_RANK="${SLURM_LOCALID}" WORLD_SIZE="${SLURM_NTASKS}"; exec "$@"')

job_log_dir=""
if ((in_job)); then
  job_log_dir="${LOG_DIR}/${SLURM_JOB_ID}.${SLURM_RESTART_COUNT:-0}"
else
  job_log_dir="${LOG_DIR}/local-$(date +%Y%m%d-%H%M%S)-$$"
fi

# --kill-on-bad-exit=0: every node finishes its save and reports its own code (75);
# --wait: once one task has ended, the others get FAILURE_WAIT seconds, so a dead node's
# peers do not wait in a collective until its timeout.
srun_common=(srun --nodes "${NNODES}" --kill-on-bad-exit=0 --wait "${FAILURE_WAIT}" --output "${job_log_dir}/node%n-%N.log"
  "${container[@]}" "${srun_extra[@]}")
case "${LAUNCHER}" in
  torchrun)
    # --ntasks explicitly: sbatch exports SLURM_NTASKS, which srun would otherwise obey.
    job_launch=("${srun_common[@]}" --ntasks "${NNODES}" --ntasks-per-node 1 --cpus-per-task "${cpus_on_node}"
      "${node_task[@]}" "${PYTHON}" "${torchrun_args[@]}" "${pretrain[@]}")
    # shellcheck disable=SC2016  # shown as written: each task has its own value
    per_task=("${PYTHON}" -m megatron_ext.cli.launch "${torchrun_args[@]}" --node-rank '$SLURM_NODEID' "${pretrain[@]}")
    ;;
  srun)
    cpus_per_task=$((cpus_on_node / GPUS_PER_NODE))
    ((cpus_per_task >= 1)) || cpus_per_task=1
    job_launch=("${srun_common[@]}" --ntasks "${WORLD_SIZE}" --ntasks-per-node "${GPUS_PER_NODE}"
      --cpus-per-task "${cpus_per_task}"
      "${gpu_task[@]}" srun-task "${PYTHON}" "${pretrain[@]}")
    # shellcheck disable=SC2016  # shown as written: each task has its own value
    per_task=(RANK='$SLURM_PROCID' LOCAL_RANK='$SLURM_LOCALID' WORLD_SIZE='$SLURM_NTASKS' "${PYTHON}" "${pretrain[@]}")
    ;;
  *) die "LAUNCHER must be torchrun or srun, got '${LAUNCHER}'" ;;
esac
# Outside SLURM one machine runs torchrun itself; without a container only (pyxis needs srun).
local_launch=()
if ((!in_job && NNODES == 1)) && [[ -z "${CONTAINER_IMAGE}" ]]; then
  local_launch=("${PYTHON}" -m megatron_ext.cli.launch "${torchrun_args[@]}" "${pretrain[@]}")
fi
if ((in_job)); then
  launch=("${job_launch[@]}")
elif ((${#local_launch[@]})); then
  launch=("${local_launch[@]}")
elif [[ "${DRY_RUN}" != 1 ]]; then
  if [[ -n "${CONTAINER_IMAGE}" ]]; then
    die "CONTAINER_IMAGE needs srun (pyxis): submit with sbatch, or DRY_RUN=1 to see the commands"
  fi
  die "outside SLURM only NNODES=1 runs here (got ${NNODES}): submit with sbatch, or DRY_RUN=1 to see the commands"
fi

# ------------------------------------------------------------------ validation
dry_run_cmd=("${validator[@]}" "${pretrain[@]}" --dry-run --world-size "${WORLD_SIZE}")
calculator_cmd=("${validator[@]}" "${REPO_DIR}/tools/layout.py" --gpus "${WORLD_SIZE}"
  --gpus-per-node "${GPUS_PER_NODE}" --gpu "${GPU_PROFILE}" "${calculator_args[@]}")

# Exit status 0 when the layout is valid and estimated to fit; otherwise the
# validators' own code (2: invalid, 3: does not fit), their messages on stderr.
validate() {
  local rc=0
  log "validation: pretrain_gpt.py --dry-run for world size ${WORLD_SIZE} = ${NNODES} × ${GPUS_PER_NODE}"
  "${dry_run_cmd[@]}" || rc=$?
  if ((rc != 0)); then
    log "refusing to start: pretrain_gpt.py --dry-run rejected this layout (exit ${rc})"
    return "${rc}"
  fi
  if [[ "${GPU_PROFILE}" == none ]]; then
    log "memory estimate: skipped (GPU_PROFILE=none: CPU processes)"
  elif [[ ! -f "${REPO_DIR}/tools/layout.py" ]]; then
    log "memory estimate: skipped (tools/layout.py is not in this checkout)"
  else
    log "memory estimate: tools/layout.py for ${WORLD_SIZE} × ${GPU_PROFILE}"
    "${calculator_cmd[@]}" || rc=$?
    case "${rc}" in
      0) ;;
      "${EXIT_DOES_NOT_FIT}") log "refusing to start: estimated not to fit on GPU_PROFILE=${GPU_PROFILE} (the calculator says why above)" ;;
      *) log "refusing to start: tools/layout.py rejected this layout (exit ${rc})" ;;
    esac
  fi
  return "${rc}"
}

describe() {
  local nodes="${NNODES} nodes"
  ((NNODES > 1)) || nodes="1 node"
  log "${RUN_NAME}: ${nodes} × ${GPUS_PER_NODE} = ${WORLD_SIZE} processes, launcher ${LAUNCHER}"
  if ((in_job)) || [[ "${DRY_RUN}" == 1 ]]; then
    if ((in_job)); then
      log "the job runs:"
    else
      log "in a job the batch script runs (outside SLURM: NNODES=${NNODES}; in a job MASTER_ADDR is the first node and MASTER_PORT derives from the job id):"
    fi
    show "${job_launch[@]}"
    log "each task runs:"
    show "${per_task[@]}"
  fi
  if ((!in_job && ${#local_launch[@]})); then
    log "outside SLURM this machine runs:"
    show "${local_launch[@]}"
  fi
}

if [[ "${DRY_RUN}" == 1 ]]; then
  describe
  rc=0
  validate || rc=$?
  log "DRY_RUN=1: nothing launched"
  exit "${rc}"
fi

# --------------------------------------------------------------------- launch
mkdir -p "${job_log_dir}" "${CHECKPOINT_DIR}" "$(dirname "${METRICS_FILE}")"
{
  describe
  printf '\n# validation\n'
  show "${dry_run_cmd[@]}"
  show "${calculator_cmd[@]}"
} >"${job_log_dir}/command.sh"
{
  printf 'date: %s\nhost: %s\nrepository: %s (%s)\npython: %s\ncontainer: %s\n' \
    "$(date -Is)" "$(hostname)" "${REPO_DIR}" "$(git -C "${REPO_DIR}" rev-parse --short HEAD 2>/dev/null || echo '?')" \
    "${PYTHON}" "${CONTAINER_IMAGE:-none}"
  printf 'nodes: %s × %s = %s processes, master %s:%s\n' "${NNODES}" "${GPUS_PER_NODE}" "${WORLD_SIZE}" "${MASTER_ADDR}" "${MASTER_PORT}"
  env | grep -E '^(SLURM_|SBATCH_|NCCL_|CUDA_|TORCH_|NVTE_|GLOO_|OMP_|MASTER_|PYTHONPATH=)' | sort || true
} >"${job_log_dir}/environment.txt"

describe
validate 2>&1 | tee "${job_log_dir}/validation.txt"
rc="${PIPESTATUS[0]}"
((rc == 0)) || exit "${rc}"

tracker="${CHECKPOINT_DIR}/${TRACKER_FILENAME}"
resumed_from="$(cat "${tracker}" 2>/dev/null || echo 0)"
if [[ -n "${relayout_record}" ]]; then
  printf '%s\n' "${relayout_record}" >>"${METRICS_FILE}"
fi
if ((in_job)) && [[ "${SLURM_RESTART_COUNT:-0}" != 0 ]]; then
  log "restart ${SLURM_RESTART_COUNT} of job ${SLURM_JOB_ID}: resuming from iteration ${resumed_from} under ${CHECKPOINT_DIR}"
fi
log "logs: ${job_log_dir}"

# Training runs in the background so that signals sent to this shell (sbatch
# --signal=B:USR1@...) are forwarded at once; plain --signal=USR1@... reaches
# the job step's processes directly.
child=""
# shellcheck disable=SC2317  # called by the traps below
forward() {
  [[ -n "${child}" ]] && kill -s "$1" "${child}" 2>/dev/null
  return 0
}
for sig in USR1 USR2 TERM INT; do
  # shellcheck disable=SC2064
  trap "forward ${sig}" "${sig}"
done
start_seconds="${SECONDS}"
# srun's own messages (which task failed, on which node) are kept for the failure handling below.
"${launch[@]}" 2> >(tee -a "${job_log_dir}/launcher.log" >&2) &
child=$!
rc=0
wait "${child}" || rc=$?
while kill -0 "${child}" 2>/dev/null; do # a forwarded signal interrupted wait
  rc=0
  wait "${child}" || rc=$?
done
log "training exited with ${rc} after $((SECONDS - start_seconds)) s"
if ((in_job)); then
  last_log="$(find "${job_log_dir}" -name '*.log' -newer "${job_log_dir}/command.sh" | sort -V | tail -n 1)"
  [[ -n "${last_log}" ]] && tail -n 5 "${last_log}"
fi

# ------------------------------------------------------------ requeue
# An elastic job leaves the node a task failed on out of its next allocation (the job's
# ExcNodeList; the nodes the user excluded stay excluded) and gives it back at the next
# requeue. The list is kept in LOG_DIR because a requeue starts the script afresh.
ours_file="${LOG_DIR}/${SLURM_JOB_ID:-local}.excluded"

hostnames() { # a SLURM host list, one name per line ('' and (null): none)
  [[ -n "$1" && "$1" != "(null)" ]] && scontrol show hostnames "$1"
  return 0
}

# Requeue this job; $1: the nodes to leave out of its next allocation ('': none).
requeue() {
  local record="" current="" ours wanted
  record="$(scontrol -o show job "${SLURM_JOB_ID}")" || true
  [[ "${record}" =~ ExcNodeList=([^[:space:]]*) ]] && current="${BASH_REMATCH[1]}"
  ours="$(cat "${ours_file}" 2>/dev/null || true)"
  wanted="$(
    {
      hostnames "${current}" | grep -vxF -f <(hostnames "${ours}") || true
      hostnames "$1"
    } | sort -u | paste -sd, -
  )"
  # The requeue sends this script SIGTERM: ignore it from here on, in the commands below too.
  trap '' TERM
  scontrol requeue "${SLURM_JOB_ID}" || return 1
  if [[ -n "$1" ]]; then printf '%s\n' "$1" >"${ours_file}"; else rm -f "${ours_file}"; fi
  # A pending job's ExcNodeList can change (a running one's cannot).
  if [[ "${wanted}" != "$(hostnames "${current}" | sort -u | paste -sd, -)" ]]; then
    scontrol update "JobId=${SLURM_JOB_ID}" "ExcNodeList=${wanted}" ||
      log "could not set the job's excluded nodes to '${wanted}'"
  fi
}

saved_at="$(cat "${tracker}" 2>/dev/null || echo 0)"
# Progress counts from the checkpoint this attempt loaded: below resumed_from when the run fell back
# from a damaged latest checkpoint (each rank logs "loaded checkpoint DIR (iteration N)").
loaded_from="$(sed -n 's/.* loaded checkpoint .* (iteration \([0-9]*\))$/\1/p' "${job_log_dir}"/*.log 2>/dev/null |
  head -n 1)"
loaded_from="${loaded_from:-${resumed_from}}"
if ((rc == EXIT_SAVED_AND_STOPPED)); then
  if ((saved_at <= loaded_from)); then
    # Requeueing would only wait in the queue to make no progress again.
    log "stopped early but the checkpoint did not advance (iteration ${saved_at}): not requeueing;" \
      "give the job more time than start-up + one iteration + a save (--time, --signal=USR1@N)"
  elif ((in_job)) && [[ "${REQUEUE}" == 1 ]]; then
    if requeue ""; then
      log "stopped early with a checkpoint: job ${SLURM_JOB_ID} requeued, it resumes from ${CHECKPOINT_DIR}"
    else
      log "stopped early with a checkpoint; requeue refused (submit with --requeue): sbatch the recipe again to continue"
    fi
  else
    log "stopped early with a checkpoint: run the same command again to continue"
  fi
elif ((rc != 0 && in_job)); then
  # A failure (a killed task, a lost node, a failed save) is requeued too, from the newest complete
  # checkpoint, until MAX_FAILED_RESTARTS attempts in a row have failed without the checkpoint advancing.
  failed_node=""
  if [[ "${ELASTIC}" == 1 ]]; then
    # srun names every task that ended badly, the first one first: "srun: error: NODE: task N: ...".
    failed_node="$(sed -n 's/^srun: error: \([^:[:space:]]*\): tasks\{0,1\} [0-9,-]*: .*/\1/p' \
      "${job_log_dir}/launcher.log" | head -n 1)"
  fi
  where="${failed_node:+, first on ${failed_node}}"
  failures_file="${LOG_DIR}/${SLURM_JOB_ID}.failures"
  last_failed_at="" failures=0
  read -r last_failed_at failures <"${failures_file}" 2>/dev/null || true
  if [[ "${last_failed_at}" == "${saved_at}" ]]; then
    failures=$((failures + 1))
  else
    failures=1
  fi
  if [[ "${ELASTIC}" == 1 && -z "${failed_node}" ]]; then
    log "training failed (exit ${rc}) and srun named no failed task: not requeueing"
  elif ((failures > MAX_FAILED_RESTARTS)); then
    log "training failed (exit ${rc}${where}) ${failures} times in a row from the checkpoint of iteration" \
      "${saved_at}: not requeueing (MAX_FAILED_RESTARTS=${MAX_FAILED_RESTARTS}; look at ${job_log_dir})"
  elif [[ "${REQUEUE}" != 1 ]]; then
    log "training failed (exit ${rc}${where}): REQUEUE=0, not requeueing"
  else
    printf '%s %s\n' "${saved_at}" "${failures}" >"${failures_file}"
    if requeue "${failed_node}"; then
      if [[ -n "${failed_node}" ]]; then
        log "training failed (exit ${rc})${where}: job ${SLURM_JOB_ID} requeued without" \
          "${failed_node}; it resumes from iteration ${saved_at} on the nodes it gets (at least MIN_NODES=${MIN_NODES})"
      else
        log "training failed (exit ${rc}): job ${SLURM_JOB_ID} requeued (failure ${failures} of at most" \
          "${MAX_FAILED_RESTARTS} in a row from iteration ${saved_at}); it resumes from the newest complete checkpoint"
      fi
    else
      log "training failed (exit ${rc}${where}); requeue refused (submit with --requeue)"
    fi
  fi
fi
exit "${rc}"
