"""Corpus to Megatron indexed dataset: tokenizers, preprocessing, the .bin/.idx format, blends."""
