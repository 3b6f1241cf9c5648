#!/usr/bin/env bash
# GPT-3 13B (40 layers, hidden 5120 as in Megatron-LM — the paper's 5140 does not
# split over 40 heads — 2,048 tokens) on 4 nodes: no tensor parallelism, PP 2
# across nodes with 2 layers per virtual stage (VP 10, interleaved 1F1B), DP
# over the remaining GPUs with the distributed optimizer; the GPT-3 paper's
# 2M-token batch, learning rate and 300B-token schedule (Brown et al. 2020,
# table 2.1). The layout is the calculator's best for these GPUs (tools/layout.py):
# at hidden 5120, TP 8 splits every GEMM into 640-wide slices and adds four
# collectives per layer, about 40% slower by its model; NVIDIA's tuned Llama 2
# 13B layout is likewise TP 1 with PP and VP. It needs about 55 GiB of the 80.
#
#   sbatch recipes/gpt3_13b_tp1_pp2_vp10.sh             # sbatch -N 8 ...: DP 32 (nodes: a power of 2)
#   DRY_RUN=1 NNODES=8 bash recipes/gpt3_13b_tp1_pp2_vp10.sh
#
#SBATCH --job-name=gpt3_13b_tp1_pp2_vp10
#SBATCH --nodes=4
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --time=04:00:00
#SBATCH --signal=USR1@600
#SBATCH --requeue
#SBATCH --open-mode=append
set -euo pipefail

# Layout: PP 2 across nodes (20 layers per stage, 10 virtual stages of 2), DP = 4 × nodes.
: "${NNODES:=4}" "${GPUS_PER_NODE:=8}"
: "${TP:=1}" "${PP:=2}" "${VP_LAYERS:=2}" "${SEQUENCE_PARALLEL:=0}" "${DISTRIBUTED_OPTIMIZER:=1}"
: "${RECOMPUTE:=selective}"
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
