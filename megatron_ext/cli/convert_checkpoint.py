"""Move a checkpoint to and from Hugging Face ``transformers`` (Llama, Qwen2, Mistral and GPT-2 architectures).

::

    python tools/convert_checkpoint.py to-hf --load runs/demo/checkpoints --output runs/demo/hf
    python tools/convert_checkpoint.py to-hf --load CKPT --output HF_DIR --iteration 2000 --max-shard-size 2GB
    python tools/convert_checkpoint.py from-hf --input HF_DIR --save CKPT
    python tools/convert_checkpoint.py from-hf --input MISTRAL_DIR --save CKPT --seq-length 4096 --dry-run

``to-hf`` reads a checkpoint saved under any TP/PP/VP/DP in one CPU process, with
the model and tokenizer the run recorded (``--tokenizer-*`` give another copy of
the tokenizer). ``from-hf`` writes a weights-only checkpoint that
``pretrain_gpt.py --load CKPT`` continues from under any layout, and prints the
model flags to train it with. Nothing is downloaded; an interrupted or failed
conversion leaves nothing at the output path.

Exit codes: 0 done, 2 invalid arguments or a model that does not convert, 3 an
unreadable checkpoint, or an output that could not be written (a full, read-only
or forbidden filesystem: one line naming the file and the fix). Details:
docs/checkpoints.md.
"""

from __future__ import annotations

import argparse
import shlex

from megatron_ext import notices
from megatron_ext.cli.checkpoint_args import (
    add_checkpoint_arguments,
    checkpoint_error_text,
    tokenizer_overrides,
)
from megatron_ext.config.exit_codes import ExitCode, fail
from megatron_ext.config.flags import Parser


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    to_hf = commands.add_parser("to-hf", help="checkpoint → transformers directory")
    add_checkpoint_arguments(to_hf)
    to_hf.add_argument("--output", required=True, help="The transformers directory to create.")
    to_hf.add_argument("--max-shard-size", default="5GB", help="Largest safetensors file (default 5GB).")
    from_hf = commands.add_parser("from-hf", help="transformers directory → checkpoint")
    from_hf.add_argument("--input", required=True, help="A local transformers model directory (safetensors).")
    from_hf.add_argument("--save", required=True, help="The checkpoint directory to create.")
    from_hf.add_argument(
        "--seq-length",
        type=int,
        help="The sequence length to train at (default: the model's max_position_embeddings); a sliding window "
        "(Mistral) must cover it.",
    )
    from_hf.add_argument(
        "--dry-run",
        action="store_true",
        help="Check config.json, the tokenizer and --save, and print the flags; read no weights, write nothing.",
    )
    args = parser.parse_args(argv)
    notices.install()  # before torch and Megatron-Core are imported

    from megatron_ext.checkpoint.on_disk import CheckpointError
    from megatron_ext.huggingface.architectures import ConversionError
    from megatron_ext.huggingface.convert import OutputError, export_to_hf, import_from_hf, parse_size

    try:
        if args.command == "to-hf":
            done = export_to_hf(
                args.load,
                args.output,
                iteration=args.iteration,
                tokenizer=tokenizer_overrides(args),
                max_shard_bytes=parse_size(args.max_shard_size),
                accept_tokenizer_change=args.accept_tokenizer_change,
            )
            print(
                f"exported iteration {done.iteration} as {done.architecture}: {done.tensors} tensors in "
                f"{done.output} ({', '.join(done.files)}); tokenizer: {done.tokenizer_note}"
            )
        else:
            if args.seq_length is not None and args.seq_length < 1:
                raise ValueError(f"--seq-length must be at least 1, got {args.seq_length}")
            imported = import_from_hf(args.input, args.save, seq_length=args.seq_length, dry_run=args.dry_run)
            if args.dry_run:
                print(f"dry run: {args.input} imports as {imported.architecture} into {imported.save}; nothing written")
            else:
                print(
                    f"imported {imported.architecture} ({imported.tensors} tensors) into {imported.save} (iteration 0)"
                )
            command = ["pretrain_gpt.py", "--load", str(imported.save), *imported.flags]
            print("continue pretraining with:", shlex.join(command))
    except (ConversionError, ValueError) as exc:
        return fail(exc, ExitCode.INVALID)
    except CheckpointError as exc:
        return fail(checkpoint_error_text(exc, args), ExitCode.CHECKPOINT, prefix="checkpoint error")
    except OutputError as exc:
        # As a failed save of pretrain_gpt.py: a checkpoint (here in transformers' format) cannot be written.
        return fail(exc, ExitCode.CHECKPOINT)
    return ExitCode.OK
