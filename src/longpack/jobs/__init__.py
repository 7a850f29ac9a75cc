"""One entry point per job: a frozen, keyword-only config validated on construction, and ``.run()``
returning a typed result. The CLI is a thin front end over these; Python users call them directly.

- :class:`PackConfig` -> :class:`PackResult`: SFT data -> Megatron-Bridge packed Parquet + manifest.
- :class:`SweepConfig` -> :class:`SweepResult`: compare pack sizes at equal token slots per step.
- :class:`PlanConfig` -> :class:`PlanResult`: rank parallel layouts by estimated step time.
- :class:`CheckConfig` -> :class:`CheckResult`: run every configuration rule on a training config.
- :class:`TokenizeConfig` -> :class:`TokenizeStoreResult`: inputs -> a token store to pack again and again.
- :class:`VerifyConfig` -> :class:`VerifyResult`: prove with a tiny model that packed = unpacked.

The jobs may import every library layer (nothing below imports them); heavy dependencies are imported
when a job runs, not when this package is imported.

>>> from longpack.jobs import CheckConfig
>>> r = CheckConfig(overrides=("model.context_parallel_size=2",), gpus=8).run()
>>> r.exit_code, [f.rule_id for f in r.findings if f.severity.value == "error"]
(1, ['LP-CP-002'])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# name -> defining module, imported on first access: ``longpack.jobs.CheckConfig`` must not pull in the
# packing stack (numba, pyarrow) that ``PackConfig`` needs.
_LAZY = {
    "CheckConfig": "longpack.jobs.check",
    "CheckResult": "longpack.jobs.check",
    "LocalExecutor": "longpack.jobs.executors",
    "PackExecutor": "longpack.jobs.executors",
    "PackConfig": "longpack.jobs.pack",
    "PackResult": "longpack.jobs.pack",
    "PlanConfig": "longpack.jobs.plan",
    "PreviewConfig": "longpack.jobs.preview",
    "PreviewResult": "longpack.jobs.preview",
    "RolloutsConfig": "longpack.jobs.rollouts",
    "RolloutsResult": "longpack.jobs.rollouts",
    "PlanResult": "longpack.jobs.plan",
    "SweepConfig": "longpack.jobs.sweep",
    "SweepResult": "longpack.jobs.sweep",
    "TopologyConfig": "longpack.jobs.topology",
    "TopologyResult": "longpack.jobs.topology",
    "CpCheckConfig": "longpack.jobs.cp_check",
    "EstimateConfig": "longpack.jobs.plan",
    "EstimateResult": "longpack.jobs.plan",
    "EvaluateConfig": "longpack.jobs.calibration",
    "EvaluateResult": "longpack.jobs.calibration",
    "FitConfig": "longpack.jobs.calibration",
    "FitResult": "longpack.jobs.calibration",
    "OnlineSimConfig": "longpack.jobs.online_sim",
    "OnlineSimResult": "longpack.jobs.online_sim",
    "BalanceConfig": "longpack.jobs.balance",
    "BalanceResult": "longpack.jobs.balance",
    "CpCheckResult": "longpack.jobs.cp_check",
    "InspectConfig": "longpack.jobs.inspect",
    "InspectResult": "longpack.jobs.inspect",
    "ThdBatchConfig": "longpack.jobs.thd_batch",
    "ThdBatchResult": "longpack.jobs.thd_batch",
    "TokenizeConfig": "longpack.jobs.tokenize",
    "TokenizeStoreResult": "longpack.jobs.tokenize",
    "VerifyConfig": "longpack.jobs.verify",
    "VerifyResult": "longpack.jobs.verify",
}

__all__ = [
    "BalanceConfig",
    "BalanceResult",
    "CheckConfig",
    "CheckResult",
    "CpCheckConfig",
    "CpCheckResult",
    "EstimateConfig",
    "EstimateResult",
    "EvaluateConfig",
    "EvaluateResult",
    "FitConfig",
    "FitResult",
    "InspectConfig",
    "InspectResult",
    "LocalExecutor",
    "OnlineSimConfig",
    "OnlineSimResult",
    "PackConfig",
    "PackExecutor",
    "PackResult",
    "PlanConfig",
    "PlanResult",
    "PreviewConfig",
    "PreviewResult",
    "RolloutsConfig",
    "RolloutsResult",
    "SweepConfig",
    "SweepResult",
    "ThdBatchConfig",
    "ThdBatchResult",
    "TokenizeConfig",
    "TokenizeStoreResult",
    "TopologyConfig",
    "TopologyResult",
    "VerifyConfig",
    "VerifyResult",
]

if TYPE_CHECKING:
    from longpack.jobs.balance import BalanceConfig, BalanceResult
    from longpack.jobs.calibration import EvaluateConfig, EvaluateResult, FitConfig, FitResult
    from longpack.jobs.check import CheckConfig, CheckResult
    from longpack.jobs.cp_check import CpCheckConfig, CpCheckResult
    from longpack.jobs.executors import LocalExecutor, PackExecutor
    from longpack.jobs.inspect import InspectConfig, InspectResult
    from longpack.jobs.online_sim import OnlineSimConfig, OnlineSimResult
    from longpack.jobs.pack import PackConfig, PackResult
    from longpack.jobs.plan import EstimateConfig, EstimateResult, PlanConfig, PlanResult
    from longpack.jobs.preview import PreviewConfig, PreviewResult
    from longpack.jobs.rollouts import RolloutsConfig, RolloutsResult
    from longpack.jobs.sweep import SweepConfig, SweepResult
    from longpack.jobs.thd_batch import ThdBatchConfig, ThdBatchResult
    from longpack.jobs.tokenize import TokenizeConfig, TokenizeStoreResult
    from longpack.jobs.topology import TopologyConfig, TopologyResult
    from longpack.jobs.verify import VerifyConfig, VerifyResult


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'longpack.jobs' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
