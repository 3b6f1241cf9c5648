"""Export a checkpoint to a ``transformers`` directory, and import one back.

Export reads the checkpoint (saved under any TP/PP/VP/DP, uneven stages
included) through Megatron-Core's dist-checkpointing in one CPU process, one
tensor at a time: memory is the largest tensor (one weight of every layer) plus
one output shard, never the model twice. Weights go to sharded safetensors files
with an index, as ``transformers`` writes them; ``config.json``,
``generation_config.json`` and the tokenizer's files go beside them.

Import builds Megatron-Core's GPTModel for the ``transformers`` config in one
process, fills its sharded state dict from the safetensors files and saves it
as a weights-only checkpoint (iteration 0, no optimizer state) that
``pretrain_gpt.py --load`` continues from under any layout.

Both write into a hidden directory beside the target and rename it at the end:
an interrupted or failed conversion leaves nothing at the final path. A full,
read-only or forbidden filesystem is an ``OutputError``: one line naming the
file and the fix.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from megatron_ext.checkpoint.run_identity import RunIdentity
from megatron_ext.config.arguments import ConfigError
from megatron_ext.config.training_config import make_config
from megatron_ext.huggingface.architectures import (
    READ_ELSEWHERE,
    TRANSFORMERS_DEFAULTS,
    ConversionError,
    TokenIds,
    architecture,
    hf_config,
    model_flags,
    padded_vocab_size,
)
from megatron_ext.huggingface.tokenizer_files import (
    TokenizerFlags,
    keep_originals,
    original_files,
    read_tokenizer_flags,
    write_tokenizer,
)
from megatron_ext.huggingface.weights import LAYERS, Rule, is_model_tensor, rules
from megatron_ext.inference.checkpoint import (
    checked_tokenizer,
    one_process,
    open_checkpoint,
    read_tensor,
    tokenizer_of,
)
from megatron_ext.training import checkpointing
from megatron_ext.write_faults import WRITE_FAULTS, describe

DEFAULT_MAX_SHARD_BYTES = 5 * 10**9
"""transformers' default shard size (``max_shard_size="5GB"``)."""

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def parse_size(text: str) -> int:
    """'5GB', '500MB', '2GiB' or a byte count → bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*", text, flags=re.IGNORECASE)
    if not match:
        raise ValueError(f"{text!r} is not a size; write e.g. 5GB, 500MB or 2GiB")
    number, unit = float(match.group(1)), (match.group(2) or "B").upper()
    scale = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
    scale |= {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
    return int(number * scale[unit])


class OutputError(Exception):
    """The output could not be written: a full, read-only or forbidden filesystem. The message is one line that
    names the output, the file and the fix; nothing was left at the output path."""


_WRITES_ONLY = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}
"""Codes only a write gives: one without a file name (a library's own error) is still the output's."""


def os_error_code(exc: BaseException) -> int | None:
    """The errno in a library's error that carries it only in its message (safetensors: "... (os error 28)")."""
    match = re.search(r"\(os error (\d+)\)|\[Errno (\d+)\]", str(exc))
    return int(match.group(1) or match.group(2)) if match else None


def _write_fault(exc: BaseException, target: Path, staging: Path, created: list[Path], flag: str) -> OutputError | None:
    """``exc`` (or an error it was raised from) as an OutputError when it is a write of the output that the
    filesystem refused; None for anything else (reading the input, a bug), which is left as it is."""
    output = [Path(os.path.abspath(p)) for p in (staging, target, *created)]  # a library may name files either way

    def ours(name: Any) -> Path | None:
        if not isinstance(name, str | bytes | os.PathLike):
            return None
        path = Path(os.path.abspath(os.fsdecode(name)))
        return path if any(path == p or p in path.parents for p in output) else None

    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        code = error.errno if isinstance(error, OSError) else os_error_code(error)
        if code in WRITE_FAULTS:
            # shutil.copyfile names the source first and the file it writes second.
            names = (getattr(error, "filename", None), getattr(error, "filename2", None))
            written = next((p for p in map(ours, names) if p is not None), None)
            if written is None and (code not in _WRITES_ONLY or any(n is not None for n in names)):
                return None  # a file outside the output (the checkpoint or model read): not a write fault
            what = "" if written is None else f" {_shown(written, Path(os.path.abspath(staging)))}"
            reason, fix = describe(code, flag=flag, directory=target.parent)
            return OutputError(f"cannot write {target}: {reason}{what}; {fix}")
        error = error.__cause__ or error.__context__
    return None


def _shown(path: Path, staging: Path) -> str:
    """What failed: a file of the staging directory by its name there (the directory is removed), or a directory
    being made."""
    if staging in path.parents:
        return f"writing {path.relative_to(staging)}"
    return f"creating {'its staging directory ' if path == staging else ''}{path}"


def _check_target(target: Path) -> None:
    """Nothing of the user's is replaced: ``target`` must not exist, or be an empty directory."""
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ConversionError(f"{target} already exists and is not empty; choose a new directory or remove it")


@contextlib.contextmanager
def _staging(target: Path, *, flag: str = "--output") -> Iterator[Path]:
    """A hidden directory beside ``target`` that becomes ``target`` when the block succeeds (else is removed,
    with the parent directories it made).

    ``target`` must not exist, or be an empty directory: nothing of the user's is replaced. A full, read-only or
    forbidden filesystem is an OutputError naming the file and the fix (``flag`` is the option that chose
    ``target``).
    """
    _check_target(target)
    # The missing parents, deepest first: made for this output, removed with it if it fails.
    created = [p for p in (target.parent, *target.parent.parents) if not p.exists()]
    staging = target.parent / f".{target.name}.partial-{os.getpid()}"
    done = False
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        yield staging
        if target.exists():
            target.rmdir()
        staging.rename(target)
        done = True
    except checkpointing.CheckpointError:
        raise  # the checkpoint code's own error (a save of from-hf included) already names file and fix
    except Exception as exc:
        fault = _write_fault(exc, target, staging, created, flag)
        if fault is None:
            raise
        raise fault from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        for parent in created if not done else ():
            with contextlib.suppress(OSError):  # not empty (someone else's now) or never made
                parent.rmdir()


class ShardWriter:
    """Safetensors shards of at most ``max_bytes`` each (one tensor larger than that gets a shard of its own),
    named and indexed as ``transformers`` names them once the number of shards is known."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.shards: list[list[str]] = []
        self.total_bytes = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        size = tensor.numel() * tensor.element_size()
        if self.pending and self.pending_bytes + size > self.max_bytes:
            self._flush()
        # A copy of its own: safetensors refuses tensors that share storage (the layers of one weight do).
        self.pending[name] = tensor.detach().to("cpu").contiguous().clone()
        self.pending_bytes += size
        self.total_bytes += size

    def _flush(self) -> None:
        from safetensors.torch import save_file

        path = self.directory / f"shard-{len(self.shards)}.tmp"
        try:
            save_file(self.pending, str(path), metadata={"format": "pt"})
        except Exception as exc:
            # safetensors' error names neither the file nor the errno (only "(os error 28)" in its text).
            code = os_error_code(exc)
            if code is None:
                raise
            raise OSError(code, os.strerror(code), str(path)) from exc
        self.shards.append(list(self.pending))
        self.pending, self.pending_bytes = {}, 0

    def close(self) -> list[str]:
        """Write what is left; name the shards and write the index. Returns the file names."""
        if self.pending or not self.shards:
            self._flush()
        count = len(self.shards)
        for i in range(count):
            # safetensors creates its files private (0600); these are published like the others.
            os.chmod(self.directory / f"shard-{i}.tmp", 0o644)
        if count == 1:
            (self.directory / "shard-0.tmp").rename(self.directory / SINGLE)
            return [SINGLE]
        names = [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]
        weight_map: dict[str, str] = {}
        for i, (name, tensors) in enumerate(zip(names, self.shards, strict=True)):
            (self.directory / f"shard-{i}.tmp").rename(self.directory / name)
            weight_map |= dict.fromkeys(tensors, name)
        index = {"metadata": {"total_size": self.total_bytes}, "weight_map": dict(sorted(weight_map.items()))}
        (self.directory / INDEX).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
        return [*names, INDEX]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Exported:
    output: Path
    architecture: str
    iteration: int
    files: list[str]
    tensors: int
    tokenizer_note: str


def _check_tensors(path: Path, table: list[Rule], saved: dict[str, Any]) -> None:
    """Every tensor of the checkpoint has a rule and every rule a tensor: nothing is dropped or invented."""
    model_keys = {k for k in saved if is_model_tensor(k)}
    missing = sorted(r.key for r in table if r.key not in saved)
    unexpected = sorted(model_keys - {r.key for r in table})
    if missing or unexpected:
        raise ConversionError(
            f"{path} does not hold the tensors its recorded arguments describe: "
            + "; ".join(
                part
                for part in (
                    f"missing {', '.join(missing)}" if missing else "",
                    f"not convertible {', '.join(unexpected)}" if unexpected else "",
                )
                if part
            )
        )


def export_to_hf(
    load: str | Path,
    output: str | Path,
    *,
    iteration: int | None = None,
    tokenizer: dict[str, str | None] | None = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    accept_tokenizer_change: bool = False,
) -> Exported:
    """Write checkpoint ``iteration`` (default: the latest) under ``load`` as a ``transformers`` directory. The
    tokenizer shipped must be the one the checkpoint was trained with (``accept_tokenizer_change``: or not)."""
    ckpt = open_checkpoint(load, iteration=iteration, tokenizer=tokenizer)
    cfg = ckpt.cfg
    arch = architecture(cfg.model)
    table = rules(cfg.model)
    tok = checked_tokenizer(ckpt, accept_change=accept_tokenizer_change)
    count = 0
    with _staging(Path(output)) as staging, one_process(cfg):
        saved = checkpointing.verify_checkpoint(ckpt.path)
        _check_tensors(ckpt.path, table, saved)
        writer = ShardWriter(staging, max_shard_bytes)
        # The model's dtype is its embedding's; a norm an older import saved in fp32 is written in it (its values
        # came from that dtype), so that config.json's dtype is every tensor's.
        dtype = saved[table[0].key].dtype
        for rule in table:
            tensor = read_tensor(ckpt.path, rule.key, saved[rule.key]).to(dtype)
            slices = list(enumerate(tensor)) if rule.per_layer else [(0, tensor)]
            for layer, part in slices:
                for name, value in zip(rule.names(layer), rule.split(part), strict=True):
                    writer.add(name, value)
                    count += 1
            del tensor, slices
        files = writer.close()
        max_length = cfg.model.max_position_embeddings or cfg.model.seq_length
        written = write_tokenizer(tok, cfg.data, staging, max_length=max_length)
        ids, original = written.ids, original_files(cfg.data, ckpt.root / "tokenizer", model_type=arch)
        config = hf_config(cfg.model, padded_vocab_size=cfg.padded_vocab_size, tokens=ids, dtype=_dtype_name(dtype))
        _write_json(staging / "config.json", with_original_config(config, original.get("config.json")))
        _write_json(
            staging / "generation_config.json", original.get("generation_config.json") or _generation_config(ids)
        )
        files += ["config.json", "generation_config.json", *written.files]
    return Exported(Path(output), arch, ckpt.iteration, files, count, written.note)


def _generation_config(ids: TokenIds) -> dict[str, Any]:
    """``generation_config.json`` of a model without one of its own (an imported model's original is kept whole)."""
    return {"bos_token_id": ids.bos, "eos_token_id": ids.eos, "_from_model_config": True}


TOKEN_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")
"""``config.json``'s special token ids: the original's (a list of end ids included), the tokenizer being the same."""


def with_original_config(ours: dict[str, Any], original: dict[str, Any] | None) -> dict[str, Any]:
    """``config.json``: ours, which says everything that decides the function, with the original model's token
    ids and the keys it has that no architecture here reads (``transformers_version``, a model card's extras)."""
    if original is None:
        return ours
    read = set(TRANSFORMERS_DEFAULTS[ours["model_type"]]) | set(ours) | READ_ELSEWHERE
    tokens = {k: original[k] for k in TOKEN_KEYS if k in original}
    return ours | tokens | {k: v for k, v in original.items() if k not in read and k not in tokens}


def _write_json(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")


class _SafetensorsReader:
    """The tensors of a ``transformers`` directory by name (one file or an indexed set), read on demand."""

    def __init__(self, directory: Path) -> None:
        from safetensors import safe_open

        index = directory / INDEX
        if index.is_file():
            weight_map: dict[str, str] = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        elif (directory / SINGLE).is_file():
            with safe_open(str(directory / SINGLE), "pt") as f:
                names: list[str] = list(f.keys())
            weight_map = dict.fromkeys(names, SINGLE)
        else:
            raise ConversionError(
                f"{directory} has neither {SINGLE} nor {INDEX}; only safetensors weights are read "
                "(convert a pytorch_model.bin with transformers' save_pretrained(safe_serialization=True))"
            )
        self.directory = directory
        self.weight_map = weight_map
        self.used: set[str] = set()

    def __call__(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        file = self.weight_map.get(name)
        if file is None:
            raise ConversionError(f"{self.directory} has no tensor {name}")
        self.used.add(name)
        with safe_open(str(self.directory / file), "pt") as f:
            return f.get_tensor(name)


@dataclass(frozen=True)
class Imported:
    save: Path
    architecture: str
    tensors: int
    """Tensors written (0 in a dry run)."""
    flags: list[str]
    """The pretrain_gpt.py flags that continue the imported model exactly: its shape and architecture, its
    precision and its tokenizer (as recorded in the checkpoint)."""


def import_from_hf(
    source: str | Path, save: str | Path, *, seq_length: int | None = None, dry_run: bool = False
) -> Imported:
    """Save the ``transformers`` model in ``source`` as our checkpoint (iteration 0) under ``save``, to train at
    ``seq_length`` (default: its ``max_position_embeddings``). ``dry_run``: check ``config.json``, the tokenizer
    and ``save`` and return the flags, reading no weights and writing nothing."""
    source, save = Path(source), Path(save)
    config_file = source / "config.json"
    if not config_file.is_file():
        raise ConversionError(f"{source} has no config.json: give a transformers model directory")
    config = json.loads(config_file.read_text(encoding="utf-8"))
    arch, model = model_flags(config, seq_length=seq_length)
    padded_vocab = padded_vocab_size(config)
    if dry_run:
        _check_target(save)
        recorded = read_tokenizer_flags(source, save.resolve() / "tokenizer", copy=False)
        here = read_tokenizer_flags(source, source, copy=False)
        cfg, _ = _import_config(config_file, model, config, padded_vocab, recorded, here)
        return Imported(save, arch, 0, _continue_flags(cfg, model, recorded))
    weights = _SafetensorsReader(source)
    with _staging(save, flag="--save") as staging:
        staged = read_tokenizer_flags(source, staging / "tokenizer")
        keep_originals(source, staging / "tokenizer")
        # Recorded where the files will be once the directory is renamed; read where they are now.
        recorded = (
            None
            if staged is None
            else {
                k: v.replace(str(staging), str(save.resolve())) if isinstance(v, str) else v for k, v in staged.items()
            }
        )
        cfg, tok = _import_config(config_file, model, config, padded_vocab, recorded, staged)
        count = _fill_and_save(cfg, weights, staging, RunIdentity.of(tok, cfg.data))
    return Imported(save, arch, count, _continue_flags(cfg, model, recorded))


def _import_config(
    config_file: Path,
    model: dict[str, Any],
    config: dict[str, Any],
    padded_vocab: int,
    recorded: TokenizerFlags | None,
    readable: TokenizerFlags | None,
) -> tuple[Any, Any]:
    """The imported checkpoint's TrainingConfig and tokenizer: the tokenizer flags ``recorded`` (the null tokenizer
    over the padded vocabulary, its last id the end of document, when there are none), its files read where they
    are now (``readable``)."""
    model = dict(model)
    data: TokenizerFlags = {"mock_data": True, **(recorded or {})}
    if recorded is None:  # NullTokenizer's --vocab-size is the whole vocabulary (Megatron-LM 0.17 and later)
        model["vocab_size"] = padded_vocab
    elif "vocab_size" in data:  # a tokenizer sized by --vocab-size (TikTokenizer)
        model["vocab_size"] = data.pop("vocab_size")
    try:
        cfg = make_config(
            world_size=1,
            model=model,
            data=data,
            optim=_precision(config),
            run={"device": "cpu"},
        )
    except ConfigError as exc:
        raise ConversionError(f"{config_file}: {exc}") from exc
    here = {k: v for k, v in (readable or {}).items() if k != "vocab_size"}
    tok = tokenizer_of(dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, **here)))
    vocab_size = padded_vocab if recorded is None else tok.vocab_size
    if vocab_size > padded_vocab:
        raise ConversionError(f"{config_file}: vocab_size {padded_vocab} is smaller than the tokenizer's {vocab_size}")
    cfg = dataclasses.replace(cfg, tokenizer_vocab_size=vocab_size, checkpoint_padded_vocab_size=padded_vocab)
    return cfg, tok


def _continue_flags(cfg: Any, model: dict[str, Any], tokenizer: TokenizerFlags | None) -> list[str]:
    """``Imported.flags``: every model field the import set, the vocabulary (the tokenizer's files in the
    checkpoint, or the null tokenizer's size) and the precision the weights are in."""
    from megatron_ext.config.flags import to_argv

    sized = tokenizer is None or "vocab_size" in tokenizer
    shape = [*model, *(("vocab_size",) if sized else ())]
    flags = to_argv(cfg.model, only=shape, always=("num_layers", "hidden_size", "num_attention_heads"))
    flags += to_argv(cfg.optim, only=("bf16", "fp16"))
    if tokenizer:
        flags += to_argv(cfg.data, only=[k for k in tokenizer if k != "vocab_size"], always=("tokenizer_type",))
    return flags


def _precision(config: dict[str, Any]) -> dict[str, bool]:
    """Keep the weights' dtype: the model is built in it, so that a round trip is exact."""
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "float32")
    return {"bf16": dtype == "bfloat16", "fp16": dtype == "float16"}


IGNORED = re.compile(r"(\.attn\.(bias|masked_bias)|\.rotary_emb\.inv_freq)$")
"""Buffers older transformers versions saved with the weights (causal masks, rotary frequencies)."""


def _fill_and_save(cfg: Any, weights: _SafetensorsReader, staging: Path, identity: RunIdentity) -> int:
    """Build the model in one process, set every tensor of its sharded state dict from ``weights``, save."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    from megatron_ext.training.model import gpt_model, in_training_precision

    table = {rule.key: rule for rule in rules(cfg.model)}
    count = 0
    with one_process(cfg) as ctx:
        # Built as a run computes (the norms in the weights' dtype too): what is saved is what transformers holds.
        model = in_training_precision(
            gpt_model(cfg, pre_process=True, post_process=True, vp_stage=None, device=ctx.device), cfg
        )
        for item in nested_values(model.sharded_state_dict()):
            if not isinstance(item, ShardedTensor | ShardedTensorFactory) or not is_model_tensor(item.key):
                continue
            rule = table.get(item.key)
            if rule is None:
                raise ConversionError(f"the model has a tensor {item.key} that no transformers weight maps to")
            # A factory (SwiGLU's fc1, saved as its two halves) holds the whole local tensor; its pieces the offsets.
            first = item if isinstance(item, ShardedTensor) else next(iter(nested_values(item.build())))
            layer = first.global_offset[0] if item.key.startswith(LAYERS) else 0
            value = rule.join([weights(name) for name in rule.names(layer)])
            if tuple(value.shape) != tuple(item.data.shape):
                raise ConversionError(
                    f"{', '.join(rule.names(layer))}: shape {tuple(value.shape)} does not make {item.key} of shape "
                    f"{tuple(item.data.shape)}; config.json does not describe these weights"
                )
            with torch.no_grad():
                item.data.copy_(value.to(item.data.dtype))
            count += 1
        tied_head = {"lm_head.weight"} if not cfg.model.untie_embeddings_and_output_weights else set()
        unused = sorted(n for n in set(weights.weight_map) - weights.used - tied_head if not IGNORED.search(n))
        if unused:
            raise ConversionError(
                f"{weights.directory}: tensors this architecture does not have: {', '.join(unused[:10])}"
                + (f" … and {len(unused) - 10} more" if len(unused) > 10 else "")
            )
        checkpointing.save_weights(staging, model, cfg, identity)
    return count
