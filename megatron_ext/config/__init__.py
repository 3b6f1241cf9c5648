"""The configuration of a run: flags, layout, presets and exit codes (no torch, no I/O)."""
