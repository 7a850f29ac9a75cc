"""Cost models and targets for ``longpack.balance``, built from the planner's catalogs and time model.

The planner knows models, GPUs and how fast a GPU runs a model; the balanced packer only needs a
``PackCostModel`` and a ``BalanceTarget``. This module turns the first into the second (planner ->
balance; ``longpack.balance`` never imports the planner):

* ``pack_cost_model(model=..., gpu=..., precision=..., tp=..., cp=...)``: seconds per pack.
* ``parse_balance_spec("dp=8,pp=4,gbs=128,model=M,gpu=G")``: the ``longpack pack --balance`` text as a
  ``BalanceTarget`` (the text is kept on ``BalanceTarget.spec`` for the manifest).

>>> t = parse_balance_spec("dp=2,gbs=4,linear=1.0,quadratic=0.001")
>>> t.dp, t.pp, t.gbs, t.cost_model.quadratic, t.spec
(2, 1, 4, 0.001, 'dp=2,gbs=4,linear=1.0,quadratic=0.001')
"""

from __future__ import annotations

from longpack.balance.cost import PackCostModel
from longpack.balance.target import BalanceTarget
from longpack.errors import ConfigError

__all__ = ["pack_cost_model", "parse_balance_spec"]

_INT_KEYS = ("dp", "pp", "vpp", "gbs", "mbs", "tp", "cp")
_FLOAT_KEYS = ("linear", "quadratic", "per_sequence", "per_pack")
_STR_KEYS = ("model", "gpu", "precision", "schedule", "sampler")
PRECISIONS = ("bf16", "fp8", "mxfp8")


def pack_cost_model(
    *, model: str, gpu: str, precision: str = "bf16", tp: int = 1, cp: int = 1
) -> PackCostModel:
    """Cost in seconds of one pack from the planner's FLOP and time models (Megatron FLOPs per token).

    FLOPs: the planner's Megatron FLOPs per token split into the part that does not depend on the
    context (GEMMs, logits, linear-attention chunks) and the core-attention slope ``6·C_core·L_attn``
    per token per unit of context (a causal sequence of length ``L`` costs ``slope·L²``). Rates: the
    GPU's BF16 peak times the planner's fitted GEMM efficiency (times its FP8 speed-up for ``fp8``/
    ``mxfp8``) for the linear part and, for core attention, the fused-attention kernel curves at their
    long-sequence plateau (forward + 2.5x backward, the model's head dim and GPU generation) times the
    fitted attention factor, times ``tp·cp`` (the GPUs that run one pack). ``model`` is a catalog name
    or an HF ``config.json``.

    >>> m = pack_cost_model(model="qwen3_30b_a3b", gpu="h100")
    >>> round(m.pack_cost([32768]) / m.pack_cost([1024] * 32), 2)  # one 32K doc vs 32 x 1K
    3.73
    """
    from longpack.planner.arithmetic import flops_breakdown
    from longpack.planner.attention import BACKWARD_FLOP_RATIO, attention_head_dim, kernel_efficiency
    from longpack.planner.catalog import load_gpu, load_model
    from longpack.planner.timing import fitted_params

    if precision not in PRECISIONS:
        raise ConfigError(f"precision {precision!r} is unknown; choose one of {', '.join(PRECISIONS)}")
    spec, device, params = load_model(model), load_gpu(gpu), fitted_params()
    at1 = flops_breakdown(spec, 1)
    at2 = flops_breakdown(spec, 2)
    slope = at2.attention - at1.attention  # FLOPs per token per token of context
    constant = at1.dense_gemm + at1.expert_gemm + at1.logits + (at1.attention - slope)
    group = max(1, int(tp)) * max(1, int(cp))
    bf16 = device.peak_tflops("bf16") * 1e12
    speedup = {"bf16": 1.0, "fp8": params.fp8_speedup, "mxfp8": params.fp8_speedup_blackwell}
    plateau = 16384  # tokens: the kernel curves are flat beyond
    head_dim = attention_head_dim(spec)

    def eff(direction: str) -> float:
        return kernel_efficiency(direction, True, plateau, head_dim=head_dim, blackwell=device.is_blackwell)

    # Megatron counts attention as 3x its forward; the kernels run forward + 2.5x forward
    attention_eff = 3.0 / (1.0 / eff("fwd") + BACKWARD_FLOP_RATIO / eff("bwd")) * params.attention_factor
    return PackCostModel.from_flops(
        linear_flops_per_token=constant,
        # slope·L² = pair·L²/2 over the L(L+1)/2 causal pairs of a sequence
        attention_flops_per_token_pair=2.0 * slope,
        flops_per_second=bf16 * params.eta_gemm * speedup[precision] * group,
        attention_flops_per_second=bf16 * attention_eff * group,
    )


