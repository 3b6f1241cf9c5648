#!/usr/bin/env bash
# GPT-3 XL (1.3B; 24 layers, hidden 2048, 16 heads, 2,048 tokens) on one node:
# data parallel over its 8 GPUs, the distributed optimizer, the GPT-3 paper's
# 1M-token batch, learning rate and 300B-token schedule (Brown et al. 2020, table 2.1).
#
#   sbatch recipes/gpt3_1.3b_tp1_pp1.sh                 # DATA_PATH=... TOKENIZER_MODEL=... for real data
#   DRY_RUN=1 bash recipes/gpt3_1.3b_tp1_pp1.sh
#
#SBATCH --job-name=gpt3_1.3b_tp1_pp1
#SBATCH --nodes=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --time=04:00:00
#SBATCH --signal=USR1@300
#SBATCH --requeue
#SBATCH --open-mode=append
set -euo pipefail

# Layout: DP 8 inside the node; selective recomputation keeps the attention scores out of memory.
: "${NNODES:=1}" "${GPUS_PER_NODE:=8}"
: "${TP:=1}" "${PP:=1}" "${DISTRIBUTED_OPTIMIZER:=1}" "${RECOMPUTE:=selective}"
: "${MICRO_BATCH:=4}" "${GLOBAL_BATCH:=512}"
# 300B tokens at 1,048,576 per step; cosine decay over 260B tokens, warm-up 375M tokens.
: "${TRAIN_ITERS:=286102}" "${SAVE_INTERVAL:=1000}" "${EVAL_INTERVAL:=1000}"

# The shape: megatron_ext/config/presets.py (the calculator's --model gpt3-1.3b too).
MODEL=(--model gpt3-1.3b)
TRAINING=(--lr 2e-4 --min-lr 2e-5 --lr-decay-style cosine --lr-warmup-iters 358 --lr-decay-iters 247955
  --adam-beta1 0.9 --adam-beta2 0.95 --adam-eps 1e-8 --weight-decay 0.1 --clip-grad 1.0
  --init-method-std 0.014 --seed 1234)

# sbatch runs a spooled copy of this file: the recipes are then in $REPO_DIR, else the submit directory.
recipes="$(dirname "${BASH_SOURCE[0]}")"
[[ -f "${recipes}/common.sh" ]] || recipes="${REPO_DIR:-${SLURM_SUBMIT_DIR:-.}}/recipes"
# shellcheck source=recipes/common.sh
source "${recipes}/common.sh"
