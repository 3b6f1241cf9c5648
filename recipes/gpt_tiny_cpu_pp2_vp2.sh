#!/usr/bin/env bash
# Rehearsal on CPU nodes: a tiny GPT with its pipeline across two nodes (PP 2,
# 2 virtual stages per rank, interleaved 1F1B), one gloo process per node, mock
# data. The same launcher, validation, signal handling and requeue as the GPU
# recipes, in under a minute:
#
#   sbatch -N 2 recipes/gpt_tiny_cpu_pp2_vp2.sh
#   NNODES=1 GPUS_PER_NODE=2 bash recipes/gpt_tiny_cpu_pp2_vp2.sh    # one machine, no SLURM
#
#SBATCH --job-name=gpt_tiny_cpu_pp2_vp2
#SBATCH --nodes=2
#SBATCH --time=00:15:00
#SBATCH --signal=USR1@60
#SBATCH --requeue
#SBATCH --open-mode=append
set -euo pipefail

# Layout: one process per node ("GPUS_PER_NODE" counts processes), PP 2 across the nodes.
: "${NNODES:=2}" "${GPUS_PER_NODE:=1}" "${DEVICE:=cpu}" "${GPU_PROFILE:=none}"
: "${TP:=1}" "${PP:=2}" "${VP_LAYERS:=1}" "${MICRO_BATCH:=2}" "${GLOBAL_BATCH:=8}" "${PRECISION:=fp32}"
: "${TRAIN_ITERS:=40}" "${LOG_INTERVAL:=1}" "${SAVE_INTERVAL:=20}" "${EVAL_INTERVAL:=20}" "${EVAL_ITERS:=2}"
: "${OMP_NUM_THREADS:=1}"
export OMP_NUM_THREADS

# The shape: megatron_ext/config/presets.py (the calculator's --model gpt-tiny too).
MODEL=(--model gpt-tiny)
TRAINING=(--lr 3e-3 --min-lr 3e-4 --lr-warmup-iters 4 --lr-decay-style cosine
  --weight-decay 0.01 --clip-grad 1.0 --seed 1234)

# sbatch runs a spooled copy of this file: the recipes are then in $REPO_DIR, else the submit directory.
recipes="$(dirname "${BASH_SOURCE[0]}")"
[[ -f "${recipes}/common.sh" ]] || recipes="${REPO_DIR:-${SLURM_SUBMIT_DIR:-.}}/recipes"
# shellcheck source=recipes/common.sh
source "${recipes}/common.sh"
