"""The training runtime behind ``pretrain_gpt.py`` (torch and Megatron-Core)."""

from megatron_ext import notices
from megatron_ext.mcore_import import install

# Before any module of this package imports Megatron-Core:
notices.install()  # its warnings that do not apply to a run are left out
install()
