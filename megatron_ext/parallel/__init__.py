"""The ground floor: how a run is split over processes, as arithmetic (no torch, and no import from the rest
of ``megatron_ext``).

* ``layout``   ``ParallelLayout``: TP, PP, VP, CP, DP and the batch split, every
               Megatron-Core rule checked on creation, each broken one named
               with its factors and a fix;
* ``stages``   which layers each pipeline rank and virtual stage holds (even,
               first/last, account-for and layout-string splits);
* ``pipeline`` the pipeline formulas: bubble, warm-up, activations in flight;
* ``factors``  divisors and nearby multiples, for the suggested fixes.
"""
