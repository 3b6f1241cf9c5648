"""Command-line front ends; ``tools/*.py`` and the console scripts call their ``main``."""
