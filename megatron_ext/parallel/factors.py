"""Divisors and nearby multiples: the arithmetic behind every layout message's suggested fix."""

from __future__ import annotations


def divisors(n: int) -> list[int]:
    """The positive divisors of ``n``, ascending."""
    return [d for d in range(1, n + 1) if n % d == 0]


def nearest_multiples(value: int, multiple: int) -> str:
    """'32' or '24 or 32': the multiples of ``multiple`` around ``value``."""
    below = (value // multiple) * multiple
    above = below + multiple
    return f"{above}" if below == 0 else f"{below} or {above}"
