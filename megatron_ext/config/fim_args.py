"""Fill-in-the-middle: Megatron-LM's ``--fim-*`` flags, the data group's fields for them.

With ``--fim-data`` the training samples are Megatron-LM's own ``GPTFIMDataset``'s (shipped in the
megatron-core wheel as ``megatron.training.datasets.fim_dataset``): each document of a sample becomes, with
probability ``--fim-rate``, ``<prefix> P <suffix> S <middle> M`` (PSM) or, with probability ``--fim-spm-rate`` of
those, ``<prefix> <suffix> S <middle> P M`` (SPM), cut at two random character positions and re-tokenized, then
cut or padded back to the sample's length (Bavarian et al. 2022, arXiv 2207.14255). Its text operations go through
Megatron-Core's own tokenizer of the same files, as in Megatron-LM 0.19 (``training/datasets.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_ext.config.flags import opt

FIM_TOKENIZER_TYPES = ("HuggingFaceTokenizer",)
"""The tokenizer types whose Megatron-Core library tokenizer is checked token for token against ours here."""


@dataclass(frozen=True, kw_only=True)
class FimArgs:
    """Fill-in-the-middle's settings (Megatron-LM's names and defaults)."""

    fim_data: bool = opt(False, "Train on fill-in-the-middle samples (Megatron-LM's GPTFIMDataset).")
    fim_rate: float = opt(
        0.5, "FIM: the probability that a document (or fragment) is rearranged.", minimum=0, maximum=1
    )
    fim_spm_rate: float = opt(
        0.5, "FIM: the probability that a rearranged document takes the SPM order, not PSM.", minimum=0, maximum=1
    )
    fim_split_sample: str | None = opt(
        None, "FIM: a token at which a sample is split into fragments (files of a repository), each rearranged apart."
    )
    fim_fragment_rate: float | None = opt(
        None, "FIM: with --fim-split-sample, the probability that each fragment is rearranged.", minimum=0, maximum=1
    )
    fim_no_prefix: str | None = opt(None, "FIM: a document or fragment whose text starts with this is left as it is.")
    fim_prefix_token: str = opt("<fim_prefix>", "FIM: the prefix sentinel (a token of the tokenizer).")
    fim_middle_token: str = opt("<fim_middle>", "FIM: the middle sentinel (a token of the tokenizer).")
    fim_suffix_token: str = opt("<fim_suffix>", "FIM: the suffix sentinel (a token of the tokenizer).")
    fim_pad_token: str = opt("<fim_pad>", "FIM: the token that pads a sample its rearrangement shortened.")
    fim_eod_token: str = opt("<|endoftext|>", "FIM: the end-of-document token at which samples are split.")

    @property
    def fim_tokens(self) -> dict[str, str]:
        """``GPTFIMDatasetConfig.fim_extra_tokens``: the sentinels by role."""
        return {
            "prefix": self.fim_prefix_token,
            "middle": self.fim_middle_token,
            "suffix": self.fim_suffix_token,
            "pad": self.fim_pad_token,
            "eod": self.fim_eod_token,
        }

    def fim_problem(self, *, mock_data: bool, tokenizer_type: str) -> str | None:
        """Why these FIM flags cannot train (one line naming the fix), or None. Megatron-LM's own checks first."""
        if not self.fim_data:
            return None
        if mock_data:
            return "--fim-data rearranges real documents: give --data-path (Megatron-LM refuses it with --mock-data)"
        if not self.fim_rate or not self.fim_spm_rate:
            # Megatron-LM asserts both are truthy: 0 is refused there too.
            return "--fim-data needs --fim-rate and --fim-spm-rate above 0 (as Megatron-LM asserts); give both"
        if tokenizer_type not in FIM_TOKENIZER_TYPES:
            return (
                f"--fim-data with --tokenizer-type {tokenizer_type} is not offered: FIM re-tokenizes text through "
                f"Megatron-Core's own tokenizer, checked against ours for {', '.join(FIM_TOKENIZER_TYPES)} only; "
                "use a Hugging Face tokenizer directory with the FIM tokens"
            )
        return None
