"""One process reads a checkpoint saved under any layout: its arguments, tensors and model; and generates text."""
