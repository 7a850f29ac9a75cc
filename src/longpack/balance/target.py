"""What the balanced packer balances for: the training topology and the pack cost model.

``BalanceTarget`` is what ``longpack.binpack.pack_lengths(..., algorithm="balanced", balance=...)`` and
``longpack pack --balance dp=8,pp=4,gbs=128,model=qwen3_30b_a3b,gpu=h100`` take.

>>> t = BalanceTarget.parse("dp=2,gbs=4,linear=1.0,quadratic=0.001")
>>> t.dp, t.pp, t.gbs, t.cost_model.quadratic
(2, 1, 4, 0.001)
"""

from __future__ import annotations

from dataclasses import dataclass

from longpack.balance.cost import PackCostModel
from longpack.balance.schedule import SAMPLERS, SCHEDULES

_INT_KEYS = ("dp", "pp", "vpp", "gbs", "mbs", "tp", "cp")
_FLOAT_KEYS = ("linear", "quadratic", "per_sequence", "per_pack")
_STR_KEYS = ("model", "gpu", "precision", "schedule", "sampler")


@dataclass(frozen=True, kw_only=True)
class BalanceTarget:
    """Topology and cost model the balanced packer evens out work for.

    ``dp`` data-parallel ranks, ``pp`` pipeline stages (``vpp`` virtual stages per rank with the
    ``interleaved`` schedule), ``gbs`` packs per global batch, ``micro_batch_size`` packs per micro-batch
    and ``sampler`` (how the global batch is dealt to DP ranks; see ``longpack.balance.schedule``).
    """

    cost_model: PackCostModel
    dp: int
    gbs: int
    pp: int = 1
    vpp: int = 1
    micro_batch_size: int = 1
    schedule: str = "1f1b"
    sampler: str = "batch"

    def __post_init__(self) -> None:
        for name in ("dp", "gbs", "pp", "vpp", "micro_batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"BalanceTarget.{name} must be a positive integer, got {value!r}")
        if self.gbs % (self.dp * self.micro_batch_size):
            raise ValueError(
                f"gbs={self.gbs} is not divisible by MBS*DP = {self.micro_batch_size}*{self.dp}; "
                "use the global batch size of the training run (a multiple of MBS*DP)"
            )
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule {self.schedule!r} is unknown; choose one of {', '.join(SCHEDULES)}")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler {self.sampler!r} is unknown; choose one of {', '.join(SAMPLERS)}")

    @classmethod
    def parse(cls, spec: str) -> BalanceTarget:
        """Read ``key=value,...``: ``dp``, ``gbs`` (required), ``pp``, ``vpp``, ``mbs``, ``schedule``,
        ``sampler``, and the cost model: either ``model=M,gpu=G`` (planner catalog names; optional
        ``precision``, and ``tp``/``cp`` for the group that runs one pack) or explicit coefficients
        ``linear=..,quadratic=..[,per_sequence=..,per_pack=..]``.

        >>> BalanceTarget.parse("dp=8,pp=4,gbs=128,model=llama3_1_8b,gpu=h100").cost_model.quadratic > 0
        True
        >>> BalanceTarget.parse("dp=8")
        Traceback (most recent call last):
        ...
        ValueError: --balance needs gbs=...: the global batch size (packs per optimizer step)
        """
        values: dict[str, str] = {}
        for part in spec.split(","):
            part = part.strip()
            if not part:
                continue
            key, sep, value = part.partition("=")
            key = key.strip().lower()
            if not sep or key not in (*_INT_KEYS, *_FLOAT_KEYS, *_STR_KEYS):
                known = ", ".join((*_INT_KEYS, *_FLOAT_KEYS, *_STR_KEYS))
                raise ValueError(f"--balance item {part!r} is not key=value with a known key ({known})")
            values[key] = value.strip()
        ints: dict[str, int] = {}
        for key in _INT_KEYS:
            if key in values:
                try:
                    ints[key] = int(values[key])
                except ValueError:
                    raise ValueError(f"--balance {key}={values[key]!r} is not an integer") from None
        for key, what in (
            ("dp", "data-parallel size"),
            ("gbs", "global batch size (packs per optimizer step)"),
        ):
            if key not in ints:
                raise ValueError(f"--balance needs {key}=...: the {what}")
        floats: dict[str, float] = {}
        for key in _FLOAT_KEYS:
            if key in values:
                try:
                    floats[key] = float(values[key])
                except ValueError:
                    raise ValueError(f"--balance {key}={values[key]!r} is not a number") from None
        if "model" in values or "gpu" in values:
            if floats:
                raise ValueError("--balance takes either model=/gpu= or explicit coefficients, not both")
            if "model" not in values or "gpu" not in values:
                raise ValueError("--balance needs both model=M and gpu=G to derive the cost model")
            cost = PackCostModel.from_planner(
                model=values["model"],
                gpu=values["gpu"],
                precision=values.get("precision", "bf16"),
                tp=ints.get("tp", 1),
                cp=ints.get("cp", 1),
            )
        elif "linear" in floats and "quadratic" in floats:
            cost = PackCostModel(**floats)
        else:
            raise ValueError(
                "--balance needs a cost model: model=M,gpu=G (planner catalog) or linear=..,quadratic=.."
            )
        return cls(
            cost_model=cost,
            dp=ints["dp"],
            gbs=ints["gbs"],
            pp=ints.get("pp", 1),
            vpp=ints.get("vpp", 1),
            micro_batch_size=ints.get("mbs", 1),
            schedule=values.get("schedule", "interleaved" if ints.get("vpp", 1) > 1 else "1f1b"),
            sampler=values.get("sampler", "batch"),
        )
