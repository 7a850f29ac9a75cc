"""The cp-check job: CP-sharded THD attention over real gloo processes on this machine, compared with
unsharded varlen attention (``longpack.runtime.cp_check``; needs torch).

>>> CpCheckConfig(cp=(100,))
Traceback (most recent call last):
...
longpack.errors.ConfigError: cp must be at most 64 (cp-check starts one process per rank on this machine), got 100
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from longpack.errors import ConfigError
from longpack.jobs.options import seed_option
from longpack.option import option
from longpack.validate import positive_int
from longpack.validate import seed as seed_value

__all__ = ["MAX_CP", "CpCheckConfig", "CpCheckResult"]

#: CP sizes at most: every rank is a real process on this machine.
MAX_CP = 64
DTYPES = ("float64", "float32")

if TYPE_CHECKING:
    from longpack.runtime.cp_check import CPCheckCase


@dataclass(frozen=True, kw_only=True)
class CpCheckConfig:
    """Which CP sizes and dtypes to check; validated on construction (before torch is imported)."""

    command_help = (
        "Ring and all-gather CP attention over real gloo processes vs unsharded varlen attention.\n\n"
        "Builds packed batches (offline collate at a fixed width, in-batch packing of very different "
        "lengths, in-batch at a fixed width), shards them with the THD zigzag split and reports the largest "
        "differences, the per-token loss summed over ranks vs unsharded, and a cross-sequence leak check. "
        "Exit status 1 if any case fails."
    )

    cp: Sequence[int] = option(
        (2, 4), help="CP sizes to check, one gloo process per rank.", cli_type=list[int] | None
    )
    dtype: Sequence[str] = option(DTYPES, help="float64 and/or float32.", cli_type=list[str] | None)
    seed: int = seed_option()
    spawn: bool = option(False, help="Start ranks with spawn instead of forkserver.")

    def __post_init__(self) -> None:
        from longpack.validate import plain_fields

        plain_fields(self)
        object.__setattr__(self, "cp", tuple(self.cp))
        object.__setattr__(self, "dtype", tuple(self.dtype))
        for size in self.cp:
            positive_int(
                size, "cp", at_most=MAX_CP, why="cp-check starts one process per rank on this machine"
            )
        for name in self.dtype:
            if name not in DTYPES:
                raise ConfigError(f"dtype must be among {', '.join(DTYPES)}, got {name!r}", fields="dtype")
        seed_value(self.seed)

    def run(self) -> CpCheckResult:
        from longpack.runtime.cp_check import run_cp_check

        cases: list[Any] = []
        for size in self.cp:
            cases += run_cp_check(
                size,
                seed=self.seed,
                dtypes=tuple(self.dtype),
                start_method="spawn" if self.spawn else "forkserver",
            )
        return CpCheckResult(cases=tuple(cases))


@dataclass(frozen=True, kw_only=True)
class CpCheckResult:
    """One ``longpack.runtime.cp_check.CpCheckCase`` per (CP size, batch, dtype)."""

    cases: tuple[CPCheckCase, ...]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.cases)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "cases": [asdict(c) | {"ok": c.ok} for c in self.cases]}
