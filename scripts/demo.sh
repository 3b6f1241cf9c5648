#!/usr/bin/env bash
# The main job on the embedded default corpus, end to end on CPU, nothing downloaded:
#   1. a real-text corpus from the Python standard library's docstrings (tools/build_corpus.py)
#   2. a SentencePiece BPE tokenizer trained on it (tools/train_tokenizer.py)
#   3. a Megatron indexed dataset (tools/preprocess_data.py)
#   4. a tiny Llama-style GPT (rotary positions, SwiGLU, RMSNorm, grouped-query
#      attention, untied output) trained on it with two pipeline stages and
#      interleaved virtual stages (PP=2, VP=2, gloo) for a few dozen iterations;
#      writes a checkpoint, its metrics and their curves (tools/plot_metrics.py: OUT_DIR/loss.png)
#   5. the checkpoint exported to Hugging Face transformers (tools/convert_checkpoint.py)
#      and a short sample generated from it (tools/generate.py).
# Steps 1-3 are cached under DATA_DIR (delete it to rebuild).
#
#   OUT_DIR    where metrics and checkpoints go (default runs/demo)
#   DATA_DIR   corpus, tokenizer and dataset cache (default runs/demo-data)
#   ITERS      training iterations (default 40)
#   CORPUS_MB  corpus size in MB (default 3)
#   VOCAB      tokenizer vocabulary (default 4000)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "${repo}/scripts/setup.sh"
out="${OUT_DIR:-${repo}/runs/demo}"
data="${DATA_DIR:-${repo}/runs/demo-data}"
iters="${ITERS:-40}"
corpus_mb="${CORPUS_MB:-3}"
vocab="${VOCAB:-4000}"
py="${repo}/.venv/bin/python"
# Start afresh, but delete only what an earlier demo made: OUT_DIR may be a path the user chose.
made_by_demo="${out}/.made-by-demo"
if [[ -e "${out}" && ! -f "${made_by_demo}" ]]; then
  echo "demo: OUT_DIR ${out} exists and was not made by this demo; choose another OUT_DIR or remove it" >&2
  exit 2
fi
rm -rf "${out}"
mkdir -p "${out}" "${data}"
touch "${made_by_demo}"
cd "${repo}"

corpus="${data}/stdlib.jsonl"
tokenizer="${data}/sp${vocab}"
dataset="${data}/stdlib_text_document"
if [[ ! -f "${corpus}" ]]; then
  "${py}" tools/build_corpus.py --output "${corpus}" --target-mb "${corpus_mb}" --sources stdlib
fi
if [[ ! -f "${tokenizer}.model" ]]; then
  "${py}" tools/train_tokenizer.py --input "${corpus}" --model-prefix "${tokenizer}" \
    --vocab-size "${vocab}" --model-type bpe --byte-fallback
fi
if [[ ! -f "${dataset}.idx" || "${tokenizer}.model" -nt "${dataset}.idx" ]]; then
  "${py}" tools/preprocess_data.py --input "${corpus}" --output-prefix "${data}/stdlib" \
    --tokenizer-type GPTSentencePieceTokenizer --tokenizer-model "${tokenizer}.model" \
    --append-eod --workers 2
fi

model=(
  --num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 64
  --group-query-attention --num-query-groups 2 --position-embedding-type rope
  --swiglu --normalization RMSNorm --disable-bias-linear --untie-embeddings-and-output-weights
)
data_args=(
  --data-path "${dataset}" --split "98,1,1" --data-cache-path "${data}/index-cache"
  --tokenizer-type GPTSentencePieceTokenizer --tokenizer-model "${tokenizer}.model"
)
layout=(--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1)
batch=(--micro-batch-size 2 --global-batch-size 8)
optim=(--lr 3e-3 --min-lr 3e-4 --lr-warmup-iters 4 --lr-decay-style cosine --clip-grad 1.0 --seed 1234)
run=(
  --device cpu --train-iters "${iters}" --log-interval 5
  --eval-interval 20 --eval-iters 2
  --save "${out}/checkpoints" --save-interval 20
  --metrics-file "${out}/metrics.jsonl"
)

OMP_NUM_THREADS=1 "${py}" -m torch.distributed.run \
  --nproc-per-node 2 --master-addr 127.0.0.1 --master-port "${MASTER_PORT:-29517}" \
  pretrain_gpt.py "${model[@]}" "${data_args[@]}" "${layout[@]}" "${batch[@]}" "${optim[@]}" "${run[@]}"

"${py}" - "${out}" <<'PY'
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
"${py}" tools/plot_metrics.py "${out}/metrics.jsonl" --label demo --output "${out}/loss.png"

"${py}" tools/convert_checkpoint.py to-hf --load "${out}/checkpoints" --output "${out}/hf"
echo "sample (temperature 0.8, top-k 40, from the checkpoint; a model this small and short-trained babbles):"
"${py}" tools/generate.py --load "${out}/checkpoints" --prompt "Return the" --max-new-tokens 32 \
  --temperature 0.8 --top-k 40 --seed 1 --device cpu
