"""Train a SentencePiece tokenizer (BPE or unigram) on JSON Lines, Parquet or Arrow, in bounded memory.

Documents are streamed from the files (every format ``tools/preprocess_data.py``
reads: JSON Lines plain, .gz or .zst, Parquet, Arrow) and cut into lines (SentencePiece's
"sentences"); SentencePiece keeps a uniform random sample of at most
``--input-sentence-size`` of them (reservoir sampling), so memory does not grow
with the corpus. Writes ``PREFIX.model`` and ``PREFIX.vocab`` atomically::

    python tools/train_tokenizer.py --input corpus.jsonl --model-prefix runs/tok/sp32k \\
        --vocab-size 32000 --model-type bpe --byte-fallback

Defaults suit GPT pretraining with ``--tokenizer-type GPTSentencePieceTokenizer`` (or ``Llama2Tokenizer``, which starts
every document with the bos piece the defaults include):
identity normalisation (text round-trips exactly with ``--byte-fallback``),
unk/bos/eos = 0/1/2 and no pad piece.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from megatron_ext.config.exit_codes import ExitCode, fail
from megatron_ext.config.flags import Parser, above, at_least
from megatron_ext.data import formats

_MAX_WARNINGS = 20


def iter_sentences(files: Sequence[formats.InputFile], keys: Sequence[str], max_bytes: int) -> Iterator[str]:
    """Non-empty lines of every document's text; lines over ``max_bytes`` are left out.

    A bad record (not JSON, a missing key, a null, invalid UTF-8) is left out with a warning
    naming its file and line or row (the first few; then a count at the end).
    """
    bad = 0
    for file in files:
        index = 0
        for chunk in formats.chunks(file, 0, keys, 1 << 20):
            for texts, _reason, detail in formats.records(chunk, file.path, keys):
                if texts is None:
                    bad += 1
                    if bad <= _MAX_WARNINGS:
                        print(f"warning: {file.where(index)}: {detail}; left out", file=sys.stderr)
                index += 1
                for text in texts or ():
                    for sentence in text.split("\n"):
                        if sentence.strip() and len(sentence.encode("utf-8", "replace")) <= max_bytes:
                            yield sentence
    if bad > _MAX_WARNINGS:
        print(f"warning: {bad:,} bad records left out in all", file=sys.stderr)


def train(
    *,
    inputs: Sequence[str],
    model_prefix: str,
    json_keys: Sequence[str] = ("text",),
    input_format: str | None = None,
    model_type: str = "bpe",
    vocab_size: int = 32000,
    character_coverage: float = 0.9995,
    user_defined_symbols: Sequence[str] = (),
    byte_fallback: bool = False,
    normalization: str = "identity",
    split_digits: bool = False,
    input_sentence_size: int = 2_000_000,
    max_sentence_length: int = 4192,
    num_threads: int = 2,
    seed: int = 1234,
) -> tuple[Path, Path]:
    """Train and write ``model_prefix.model``/``.vocab``; returns both paths."""
    import sentencepiece as spm

    files = formats.open_inputs(inputs, input_format, json_keys)
    prefix = Path(model_prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    tmp_prefix = prefix.with_name(f".{prefix.name}.tmp-{os.getpid()}")
    spm.set_random_generator_seed(seed)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter_sentences(files, json_keys, max_sentence_length),
            model_prefix=str(tmp_prefix),
            model_type=model_type,
            vocab_size=vocab_size,
            character_coverage=character_coverage,
            user_defined_symbols=list(user_defined_symbols),
            byte_fallback=byte_fallback,
            normalization_rule_name=normalization,
            remove_extra_whitespaces=normalization != "identity",
            split_digits=split_digits,
            allow_whitespace_only_pieces=True,
            input_sentence_size=input_sentence_size,
            shuffle_input_sentence=True,
            max_sentence_length=max_sentence_length,
            num_threads=num_threads,
            unk_id=0,
            bos_id=1,
            eos_id=2,
            pad_id=-1,
            minloglevel=2,
        )
        outputs = []
        for suffix in (".model", ".vocab"):
            final = Path(f"{prefix}{suffix}")
            os.replace(f"{tmp_prefix}{suffix}", final)
            outputs.append(final)
    finally:
        for suffix in (".model", ".vocab"):
            Path(f"{tmp_prefix}{suffix}").unlink(missing_ok=True)
    return outputs[0], outputs[1]


def main(argv: list[str] | None = None) -> int:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--input",
        nargs="+",
        required=True,
        help="Files, globs or datasets.save_to_disk directories: JSON Lines (.jsonl, .gz, .zst), .parquet, .arrow.",
    )
    p.add_argument(
        "--input-format", choices=formats.FORMATS, help="Read every input as this format (default: by its name)."
    )
    p.add_argument("--json-keys", nargs="+", default=["text"], help="Keys (or string columns) whose text is used.")
    p.add_argument("--model-prefix", required=True, help="Writes PREFIX.model and PREFIX.vocab.")
    p.add_argument("--model-type", default="bpe", choices=["bpe", "unigram"], help="SentencePiece algorithm.")
    p.add_argument("--vocab-size", type=at_least(1), default=32000, help="Pieces in the vocabulary.")
    p.add_argument("--character-coverage", type=above(0), default=0.9995, help="Share of characters covered.")
    p.add_argument("--user-defined-symbols", nargs="*", default=[], help="Special tokens kept whole.")
    p.add_argument("--byte-fallback", action="store_true", help="Unknown characters become UTF-8 byte pieces.")
    p.add_argument(
        "--normalization", default="identity", choices=["identity", "nmt_nfkc", "nfkc", "nmt_nfkc_cf", "nfkc_cf"]
    )
    p.add_argument("--split-digits", action="store_true", help="Every digit is its own piece.")
    p.add_argument("--input-sentence-size", type=at_least(1), default=2_000_000, help="Lines sampled (bounds memory).")
    p.add_argument("--max-sentence-length", type=at_least(1), default=4192, help="Longer lines (bytes) are left out.")
    p.add_argument("--num-threads", type=at_least(1), default=2, help="Trainer threads.")
    p.add_argument("--seed", type=at_least(0), default=1234, help="Sampling seed.")
    args = p.parse_args(argv)
    start = time.perf_counter()
    try:
        model, vocab = train(
            inputs=args.input,
            model_prefix=args.model_prefix,
            json_keys=args.json_keys,
            input_format=args.input_format,
            model_type=args.model_type,
            vocab_size=args.vocab_size,
            character_coverage=args.character_coverage,
            user_defined_symbols=args.user_defined_symbols,
            byte_fallback=args.byte_fallback,
            normalization=args.normalization,
            split_digits=args.split_digits,
            input_sentence_size=args.input_sentence_size,
            max_sentence_length=args.max_sentence_length,
            num_threads=args.num_threads,
            seed=args.seed,
        )
    except (RuntimeError, OSError, ValueError) as exc:
        return fail(exc, ExitCode.ERROR)
    print(
        f"wrote {model} and {vocab} ({args.model_type}, {args.vocab_size:,} pieces, "
        f"{time.perf_counter() - start:.1f} s)"
    )
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
