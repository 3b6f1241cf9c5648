"""One process reads a checkpoint saved under any layout: its arguments, tensors and model; and generates text."""

from megatron_ext.mcore_import import install

install()  # before any module of this package imports Megatron-Core
