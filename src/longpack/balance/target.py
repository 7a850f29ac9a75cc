"""What the balanced packer balances for: the training topology and the pack cost model.

``BalanceTarget`` is what ``longpack.balance.balanced_pack(lengths, capacity, target, seed=...)`` takes.
It is typed: a cost model object and integers, no text to interpret. The text form
``dp=8,pp=4,gbs=128,model=qwen3_30b_a3b,gpu=h100`` (``longpack pack --balance``) is read by
``longpack.planner.balance_costs.parse_balance_spec``, which builds the cost model from the planner's
catalogs; ``spec`` keeps that text so a pack manifest can record it.

>>> t = BalanceTarget(cost_model=PackCostModel(linear=1.0, quadratic=0.001), dp=2, gbs=4)
>>> t.dp, t.pp, t.gbs, t.schedule
(2, 1, 4, '1f1b')
>>> t.spec
'dp=2,gbs=4,pp=1,vpp=1,mbs=1,schedule=1f1b,sampler=batch,linear=1.0,quadratic=0.001,per_sequence=0.0,per_pack=0.0'
"""

from __future__ import annotations

from dataclasses import dataclass, field

from longpack import choices
from longpack.balance.cost import PackCostModel
from longpack.balance.schedule import SAMPLERS, SCHEDULES
from longpack.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class BalanceTarget:
    """Topology and cost model the balanced packer evens out work for.

    ``dp`` data-parallel ranks, ``pp`` pipeline stages (``vpp`` virtual stages per rank with the
    ``interleaved`` schedule), ``gbs`` packs per global batch, ``micro_batch_size`` packs per micro-batch
    and ``sampler`` (how the global batch is dealt to DP ranks; see ``longpack.balance.schedule``).
    ``spec`` is the text the target was read from (``longpack.planner.balance_costs.parse_balance_spec``);
    when the target is built in code it is filled with an equivalent text (explicit cost coefficients)
    that ``parse_balance_spec`` reads back. It is a record only: it is not compared and never interpreted.
    """

    cost_model: PackCostModel
    dp: int
    gbs: int
    pp: int = 1
    vpp: int = 1
    micro_batch_size: int = 1
    schedule: str = choices.SCHEDULE_1F1B
    sampler: str = choices.BATCH_SAMPLER
    spec: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.cost_model, PackCostModel):
            raise ConfigError(
                f"BalanceTarget.cost_model must be a PackCostModel, got {type(self.cost_model).__name__}; "
                "build one with PackCostModel(...) or "
                "longpack.planner.balance_costs.pack_cost_model(model=..., gpu=...)"
            )
        for name in ("dp", "gbs", "pp", "vpp", "micro_batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"BalanceTarget.{name} must be a positive integer, got {value!r}")
        if self.gbs % (self.dp * self.micro_batch_size):
            raise ConfigError(
                f"BalanceTarget.gbs={self.gbs} is not divisible by MBS*DP = {self.micro_batch_size}*{self.dp}; "
                "use the global batch size of the training run (a multiple of MBS*DP)"
            )
        if self.schedule not in SCHEDULES:
            raise ConfigError(
                f"BalanceTarget.schedule {self.schedule!r} is unknown; choose one of {', '.join(SCHEDULES)}"
            )
        if self.sampler not in SAMPLERS:
            raise ConfigError(
                f"BalanceTarget.sampler {self.sampler!r} is unknown; choose one of {', '.join(SAMPLERS)}"
            )
        if not isinstance(self.spec, str):
            raise ConfigError(f"BalanceTarget.spec must be a string, got {type(self.spec).__name__}")
        if not self.spec:
            object.__setattr__(self, "spec", self.coefficient_spec())

    def coefficient_spec(self) -> str:
        """This target as ``key=value`` text with the cost model's coefficients spelled out.

        >>> BalanceTarget(cost_model=PackCostModel(linear=2.0, quadratic=0.5), dp=1, gbs=2).coefficient_spec()
        'dp=1,gbs=2,pp=1,vpp=1,mbs=1,schedule=1f1b,sampler=batch,linear=2.0,quadratic=0.5,per_sequence=0.0,per_pack=0.0'
        """
        m = self.cost_model
        return (
            f"dp={self.dp},gbs={self.gbs},pp={self.pp},vpp={self.vpp},mbs={self.micro_batch_size},"
            f"schedule={self.schedule},sampler={self.sampler},linear={float(m.linear)!r},"
            f"quadratic={float(m.quadratic)!r},per_sequence={float(m.per_sequence)!r},"
            f"per_pack={float(m.per_pack)!r}"
        )
