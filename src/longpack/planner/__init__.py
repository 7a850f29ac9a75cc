"""Long-context MoE layout planner (pure Python + numpy; never imports torch).

Modules: ``catalog`` (models and GPUs from package data or a Hugging Face ``config.json``),
``arithmetic`` (parameters, Megatron FLOPs per token), ``options`` (training options, pipeline stage
layout), ``layers`` (layer kinds, saved tensors, stage split: shared by the next two), ``memory``
(per-GPU memory on the hottest rank), ``timing`` (THE step-time model, ``estimate_time``, with
``RowWork`` for packed rows: plan, sweep and balance all call it), ``search`` (valid layouts ranked by
step time), ``uncertainty`` (error bands from leave-one-model-out residuals), ``evidence`` (which
settings a calibration point constrains), ``reference`` (the published or seed-rule layout beside a
plan), ``overrides`` (Megatron-Bridge ``key=value``), ``calibration``
(predicted vs published runs, fitting the time model's constants), ``balance_costs`` (pack cost models
and ``--balance`` targets for ``longpack.balance``; imported on its own, so planning never loads the
packer). CLI: ``longpack plan``.
"""
