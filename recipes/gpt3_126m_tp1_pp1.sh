#!/usr/bin/env bash
# GPT-3 Small (125M; 12 layers, hidden 768, 12 heads, 2,048 tokens) on one node:
# data parallel over its 8 GPUs, the distributed optimizer, the GPT-3 paper's
# 0.5M-token batch, learning rate and 300B-token schedule (Brown et al. 2020, table 2.1).
#
#   sbatch recipes/gpt3_126m_tp1_pp1.sh                 # DATA_PATH=... TOKENIZER_MODEL=... for real data
#   DRY_RUN=1 bash recipes/gpt3_126m_tp1_pp1.sh         # the resolved commands and the validation
#
#SBATCH --job-name=gpt3_126m_tp1_pp1
#SBATCH --nodes=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --time=04:00:00
#SBATCH --signal=USR1@300
#SBATCH --requeue
#SBATCH --open-mode=append
set -euo pipefail

# Layout: DP 8 inside the node.
: "${NNODES:=1}" "${GPUS_PER_NODE:=8}"
: "${TP:=1}" "${PP:=1}" "${DISTRIBUTED_OPTIMIZER:=1}" "${MICRO_BATCH:=8}" "${GLOBAL_BATCH:=256}"
# 300B tokens at 524,288 per step; cosine decay over 260B tokens, warm-up 375M tokens.
: "${TRAIN_ITERS:=572205}" "${SAVE_INTERVAL:=2000}" "${EVAL_INTERVAL:=2000}"

# The shape: megatron_ext/config/presets.py (the calculator's --model gpt3-126m too).
MODEL=(--model gpt3-126m)
TRAINING=(--lr 6e-4 --min-lr 6e-5 --lr-decay-style cosine --lr-warmup-iters 715 --lr-decay-iters 495911
  --adam-beta1 0.9 --adam-beta2 0.95 --adam-eps 1e-8 --weight-decay 0.1 --clip-grad 1.0
  --init-method-std 0.02 --seed 1234)

# sbatch runs a spooled copy of this file: the recipes are then in $REPO_DIR, else the submit directory.
recipes="$(dirname "${BASH_SOURCE[0]}")"
[[ -f "${recipes}/common.sh" ]] || recipes="${REPO_DIR:-${SLURM_SUBMIT_DIR:-.}}/recipes"
# shellcheck source=recipes/common.sh
source "${recipes}/common.sh"
