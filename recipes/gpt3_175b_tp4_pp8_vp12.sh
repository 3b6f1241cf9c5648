#!/usr/bin/env bash
# GPT-3 175B (96 layers, hidden 12288, 96 heads, 2,048 tokens) on 16 nodes:
# TP 4 inside each node with sequence parallelism, PP 8 across nodes with
# 1 layer per virtual stage (VP 12, interleaved 1F1B), DP over the remaining
# node groups with the distributed optimizer; the GPT-3 paper's 3.2M-token batch,
# learning rate and 300B-token schedule (Brown et al. 2020, table 2.1).
# The layout is the calculator's best for these GPUs (tools/layout.py; TP 8 PP 8
# VP 4 is about 10% slower by its model) and NVIDIA's own tuned GPT-3 175B
# layout (MLPerf Training v3.1: TP 4, PP 8, 12 virtual stages); it needs about
# 68 GiB of the 80.
#
#   sbatch recipes/gpt3_175b_tp4_pp8_vp12.sh            # sbatch -N 64 ...: DP 16 (nodes: a multiple of 4)
#   DRY_RUN=1 NNODES=64 bash recipes/gpt3_175b_tp4_pp8_vp12.sh
#
#SBATCH --job-name=gpt3_175b_tp4_pp8_vp12
#SBATCH --nodes=16
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --time=04:00:00
#SBATCH --signal=USR1@900
#SBATCH --requeue
#SBATCH --open-mode=append
set -euo pipefail

# Layout: TP 4 within a node, PP 8 across nodes (12 layers per stage, 12 virtual stages of 1), DP = nodes / 4.
: "${NNODES:=16}" "${GPUS_PER_NODE:=8}"
: "${TP:=4}" "${PP:=8}" "${VP_LAYERS:=1}" "${SEQUENCE_PARALLEL:=1}" "${DISTRIBUTED_OPTIMIZER:=1}"
: "${RECOMPUTE:=selective}" "${MICRO_BATCH:=1}" "${GLOBAL_BATCH:=1536}"
# 300B tokens at 3,145,728 per step; cosine decay over 260B tokens, warm-up 375M tokens.
: "${TRAIN_ITERS:=95367}" "${SAVE_INTERVAL:=200}" "${EVAL_INTERVAL:=1000}"

# The shape: megatron_ext/config/presets.py (the calculator's --model gpt3-175b too).
MODEL=(--model gpt3-175b)
TRAINING=(--lr 6e-5 --min-lr 6e-6 --lr-decay-style cosine --lr-warmup-iters 120 --lr-decay-iters 82652
  --adam-beta1 0.9 --adam-beta2 0.95 --adam-eps 1e-8 --weight-decay 0.1 --clip-grad 1.0
  --init-method-std 0.006 --seed 1234)

# sbatch runs a spooled copy of this file: the recipes are then in $REPO_DIR, else the submit directory.
recipes="$(dirname "${BASH_SOURCE[0]}")"
[[ -f "${recipes}/common.sh" ]] || recipes="${REPO_DIR:-${SLURM_SUBMIT_DIR:-.}}/recipes"
# shellcheck source=recipes/common.sh
source "${recipes}/common.sh"