def parse_balance_spec(spec: str) -> BalanceTarget:
    """Read ``key=value,...``: ``dp``, ``gbs`` (required), ``pp``, ``vpp``, ``mbs``, ``schedule``,
    ``sampler``, and the cost model: either ``model=M,gpu=G`` (planner catalog names; optional
    ``precision``, and ``tp``/``cp`` for the group that runs one pack; see ``pack_cost_model``) or
    explicit coefficients ``linear=..,quadratic=..[,per_sequence=..,per_pack=..]``. ``schedule``
    defaults to ``interleaved`` when ``vpp > 1``, else ``1f1b``. Raises ``ConfigError`` naming the item.

    >>> parse_balance_spec("dp=8,pp=4,gbs=128,model=llama3_1_8b,gpu=h100").cost_model.quadratic > 0
    True
    >>> parse_balance_spec("dp=8")
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: balance spec 'dp=8' needs gbs=...: the global batch size (packs per optimizer step)
    """
    if not isinstance(spec, str):
        raise ConfigError(f"balance spec must be a string like 'dp=8,gbs=128,model=M,gpu=G', got {spec!r}")
    what = f"balance spec {spec!r}"
    values: dict[str, str] = {}
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in (*_INT_KEYS, *_FLOAT_KEYS, *_STR_KEYS):
            known = ", ".join((*_INT_KEYS, *_FLOAT_KEYS, *_STR_KEYS))
            raise ConfigError(f"{what}: item {part!r} is not key=value with a known key ({known})")
        values[key] = value.strip()
    ints: dict[str, int] = {}
    for key in _INT_KEYS:
        if key in values:
            try:
                ints[key] = int(values[key])
            except ValueError:
                raise ConfigError(f"{what}: {key}={values[key]!r} is not an integer") from None
    for key, meaning in (
        ("dp", "data-parallel size"),
        ("gbs", "global batch size (packs per optimizer step)"),
    ):
        if key not in ints:
            raise ConfigError(f"{what} needs {key}=...: the {meaning}")
    floats: dict[str, float] = {}
    for key in _FLOAT_KEYS:
        if key in values:
            try:
                floats[key] = float(values[key])
            except ValueError:
                raise ConfigError(f"{what}: {key}={values[key]!r} is not a number") from None
    if "model" in values or "gpu" in values:
        if floats:
            raise ConfigError(f"{what} takes either model=/gpu= or explicit coefficients, not both")
        if "model" not in values or "gpu" not in values:
            raise ConfigError(f"{what} needs both model=M and gpu=G to derive the cost model")
        cost = pack_cost_model(
            model=values["model"],
            gpu=values["gpu"],
            precision=values.get("precision", "bf16"),
            tp=ints.get("tp", 1),
            cp=ints.get("cp", 1),
        )
    elif "linear" in floats and "quadratic" in floats:
        try:
            cost = PackCostModel(**floats)
        except ValueError as exc:
            raise ConfigError(f"{what}: {exc}") from None
    else:
        raise ConfigError(
            f"{what} needs a cost model: model=M,gpu=G (planner catalog) or linear=..,quadratic=.."
        )
    return BalanceTarget(
        cost_model=cost,
        dp=ints["dp"],
        gbs=ints["gbs"],
        pp=ints.get("pp", 1),
        vpp=ints.get("vpp", 1),
        micro_batch_size=ints.get("mbs", 1),
        schedule=values.get("schedule", "interleaved" if ints.get("vpp", 1) > 1 else "1f1b"),
        sampler=values.get("sampler", "batch"),
        spec=spec,
    )
