"""Generate text from a checkpoint saved under any layout, in one process (CPU or GPU).

::

    python tools/generate.py --load runs/demo/checkpoints --prompt "def main(" --max-new-tokens 40
    python tools/generate.py --load CKPT --prompt TEXT --max-new-tokens 64 --temperature 0.8 --top-p 0.9 --seed 7

Greedy by default; ``--temperature`` (or ``--top-k`` / ``--top-p``, which sample at
temperature 1 unless it is given) samples, reproducibly for a ``--seed``. The
model and tokenizer are those the run recorded in the checkpoint. Prints the
prompt followed by the generated text (decoded together); stops early at the end-of-document token.
"""

from __future__ import annotations

import argparse

from megatron_ext import notices
from megatron_ext.cli.checkpoint_args import (
    add_checkpoint_arguments,
    checkpoint_error_text,
    tokenizer_overrides,
)
from megatron_ext.config.exit_codes import ExitCode, fail
from megatron_ext.config.flags import Parser, at_least


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_checkpoint_arguments(parser)
    parser.add_argument("--prompt", required=True, help="The text to continue.")
    parser.add_argument("--max-new-tokens", type=at_least(1), default=32)
    parser.add_argument("--temperature", type=float, default=None, help="0: greedy (default); >0 samples.")
    parser.add_argument("--top-k", type=at_least(0), default=0, help="Sample among the k most likely tokens.")
    parser.add_argument("--top-p", type=float, default=0.0, help="Sample among the top tokens covering p.")
    parser.add_argument("--seed", type=int, default=1234, help="Sampling seed (same seed, same text).")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    args = parser.parse_args(argv)
    notices.install()  # before torch and Megatron-Core are imported

    from megatron_ext.checkpoint.on_disk import CheckpointError
    from megatron_ext.inference.checkpoint import checked_tokenizer, load_model, one_process, open_checkpoint
    from megatron_ext.inference.generate import Sampling, generate
    from megatron_ext.training.distributed import resolve_device

    temperature = args.temperature
    if temperature is None:
        temperature = 1.0 if args.top_k or args.top_p else 0.0
    try:
        sampling = Sampling(temperature=temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
        device = resolve_device(args.device)
        ckpt = open_checkpoint(
            args.load, iteration=args.iteration, device=device.type, tokenizer=tokenizer_overrides(args)
        )
        tok = checked_tokenizer(ckpt, accept_change=args.accept_tokenizer_change)
        prompt = tok.tokenize(args.prompt)
        if not prompt:
            raise ValueError("--prompt gives no tokens; give some text")
        with one_process(ckpt.cfg) as ctx:
            model = load_model(ckpt, ctx.device)
            new = generate(
                model,
                prompt,
                max_new_tokens=args.max_new_tokens,
                sampling=sampling,
                vocab_size=tok.vocab_size,
                window=ckpt.cfg.model.context_length,  # the positions, within a sliding window
                stop=tok.eod,
                device=ctx.device,
            )
    except CheckpointError as exc:  # before RuntimeError, which it is
        return fail(checkpoint_error_text(exc, args), ExitCode.CHECKPOINT, prefix="checkpoint error")
    except (ValueError, RuntimeError) as exc:
        return fail(exc, ExitCode.INVALID)
    # Decoded with the prompt: a piece's leading space only survives decoding in context.
    print(tok.detokenize(prompt + [t for t in new if t != tok.eod]))
    return ExitCode.OK
