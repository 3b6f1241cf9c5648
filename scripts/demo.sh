#!/usr/bin/env bash
# The main job on the embedded default: a tiny GPT trained on CPU with two
# pipeline stages and interleaved virtual stages (PP=2, VP=2, gloo), on
# Megatron-Core's mock data, for a few dozen iterations; writes a checkpoint.
#
#   OUT_DIR   where metrics and checkpoints go (default runs/demo)
#   ITERS     training iterations (default 40)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "${repo}/scripts/setup.sh"
out="${OUT_DIR:-${repo}/runs/demo}"
iters="${ITERS:-40}"
rm -rf "${out}"
mkdir -p "${out}"

model=(
  --num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 64
  --vocab-size 1023 --swiglu --normalization RMSNorm --disable-bias-linear
)
layout=(--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1)
batch=(--micro-batch-size 2 --global-batch-size 8)
optim=(--lr 3e-3 --min-lr 3e-4 --lr-warmup-iters 4 --lr-decay-style cosine --clip-grad 1.0 --seed 1234)
run=(
  --mock-data --device cpu --train-iters "${iters}" --log-interval 5
  --eval-interval 20 --eval-iters 2
  --save "${out}/checkpoints" --save-interval 20
  --metrics-file "${out}/metrics.jsonl"
)

cd "${repo}"
PYTHONWARNINGS=ignore OMP_NUM_THREADS=1 "${repo}/.venv/bin/python" -m torch.distributed.run \
  --nproc-per-node 2 --master-addr 127.0.0.1 --master-port "${MASTER_PORT:-29517}" \
  pretrain_gpt.py "${model[@]}" "${layout[@]}" "${batch[@]}" "${optim[@]}" "${run[@]}"

"${repo}/.venv/bin/python" - "${out}" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
train = [r for r in rows if "lm_loss" in r]
print(f"\nloss: {train[0]['lm_loss']:.3f} at iteration {train[0]['iteration']} -> "
      f"{train[-1]['lm_loss']:.3f} at iteration {train[-1]['iteration']}")
tracker = (out / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip()
print(f"checkpoint: {out / 'checkpoints'} (latest iteration {tracker})")
if not train[-1]["lm_loss"] < train[0]["lm_loss"]:
    sys.exit("the loss did not go down")
PY
