"""The planner's view of :mod:`longpack.catalog`: the same module's names, re-exported (kept so ``from
longpack.planner.catalog import load_model`` keeps working; new code imports :mod:`longpack.catalog`).

>>> load_model("llama3_1_8b").num_layers, load_gpu("H100").nvlink_domain
(32, 8)
"""

from __future__ import annotations

from longpack.catalog import *  # noqa: F403 - every public name of the one catalog, none restated here
from longpack.catalog import __all__ as __all__
