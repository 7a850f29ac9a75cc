"""longpack: packed sequences, THD batches, config checks and layout planning for Megatron-style training.

The jobs are one import away and load their dependencies only when used (``import longpack`` stays
light: no numba, pyarrow or torch)::

    import longpack
    result = longpack.PackConfig(demo=True, out="out/demo").run()
    print(result.counts)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from longpack._version import __version__

# name -> module that defines it; imported on first attribute access (PEP 562).
_LAZY = {
    "PackConfig": "longpack.jobs.pack",
    "PackResult": "longpack.jobs.pack",
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
    "PlanConfig": "longpack.jobs.plan",
    "PreviewConfig": "longpack.jobs.preview",
    "PreviewResult": "longpack.jobs.preview",
    "PlanResult": "longpack.jobs.plan",
    "CheckConfig": "longpack.jobs.check",
    "CheckResult": "longpack.jobs.check",
    "LocalExecutor": "longpack.jobs.executors",
    "TokenizeConfig": "longpack.jobs.tokenize",
    "LongpackError": "longpack.errors",
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
    "LongpackError",
    "OnlineSimConfig",
    "OnlineSimResult",
    "PackConfig",
    "PackResult",
    "PlanConfig",
    "PlanResult",
    "PreviewConfig",
    "PreviewResult",
    "SweepConfig",
    "SweepResult",
    "ThdBatchConfig",
    "ThdBatchResult",
    "TokenizeConfig",
    "TopologyConfig",
    "TopologyResult",
    "__version__",
]

if TYPE_CHECKING:
    from longpack.errors import LongpackError
    from longpack.jobs.balance import BalanceConfig, BalanceResult
    from longpack.jobs.calibration import EvaluateConfig, EvaluateResult, FitConfig, FitResult
    from longpack.jobs.check import CheckConfig, CheckResult
    from longpack.jobs.cp_check import CpCheckConfig, CpCheckResult
    from longpack.jobs.executors import LocalExecutor
    from longpack.jobs.inspect import InspectConfig, InspectResult
    from longpack.jobs.online_sim import OnlineSimConfig, OnlineSimResult
    from longpack.jobs.pack import PackConfig, PackResult
    from longpack.jobs.plan import EstimateConfig, EstimateResult, PlanConfig, PlanResult
    from longpack.jobs.preview import PreviewConfig, PreviewResult
    from longpack.jobs.sweep import SweepConfig, SweepResult
    from longpack.jobs.thd_batch import ThdBatchConfig, ThdBatchResult
    from longpack.jobs.tokenize import TokenizeConfig
    from longpack.jobs.topology import TopologyConfig, TopologyResult


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'longpack' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
