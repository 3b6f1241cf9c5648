#!/usr/bin/env bash
# GPT-3 175B written the way Megatron-LM's examples/gpt3/train_gpt3_175b_distributed.sh is: flag arrays
# handed to torchrun and pretrain_gpt.py, Megatron-LM's flag names throughout. Its schedule is the GPT-3
# paper's in samples (300B tokens, batch ramp-up from 16 to 1536 over 12B tokens, warm-up over 375M tokens,
# cosine decay over 260B tokens), which Megatron-LM only accepts samples-based.
#
#   bash examples/megatron-lm/gpt3_175b.sh CHECKPOINT_PATH [TENSORBOARD_DIR] [VOCAB_FILE MERGE_FILE DATA_PATH]
#
# Without data, mock data and a 50,257-token null tokenizer. DRY_RUN=1 validates the whole job for its world
# size on this machine (pretrain_gpt.py --dry-run) instead of launching it.
# PYTHON: the interpreter (default: the repository's .venv/bin/python, made by bash scripts/setup.sh, else python3).
set -euo pipefail

export CUDA_DEVICE_MAX_CONNECTIONS=1

GPUS_PER_NODE=${GPUS_PER_NODE:-8}
NUM_NODES=${NUM_NODES:-128}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-6000}
WORLD_SIZE=$((GPUS_PER_NODE * NUM_NODES))

CHECKPOINT_PATH=${1:?usage: gpt3_175b.sh CHECKPOINT_PATH [TENSORBOARD_DIR] [VOCAB_FILE MERGE_FILE DATA_PATH]}
TENSORBOARD_LOGS_PATH=${2:-}
VOCAB_FILE=${3:-}
MERGE_FILE=${4:-}
DATA_PATH=${5:-}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# The project's environment (bash scripts/setup.sh makes it), unless PYTHON names another interpreter.
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$REPO/.venv/bin/python" ]]; then PYTHON="$REPO/.venv/bin/python"; else PYTHON=python3; fi
fi

DISTRIBUTED_ARGS=(
    --nproc_per_node "$GPUS_PER_NODE"
    --nnodes "$NUM_NODES"
    --node_rank "$NODE_RANK"
    --master_addr "$MASTER_ADDR"
    --master_port "$MASTER_PORT"
)

GPT_MODEL_ARGS=(
    --num-layers 96
    --hidden-size 12288
    --num-attention-heads 96
    --seq-length 2048
    --max-position-embeddings 2048
    --attention-backend auto
)

TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 1536
    --rampup-batch-size 16 16 5859375
    --train-samples 146484375
    --weight-decay 0.1
    --adam-beta1 0.9
    --adam-beta2 0.95
    --init-method-std 0.006
    --clip-grad 1.0
    --bf16
    --lr 6.0e-5
    --lr-decay-style cosine
    --min-lr 6.0e-6
    --lr-warmup-samples 183105
    --lr-decay-samples 126953125
)

MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 8
    --pipeline-model-parallel-size 16
    --sequence-parallel
    --use-distributed-optimizer
)

if [[ -n "$DATA_PATH" ]]; then
    DATA_ARGS=(--data-path "$DATA_PATH" --vocab-file "$VOCAB_FILE" --merge-file "$MERGE_FILE" --split "949,50,1")
else
    DATA_ARGS=(--mock-data --tokenizer-type NullTokenizer --vocab-size 50257)
fi

EVAL_AND_LOGGING_ARGS=(
    --log-interval 100
    --save-interval 10000
    --eval-interval 1000
    --save "$CHECKPOINT_PATH"
    --load "$CHECKPOINT_PATH"
    --eval-iters 10
)
if [[ -n "$TENSORBOARD_LOGS_PATH" ]]; then
    EVAL_AND_LOGGING_ARGS+=(--tensorboard-dir "$TENSORBOARD_LOGS_PATH")
fi

ARGS=("${GPT_MODEL_ARGS[@]}" "${TRAINING_ARGS[@]}" "${MODEL_PARALLEL_ARGS[@]}" "${DATA_ARGS[@]}"
    "${EVAL_AND_LOGGING_ARGS[@]}")
if [[ "${DRY_RUN:-0}" == 1 ]]; then
    exec "$PYTHON" "$REPO/pretrain_gpt.py" --dry-run --world-size "$WORLD_SIZE" "${ARGS[@]}"
fi
exec "$PYTHON" -m torch.distributed.run "${DISTRIBUTED_ARGS[@]}" "$REPO/pretrain_gpt.py" "${ARGS[@]}"
