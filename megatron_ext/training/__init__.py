"""The training runtime behind ``pretrain_gpt.py`` (torch and Megatron-Core)."""
