"""Long-context MoE layout planner (pure Python + numpy; never imports torch).

Modules: ``catalog`` (models and GPUs from package data or a Hugging Face ``config.json``),
``arithmetic`` (parameters, Megatron FLOPs per token), ``options`` (training options, pipeline stage
layout), ``memory`` (per-GPU memory on the hottest rank), ``timing`` (step time, TFLOP/s), ``search``
(valid layouts ranked by step time), ``overrides`` (Megatron-Bridge ``key=value``), ``calibration``
(predicted vs published runs, fitting the time model's constants). CLI: ``longpack plan``.
"""
