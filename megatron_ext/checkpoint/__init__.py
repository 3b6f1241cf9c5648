"""Checkpoints on disk, without torch: the directory format (``on_disk``), what a checkpoint's common state records and the
refusals that follow from it (``records``), and the run's identity (``run_identity``).

Megatron-Core keeps the same split: ``dist_checkpointing/core.py`` holds the
format, ``serialization.py`` the I/O. Here the I/O is
``megatron_ext.training.checkpointing`` (torch and Megatron-Core); the elastic
planner, the entry's checks, ``--dry-run`` and the tools read the format side alone.
"""
