"""Megatron-Core GPT pretraining recipes: our package on top of ``megatron-core``.

One subpackage per product, each named for what it holds, on floors that
import only downwards (``docs/architecture.md``; ``lint-imports`` checks them):

* ``parallel``  the ground floor: the frozen ``ParallelLayout`` with every
                Megatron-Core rule, stage placement, the pipeline formulas.
* ``config``    the run's configuration: Megatron-LM's flags (one table),
                their mapping to the layout, model presets, exit codes. Pure:
                no torch, no file or environment access.
* ``estimate``  the analytic models shared by ``--dry-run`` and the layout
                calculator: parameters, FLOPs, memory, step time, hardware,
                pipeline schedules (order and simulated timeline), search.
* ``checkpoint`` checkpoints on disk without torch: the directory format,
                the invariant that no run removes what it did not write, what
                a checkpoint records of its run, and the tokenizer and data
                digests.
* ``training``  the runtime behind ``pretrain_gpt.py``: model, parallel state,
                the loop, checkpoints, resilience, timers.
* ``inference`` a checkpoint saved under any layout, opened in one process:
                its model, tokenizer and tensors; sampling (``generate.py``).
* ``huggingface`` ``transformers`` export and import of checkpoints.
* ``data``      corpus to indexed dataset: tokenizers, preprocessing, the
                ``.bin``/``.idx`` format, blends and their checks.
* ``cli``       the command-line front ends (``tools/*.py`` and the console
                scripts are thin entry points into these).

Subpackages import nothing on their own: ``import megatron_ext.config`` does
not pull in torch.
"""
