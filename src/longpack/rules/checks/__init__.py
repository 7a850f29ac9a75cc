"""The rules, one module per rule family (importing one changes nothing outside it).

``inputs`` (can the rules run at all), ``topology``, ``pipeline``, ``cp`` (context parallelism and
sequence lengths), ``batch``, ``packing`` (offline and in-batch packing), ``cuda_graphs``, ``energon``,
``vlm`` (the Qwen-VL task encoder's limits and buffer memory), ``moe``, ``family`` (model-family opt-outs) and ``packed_data`` (a packed folder against the config).
:mod:`longpack.rules.runner` lists them, in this order, to build :data:`longpack.rules.RULES`.

The modules also hold the pure predicates the layout planner prunes with (``topology.tp_divides`` ...),
so a rule and the planner's search can never disagree.
"""
