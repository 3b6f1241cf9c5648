"""One process reads a checkpoint saved under any layout: its arguments, tensors and model; and generates text."""

from megatron_ext import notices
from megatron_ext.mcore_import import install

# Before any module of this package imports Megatron-Core:
notices.install()  # its warnings that do not apply to a run are left out
install()
