#!/usr/bin/env bash
# Llama 3 8B written the way Megatron-LM's examples/llama/train_llama3_8b_h100_fp8.sh is: grouped-query
# attention, rotary positions, SwiGLU, zero-centred norms, untied output, samples-based schedule with
# decoupled learning rates for the embedding and output layer, per-token loss, manual garbage collection.
#
#   bash examples/megatron-lm/llama3_8b.sh CHECKPOINT_PATH [TENSORBOARD_DIR] [TOKENIZER_DIR|MOCK] [DATA_PATH|MOCK]
#
# DTYPE=fp8 adds Megatron-LM's FP8 flags, which need Transformer Engine's layers on GPUs (refused before launch on CPU, with
# that reason); the default is bf16. CP_SIZE splits each 8,192-token sequence (Transformer Engine's attention).
# DRY_RUN=1 validates the whole job for its world size on this machine instead of launching it.
# PYTHON: the interpreter (default: the repository's .venv/bin/python, made by bash scripts/setup.sh, else python3).
set -euo pipefail

export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}

CHECKPOINT_PATH=${1:?usage: llama3_8b.sh CHECKPOINT_PATH [TENSORBOARD_DIR] [TOKENIZER_DIR|MOCK] [DATA_PATH|MOCK]}
TENSORBOARD_LOGS_PATH=${2:-}
TOKENIZER_ARG=${3:-MOCK}
DATA_ARG=${4:-MOCK}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# The project's environment (bash scripts/setup.sh makes it), unless PYTHON names another interpreter.
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$REPO/.venv/bin/python" ]]; then PYTHON="$REPO/.venv/bin/python"; else PYTHON=python3; fi
fi

GPUS_PER_NODE=${GPUS_PER_NODE:-8}
NUM_NODES=${NUM_NODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-6000}
WORLD_SIZE=$((GPUS_PER_NODE * NUM_NODES))

TP_SIZE=${TP_SIZE:-1}
CP_SIZE=${CP_SIZE:-1}
PP_SIZE=${PP_SIZE:-1}
DTYPE=${DTYPE:-bf16}
SEQ_LENGTH=8192

DISTRIBUTED_ARGS=(
    --nproc_per_node "$GPUS_PER_NODE"
    --nnodes "$NUM_NODES"
    --node_rank "$NODE_RANK"
    --master_addr "$MASTER_ADDR"
    --master_port "$MASTER_PORT"
)

MODEL_ARGS=(
    --use-mcore-models
    --num-layers 32
    --hidden-size 4096
    --ffn-hidden-size 14336
    --num-attention-heads 32
    --group-query-attention
    --num-query-groups 8
    --kv-channels 128
    --seq-length "$SEQ_LENGTH"
    --max-position-embeddings "$SEQ_LENGTH"
    --position-embedding-type rope
    --rotary-base 1000000
    --rotary-percent 1.0
    --attention-dropout 0.0
    --hidden-dropout 0.0
    --swiglu
    --normalization RMSNorm
    --init-method-std 0.0134
    --attention-backend fused
    --apply-layernorm-1p
    --untie-embeddings-and-output-weights
    --disable-bias-linear
)

TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 128
    --train-samples 1953125000
    --lr-decay-samples 1949218748
    --lr-warmup-samples 3906252
    --lr 0.00015
    --min-lr 0.00001
    --decoupled-lr 5.0e-4
    --decoupled-min-lr 4.5e-5
    --lr-decay-style cosine
    --clip-grad 1.0
    --weight-decay 0.1
    --adam-beta1 0.9
    --adam-beta2 0.95
    --bf16
    --grad-reduce-in-bf16
    --cross-entropy-loss-fusion
    --calculate-per-token-loss
    --manual-gc
    --empty-unused-memory-level 1
    --exit-duration-in-mins 235
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
)

DTYPE_ARGS=()
if [[ "$DTYPE" == fp8 ]]; then
    DTYPE_ARGS=(--fp8-format hybrid --fp8-amax-history-len 1024 --fp8-amax-compute-algo max --fp8-param-gather)
fi

MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size "$TP_SIZE"
    --context-parallel-size "$CP_SIZE"
    --pipeline-model-parallel-size "$PP_SIZE"
    --sequence-parallel
)

if [[ "$TOKENIZER_ARG" == MOCK || "$DATA_ARG" == MOCK ]]; then
    DATA_ARGS=(--mock-data --tokenizer-type NullTokenizer --vocab-size 128256)
else
    DATA_ARGS=(--data-path "$DATA_ARG" --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$TOKENIZER_ARG")
fi
DATA_ARGS+=(--split "99,1,0" --no-create-attention-mask-in-dataloader --no-mmap-bin-files --num-workers 1)

EVAL_AND_LOGGING_ARGS=(
    --log-interval 1
    --eval-iters 32
    --eval-interval 100
    --save-interval 1000
    --log-throughput
    --ckpt-format torch_dist
    --distributed-timeout-minutes 60
    --save "$CHECKPOINT_PATH"
    --load "$CHECKPOINT_PATH"
)
if [[ -n "$TENSORBOARD_LOGS_PATH" ]]; then
    EVAL_AND_LOGGING_ARGS+=(--tensorboard-dir "$TENSORBOARD_LOGS_PATH")
fi

ARGS=("${MODEL_ARGS[@]}" "${TRAINING_ARGS[@]}" "${DTYPE_ARGS[@]}" "${MODEL_PARALLEL_ARGS[@]}" "${DATA_ARGS[@]}"
    "${EVAL_AND_LOGGING_ARGS[@]}")
if [[ "${DRY_RUN:-0}" == 1 ]]; then
    exec "$PYTHON" "$REPO/pretrain_gpt.py" --dry-run --world-size "$WORLD_SIZE" "${ARGS[@]}"
fi
exec "$PYTHON" -m torch.distributed.run "${DISTRIBUTED_ARGS[@]}" "$REPO/pretrain_gpt.py" "${ARGS[@]}"
