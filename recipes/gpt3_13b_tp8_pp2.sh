#!/usr/bin/env bash
# GPT-3 13B (40 layers, hidden 5120 as in Megatron-LM — the paper's 5140 does not
# split over 40 heads — 2,048 tokens) on 4 nodes: TP 8 inside each node with
# sequence parallelism, PP 2 across nodes (20 layers per stage), DP over the
# remaining node pairs with the distributed optimizer; the GPT-3 paper's 2M-token
# batch, learning rate and 300B-token schedule (Brown et al. 2020, table 2.1).
#
#   sbatch recipes/gpt3_13b_tp8_pp2.sh                  # sbatch -N 8 ...: DP 4 (any even node count)
#   DRY_RUN=1 NNODES=8 bash recipes/gpt3_13b_tp8_pp2.sh
#
#SBATCH --job-name=gpt3_13b_tp8_pp2
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --time=04:00:00
#SBATCH --signal=USR1@600
#SBATCH --requeue
#SBATCH --open-mode=append
set -euo pipefail

# Layout: TP 8 within a node, PP 2 across nodes, DP = nodes / 2.
: "${NNODES:=4}" "${GPUS_PER_NODE:=8}"
: "${TP:=8}" "${PP:=2}" "${SEQUENCE_PARALLEL:=1}" "${DISTRIBUTED_OPTIMIZER:=1}" "${RECOMPUTE:=selective}"
: "${MICRO_BATCH:=1}" "${GLOBAL_BATCH:=1024}"
# 300B tokens at 2,097,152 per step; cosine decay over 260B tokens, warm-up 375M tokens.
: "${TRAIN_ITERS:=143051}" "${SAVE_INTERVAL:=500}" "${EVAL_INTERVAL:=1000}"

# The shape: megatron_ext/config/presets.py (the calculator's --model gpt3-13b too).
MODEL=(--model gpt3-13b)
TRAINING=(--lr 1e-4 --min-lr 1e-5 --lr-decay-style cosine --lr-warmup-iters 179 --lr-decay-iters 123978
  --adam-beta1 0.9 --adam-beta2 0.95 --adam-eps 1e-8 --weight-decay 0.1 --clip-grad 1.0
  --init-method-std 0.009 --seed 1234)

# sbatch runs a spooled copy of this file: the recipes are then in $REPO_DIR, else the submit directory.
recipes="$(dirname "${BASH_SOURCE[0]}")"
[[ -f "${recipes}/common.sh" ]] || recipes="${REPO_DIR:-${SLURM_SUBMIT_DIR:-.}}/recipes"
# shellcheck source=recipes/common.sh
source "${recipes}/common.sh"
