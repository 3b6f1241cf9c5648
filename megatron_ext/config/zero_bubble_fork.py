"""The zero-bubble authors' Megatron-LM fork: the flags its users' launch scripts pass beside ``--enable-zero-bubble``.

Qi et al. keep a Megatron-LM fork (sail-sg/zero-bubble-pipeline-parallelism; AMD's Primus carries the same
flags) whose README and example scripts pass, with ``--enable-zero-bubble``::

    --zero-bubble-pipeline-timers-start-iter N --zero-bubble-pipeline-timers-end-iter N
    --zero-bubble-max-pending-backward N --enable-optimizer-post-validation

``--enable-zero-bubble`` is a field here (``ParallelArgs``). The others are taken as Megatron-LM's own flags
without a field are (``megatron_lm_accepted``): accepted and named in the run's notes where they change nothing
here, refused with the reason where this project does not build what they ask for. Evidence: the fork's README
("Zero Bubble Command Line Arguments") and its ``add_zero_bubble_args``.
"""

from __future__ import annotations

from megatron_ext.config.megatron_lm_accepted import Accepted, Given


def _pending_backward(given: Given, value: str) -> str | None:
    # The fork: N = p gives ZB-1p (1F1B's memory), 2p ZB-2p, "auto" (its default) an adaptive limit.
    parallel = given.get("parallel", {})
    if not parallel.get("enable_zero_bubble"):
        return None  # the fork reads it only with --enable-zero-bubble
    pp = parallel.get("pipeline_model_parallel_size") or 1
    fix = f"give --zero-bubble-max-pending-backward {pp} (the pipeline size: ZB-1p, 1F1B's memory) or drop it"
    if value == "auto":
        return f"the fork's adaptive memory limit is not built: the schedules here hold 1F1B's activations; {fix}"
    if not value.isdigit():
        return f"takes an integer or auto, not {value!r}; {fix}"
    if int(value) != pp:
        return (
            f"{value} pending backward passes with PP {pp} is not built (2·PP is the fork's ZB-2p, which trades "
            f"memory for the last of the bubble; this project builds ZB-1p's memory only); {fix}"
        )
    return None


_NOT_V = (
    "the V placement (ZB-V) is not built: simulation chose the zero-bubble interleaved schedule at interleaved "
    "1F1B's memory (docs/layout-model.md, 'Zero-bubble schedules'); give --enable-zero-bubble with "
    "--num-layers-per-virtual-pipeline-stage instead"
)

FORK_FLAGS: dict[str, Accepted] = {
    "--zero-bubble-max-pending-backward": Accepted(
        "accepted at the pipeline size, ZB-1p's limit, which --enable-zero-bubble keeps here (ignored without it, "
        "as in the fork)",
        check_value=_pending_backward,
    ),
    "--zero-bubble-pipeline-timers-start-iter": Accepted(
        "ignored: the zero-bubble schedules here run a fixed order (ZB-H1's, and interleaved 1F1B's split), not "
        "one chosen from F, B and W times measured over these iterations"
    ),
    "--zero-bubble-pipeline-timers-end-iter": Accepted(
        "ignored: the zero-bubble schedules here run a fixed order, not one chosen from timed iterations"
    ),
    "--zero-bubble-adaptive-memory-limit-percentile": Accepted(
        "ignored: read only by the fork's adaptive memory limit (--zero-bubble-max-pending-backward auto), "
        "which is not built"
    ),
    "--enable-optimizer-post-validation": Accepted(
        "ignored: the optimizer step waits for the gradient norm and the overflow check before it runs (as "
        "Megatron-Core's does), which gives the results that the fork's post-validation restores by rollback"
    ),
    "--enable-exactly-numeric-match": Accepted(
        "ignored: the optimizer step is not speculative here, so there is no rollback to match exactly"
    ),
    "--enable-zb-runtime": Accepted(
        "ignored: the schedules run inside Megatron-Core's own schedule functions, not the fork's runtime"
    ),
    "--no-pre-communication-optimization": Accepted(
        "ignored: the fork's runtime's tiny communication before each transfer is not sent here"
    ),
    "--zero-bubble-v-schedule": Accepted("", refused=_NOT_V),
    "--zero-bubble-v-schedule-mem-setup": Accepted("", refused=_NOT_V),
    "--enable-1f1b-v": Accepted("", refused=_NOT_V.replace("(ZB-V)", "(1F1B-V and ZB-V)")),
    "--allow-padding-num-layers": Accepted(
        "ignored: layers are never padded here; a layer count that PP divides needs none, and another is placed "
        "with --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers (the fork's one layer "
        "less on the first and last stage), as the layout check says"
    ),
}
"""The fork's flags that its users' scripts pass with ``--enable-zero-bubble``, and how each is taken."""
