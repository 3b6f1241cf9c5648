"""The training runtime behind ``pretrain_gpt.py`` (torch and Megatron-Core)."""

from megatron_ext.mcore_import import install

install()  # before any module of this package imports Megatron-Core
