"""Run as one process by tests/huggingface/test_export.py (Megatron-Core's process-group state is per process),
forked from the rank server (``conftest.run_forked``):

    python tests/huggingface/compare.py JOBS.json   → one JSON object per job, in a JSON list

Each job names a checkpoint, a transformers directory, an imported checkpoint and a work directory.
What the command lines did not already do is done here, through the library: the export (when the
transformers directory does not exist), the import (when the imported checkpoint does not exist),
and always the export of the imported checkpoint to ``WORK/hf-again``. Then:

- Megatron-Core's forward (the checkpoint loaded in one process) and the exported ``transformers``
  model on the first validation batch the run evaluated (the training split's when it evaluated
  none): ``max_abs`` difference and ``max_logit``;
- the ``transformers`` model's loss over exactly the batches of the run's validation
  (``--eval-iters`` global batches from the start of the split): ``valid_loss``, ``batches``;
- the model tensors of the checkpoint and the imported one: ``keys``, ``other_keys``, ``different``.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

import torch


def logits(checkpoint: Path, hf_dir: Path) -> dict[str, Any]:
    import transformers

    from megatron_ext.inference.checkpoint import forward_logits, load_model, one_process, open_checkpoint, tokenizer_of
    from megatron_ext.training.datasets import build_datasets

    ckpt = open_checkpoint(checkpoint)
    cfg = ckpt.cfg
    with one_process(cfg) as ctx:
        datasets = build_datasets(cfg, tokenizer_of(cfg))
        split = datasets.valid if datasets.valid is not None else datasets.train
        batches = max(cfg.run.eval_iters, 1) if datasets.valid is not None else 1
        size = cfg.batch.global_batch_size
        samples = [[split[b * size + i] for i in range(size)] for b in range(batches)]
        model = load_model(ckpt, ctx.device)
        ours = forward_logits(model, torch.stack([torch.as_tensor(s["tokens"]) for s in samples[0]]).long())
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir), local_files_only=True, dtype=torch.float32)
    hf.eval()
    losses = []
    with torch.no_grad():
        for b, batch in enumerate(samples):
            tokens = torch.stack([torch.as_tensor(s["tokens"]) for s in batch]).long()
            labels = torch.stack([torch.as_tensor(s["labels"]) for s in batch]).long()
            mask = torch.stack([torch.as_tensor(s["loss_mask"]) for s in batch]).float()
            theirs = hf(tokens).logits.float()
            if b == 0:
                diff = (theirs - ours.float()).abs()
                first = {"max_abs": float(diff.max()), "max_logit": float(ours.abs().max()), "shape": list(ours.shape)}
            per_token = torch.nn.functional.cross_entropy(theirs.transpose(1, 2), labels, reduction="none")
            losses.append(float((per_token * mask).sum() / mask.sum()))
    return first | {"valid_loss": sum(losses) / len(losses), "batches": len(losses)}


def weights(first: Path, second: Path) -> dict[str, Any]:
    from megatron_ext.huggingface.weights import is_model_tensor
    from megatron_ext.inference.checkpoint import one_process, open_checkpoint, read_tensor
    from megatron_ext.training.checkpointing import verify_checkpoint

    a, b = open_checkpoint(first), open_checkpoint(second)
    with one_process(a.cfg):
        meta_a, meta_b = verify_checkpoint(a.path), verify_checkpoint(b.path)
        keys = sorted(k for k in meta_a if is_model_tensor(k))
        other = sorted(k for k in meta_b if is_model_tensor(k))
        different = [
            k
            for k in keys
            if k in meta_b
            and not (
                (x := read_tensor(a.path, k, meta_a[k])).dtype == (y := read_tensor(b.path, k, meta_b[k])).dtype
                and torch.equal(x, y)
            )
        ]
    return {"keys": keys, "other_keys": other, "different": different}


def job(checkpoint: Path, hf: Path, imported: Path, work: Path) -> dict[str, Any]:
    from megatron_ext.huggingface.convert import export_to_hf, import_from_hf

    if not hf.exists():
        export_to_hf(checkpoint, hf)
    if not imported.exists():
        import_from_hf(hf, imported)
    export_to_hf(imported, work / "hf-again")
    return logits(checkpoint, hf) | weights(checkpoint, imported)


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    jobs = json.loads(Path(sys.argv[1]).read_text())
    print(json.dumps([job(*(Path(j[k]) for k in ("checkpoint", "hf", "imported", "work"))) for j in jobs]))
