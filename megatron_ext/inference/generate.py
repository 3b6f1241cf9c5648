"""Autoregressive sampling from Megatron-Core's GPTModel: greedy, or temperature with top-k / top-p, seeded.

Every step runs the model over the context (no key/value cache): this is for
looking at what a checkpoint has learned, not for serving. The context is the
last ``window`` tokens (the positions the model was trained on, within its sliding window if it has one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from megatron_ext.inference.checkpoint import forward_logits


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen."""

    temperature: float = 0.0
    """0: greedy (the most likely token); otherwise logits are divided by it before sampling."""
    top_k: int = 0
    """Sample among the k most likely tokens only (0: all)."""
    top_p: float = 0.0
    """Sample among the most likely tokens whose probabilities add up to p (nucleus; 0 or 1: all)."""
    seed: int = 1234
    """Seed of the sampling generator: the same seed gives the same text."""

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"--temperature {self.temperature:g} is negative; use 0 for greedy or a positive value")
        if self.top_k < 0:
            raise ValueError(f"--top-k {self.top_k} is negative; use 0 for no limit")
        if not 0 <= self.top_p <= 1:
            raise ValueError(f"--top-p {self.top_p:g} is not in [0, 1]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def next_token(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator) -> int:
    """The next token from the last position's logits (over the tokenizer's vocabulary, fp32, CPU)."""
    if sampling.greedy:
        return int(torch.argmax(logits))
    logits = logits / sampling.temperature
    if sampling.top_k > 0 and sampling.top_k < logits.numel():
        kth = torch.topk(logits, sampling.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if 0 < sampling.top_p < 1:
        ordered, order = torch.sort(logits, descending=True)
        cumulative = torch.softmax(ordered, dim=-1).cumsum(dim=-1)
        # Drop a token when the ones before it already reach p (the most likely one always stays).
        drop = cumulative - torch.softmax(ordered, dim=-1) >= sampling.top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return int(torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator))


def generate(
    model: Any,
    prompt: list[int],
    *,
    max_new_tokens: int,
    sampling: Sampling,
    vocab_size: int,
    window: int,
    stop: int | None,
    device: torch.device,
) -> list[int]:
    """Up to ``max_new_tokens`` new token ids after ``prompt``, ending early at ``stop`` (included)."""
    generator = torch.Generator().manual_seed(sampling.seed)
    ids = list(prompt)
    for _ in range(max_new_tokens):
        context = torch.tensor([ids[-window:]], dtype=torch.long, device=device)
        # Padded vocabulary rows are not tokens: never chosen.
        logits = forward_logits(model, context)[0, -1, :vocab_size].float().cpu()
        token = next_token(logits, sampling, generator)
        ids.append(token)
        if token == stop:
            break
    return ids[len(prompt) :]
