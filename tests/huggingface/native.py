"""Run as one process by tests/huggingface/test_native.py and test_gelu_new_and_linear_rope.py (Megatron-Core's
process-group state is per process), forked from the rank server (``conftest.run_forked``):

    python tests/huggingface/native.py JOBS.json   → one JSON object per job, in a JSON list

Each job is a model built by ``transformers`` itself (not exported by us first), with random weights, norms
and biases drawn away from their initial values so that a wrongly mapped one shows. Its directory is imported
through the library, and then:

- Megatron-Core's forward and ``transformers``' on the same random batch: ``max_abs`` and ``max_logit``;
- greedy continuations of a prompt by ``megatron_ext.inference.generate`` (``generate.py``'s loop) and by
  ``transformers``' ``generate``: ``ours``, ``theirs``;
- the loaded model's parameters (``dtypes``, ``parameters``) and the memory model's count (``estimated_parameters``);
- the export of the imported checkpoint against the original directory: tensors by name with dtype and bits
  (``tensors_differ``), ``config.json`` keys that changed (``config_changed``), both ``generation_config.json``;
- with ``extra`` (a continued run's own flags): the argv of that run (``--load``, the flags the import printed,
  ``extra``) and ``transformers``' loss on the first global batch it trains on (``hf_loss``).
"""

from __future__ import annotations

import json
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

PROMPT = [5, 17, 99, 3, 250, 41, 7, 600]
NEW_TOKENS = 12


def build(job: dict[str, Any], directory: Path) -> Any:
    """The ``transformers`` model of ``job``, saved in ``directory`` in its dtype (with a generation config whose
    fields an export must keep, and the job's SentencePiece model as its tokenizer if it names one); the job's
    ``drop_keys`` are then left out of ``config.json``, which then says only what transformers takes by default."""
    import transformers

    torch.manual_seed(job.get("seed", 0))
    config = transformers.AutoConfig.for_model(job["model_type"], **job["config"])
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0.0, 0.05)
            elif "norm" in name or ".ln_" in name:  # GPT-2's LayerNorms are ln_1, ln_2 and ln_f
                param.normal_(1.0, 0.2)
    model = model.to(getattr(torch, job["dtype"])).eval()
    model.generation_config = transformers.GenerationConfig(**job["generation"])
    model.save_pretrained(str(directory))
    if job.get("drop_keys"):
        saved = json.loads((directory / "config.json").read_text())
        kept = {k: v for k, v in saved.items() if k not in job["drop_keys"]}
        (directory / "config.json").write_text(json.dumps(kept, indent=2))
    if job.get("tokenizer_model"):
        shutil.copyfile(job["tokenizer_model"], directory / "tokenizer.model")
    return model


def logits(ckpt_dir: Path, hf: Any, seq: int) -> dict[str, Any]:
    from megatron_ext.estimate.derived_numbers import parameter_counts
    from megatron_ext.inference.checkpoint import forward_logits, load_model, one_process, open_checkpoint
    from megatron_ext.inference.generate import Sampling, generate

    ckpt = open_checkpoint(ckpt_dir)
    tokens = torch.randint(0, 1000, (2, seq), generator=torch.Generator().manual_seed(7))
    with one_process(ckpt.cfg) as ctx:
        model = load_model(ckpt, ctx.device)
        ours = forward_logits(model, tokens).float()
        continuation = generate(
            model,
            PROMPT,
            max_new_tokens=NEW_TOKENS,
            sampling=Sampling(),
            vocab_size=ckpt.cfg.padded_vocab_size,
            window=ckpt.cfg.model.context_length,
            stop=None,
            device=ctx.device,
        )
    with torch.no_grad():
        theirs = hf(tokens).logits.float()
        greedy = hf.generate(
            torch.tensor([PROMPT]),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            attention_mask=torch.ones(1, len(PROMPT), dtype=torch.long),
        )[0, len(PROMPT) :].tolist()
    diff = (theirs - ours).abs()
    return {
        "max_abs": float(diff.max()),
        "max_logit": float(ours.abs().max()),
        "ours": continuation,
        "theirs": greedy,
        "dtypes": sorted({str(p.dtype) for p in model.parameters()}),
        "parameters": sum(p.numel() for p in model.parameters()),
        "estimated_parameters": parameter_counts(ckpt.cfg).total,
    }


def round_trip(original: Path, again: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    def tensors(directory: Path) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for file in sorted(directory.glob("*.safetensors")):
            out |= load_file(str(file))
        return out

    a, b = tensors(original), tensors(again)
    differ = sorted(set(a) ^ set(b))
    differ += [k for k in a if k in b and not (a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]))]
    old, new = (json.loads((d / "config.json").read_text()) for d in (original, again))
    changed = {k: [old.get(k), new.get(k)] for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}
    return {
        "tensors": len(a),
        "tensors_differ": differ,
        "dtypes": sorted({str(t.dtype) for t in b.values()}),
        "config_changed": changed,
        "generation": [json.loads((d / "generation_config.json").read_text()) for d in (original, again)],
    }


def continued(ckpt_dir: Path, flags: list[str], extra: list[str], hf: Any) -> dict[str, Any]:
    """The continued run's argv and transformers' loss on the first global batch that run trains on."""
    from megatron_ext.config.training_config import parse_args
    from megatron_ext.inference.checkpoint import tokenizer_of
    from megatron_ext.training.datasets import build_datasets

    argv = ["--load", str(ckpt_dir), *flags, *extra]
    cfg = parse_args(argv, world_size=2)
    split = build_datasets(cfg, tokenizer_of(cfg)).train
    batch = [split[i] for i in range(cfg.batch.global_batch_size)]
    tokens = torch.stack([torch.as_tensor(s["tokens"]) for s in batch]).long()
    labels = torch.stack([torch.as_tensor(s["labels"]) for s in batch]).long()
    mask = torch.stack([torch.as_tensor(s["loss_mask"]) for s in batch]).float()
    with torch.no_grad():
        out = hf(tokens).logits.float()
    per_token = torch.nn.functional.cross_entropy(out.transpose(1, 2), labels, reduction="none")
    return {"argv": argv, "hf_loss": float((per_token * mask).sum() / mask.sum())}


def job(spec: dict[str, Any]) -> dict[str, Any]:
    from megatron_ext.huggingface.convert import export_to_hf, import_from_hf

    work = Path(spec["work"])
    hf = build(spec, work / "hf")
    imported = import_from_hf(work / "hf", work / "ckpt", seq_length=spec.get("seq_length"))
    export_to_hf(work / "ckpt", work / "hf-again")
    result = {"flags": imported.flags, "tensors_imported": imported.tensors}
    result |= logits(work / "ckpt", hf, spec["seq"]) | {"export": round_trip(work / "hf", work / "hf-again")}
    if spec.get("extra") is not None:
        result |= continued(work / "ckpt", imported.flags, spec["extra"], hf)
    return result


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    jobs = json.loads(Path(sys.argv[1]).read_text())
    print(json.dumps([job(j) for j in jobs]))
