"""Parallel layout arithmetic: TP, CP, PP, VPP, EP, ETP, DP, EDP, SP and what follows from them.

Pure Python; no torch. Names follow Megatron-Core (``tensor_model_parallel_size`` = TP, ...).

Example::

    >>> layout = ParallelLayout(world_size=64, tp=2, cp=4, pp=2, ep=8, sp=True)
    >>> layout.dp, layout.edp, layout.pad_seq_to_mult
    (4, 2, 8)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

from longpack.errors import ConfigError
from longpack.validate import optional_positive_int, positive_int

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


class TopologyError(ConfigError):
    """A parallel layout that cannot exist (a size does not divide the world, a size is not positive)."""


def _size(value: object, name: str, *, optional: bool = False) -> int:
    """A parallel size: a positive integer (``optional``: or ``None``), else :class:`TopologyError`."""
    try:
        checked = optional_positive_int(value, name) if optional else positive_int(value, name)
    except ConfigError as exc:
        raise TopologyError(str(exc), fields=exc.fields) from None
    return checked  # type: ignore[return-value]


#: How :func:`pad_seq_to_mult` follows from the layout, as messages and the pack report write it.
PAD_SEQ_TO_MULT_RULE = "lcm(2*CP if CP>1 else 1, CP*TP if SP and TP>1 else 1)"


def _pad_terms(tp: int, cp: int, sp: bool) -> tuple[int, int]:
    """The two terms of :data:`PAD_SEQ_TO_MULT_RULE`: the CP zigzag's and SP's (the one place they are
    computed)."""
    return (2 * cp if cp > 1 else 1), (cp * tp if sp and tp > 1 else 1)


def pad_seq_to_mult(*, tp: int = 1, cp: int = 1, sp: bool = False) -> int:
    """Per-sequence alignment multiple for THD packing under CP and SP.

    :data:`PAD_SEQ_TO_MULT_RULE` (Megatron-Bridge; see docs/reference/packed-format.md#alignment): every
    CP rank gets two equal chunks of every sequence (zigzag), and with SP each CP shard must further split
    evenly over TP.

    >>> pad_seq_to_mult(tp=1, cp=1), pad_seq_to_mult(cp=4), pad_seq_to_mult(tp=4, cp=2, sp=True)
    (1, 8, 8)
    >>> pad_seq_to_mult(tp=4, sp=True), pad_seq_to_mult(tp=4, sp=False)
    (4, 1)
    """
    return math.lcm(*_pad_terms(_size(tp, "tp"), _size(cp, "cp"), sp))


#: Tokens per MXFP8 scaling block: a GEMM over MXFP8 needs the tokens each rank holds to be a multiple
#: (Megatron-LM main fp8_utils.get_fp8_align_size @ 92d68dae89: 32 for mxfp8, 16 for the other recipes).
MXFP8_BLOCK = 32
FP8_ALIGN = 16
#: HybridEP's combine chunk: a packed row's width must be a multiple (NVIDIA-NeMo/Megatron-Bridge@6a33a2a95,
#: skills/nemo-mbridge-perf-sequence-packing/SKILL.md: "a width divisible by 128"). It is a multiple of the
#: 64 tokens Megatron-Core pads uneven HybridEP dispatch to (NVIDIA/Megatron-LM@81770cb015,
#: megatron/core/transformer/moe/fused_a2a.py, HYBRIDEP_TOKEN_ALIGNMENT), so one lcm serves both.
HYBRIDEP_CHUNK = 128


def kernel_pad_multiple(
    *, tp: int = 1, cp: int = 1, sp: bool = False, fp8_recipe: str | None = None, hybridep: bool = False
) -> int:
    """:func:`pad_seq_to_mult` and the kernels' multiples together: every rank's tokens a multiple of the
    FP8 block (``FP8_ALIGN``, or ``MXFP8_BLOCK`` for ``mxfp8``: times CP, and TP under SP, since the row
    is split over those ranks), and HybridEP's 128-token chunk of the row.

    >>> kernel_pad_multiple(tp=2, cp=2, sp=True), kernel_pad_multiple(tp=2, cp=2, sp=True, fp8_recipe="mxfp8")
    (4, 128)
    >>> kernel_pad_multiple(cp=2, hybridep=True), kernel_pad_multiple(tp=4, sp=True, fp8_recipe="delayed")
    (128, 64)
    """
    base = pad_seq_to_mult(tp=tp, cp=cp, sp=sp)
    parts = [base]
    if fp8_recipe:
        block = MXFP8_BLOCK if fp8_recipe.lower() == "mxfp8" else FP8_ALIGN
        parts.append(block * cp * (tp if sp else 1))
    if hybridep:
        parts.append(HYBRIDEP_CHUNK)
    return math.lcm(*parts)


@overload
def align_up(length: int, multiple: int) -> int: ...
@overload
def align_up(length: npt.NDArray[np.int64], multiple: int) -> npt.NDArray[np.int64]: ...
def align_up(length: int | npt.NDArray[np.int64], multiple: int) -> int | npt.NDArray[np.int64]:
    """``length`` rounded up to a multiple of ``multiple``: the length of a sequence padded to
    ``pad_seq_to_mult`` (the one place it is computed; an integer or an integer numpy array).

    >>> align_up(13, 4), align_up(16, 4), align_up(5, 1), align_up(0, 8)
    (16, 16, 5, 0)
    """
    return -(-length // multiple) * multiple


def pad_seq_to_mult_terms(*, tp: int = 1, cp: int = 1, sp: bool = False) -> str:
    """:func:`pad_seq_to_mult`'s two terms with their values, for messages (sizes are not checked here).

    >>> pad_seq_to_mult_terms(tp=4, cp=2, sp=True), pad_seq_to_mult_terms(tp=4, cp=1)
    ('lcm(2*CP=4, CP*TP=8)', 'lcm(1, 1)')
    """
    cp_term, sp_term = _pad_terms(tp, cp, sp)
    cp_text = f"2*CP={cp_term}" if cp > 1 else "1"
    sp_text = f"CP*TP={sp_term}" if sp and tp > 1 else "1"
    return f"lcm({cp_text}, {sp_text})"


def ranks_needed(length: int, max_seqlen_per_rank: int) -> int:
    """Ranks a sequence of ``length`` tokens is spread over under hybrid context parallelism with a
    per-rank cap of ``max_seqlen_per_rank`` tokens: the next power of two of ``length / cap``, at least 1
    (Megatron-Core ``BalancedCPScheduler.gpus_needed``). The one definition the hybrid-CP scheduler
    (``longpack.balance.hybrid_cp``), the planner and the ``LP-HCP`` rules use.

    >>> ranks_needed(12000, 4096), ranks_needed(4096, 4096), ranks_needed(100, 4096), ranks_needed(8193, 4096)
    (4, 1, 1, 4)
    """
    shards = -(-length // max_seqlen_per_rank)
    return 1 << max(0, shards - 1).bit_length()


def zigzag_source_indices(cu_seqlens_padded: Any, cp_size: int, cp_rank: int) -> Any:
    """Token indices CP rank ``cp_rank`` keeps of a packed THD row, as a numpy ``int64`` array.

    Every physical segment ``[s, e)`` of ``cu_seqlens_padded`` is cut into ``2*cp_size`` equal chunks and
    the rank keeps chunks ``cp_rank`` and ``2*cp_size-1-cp_rank`` (TransformerEngine's
    ``thd_get_partitioned_indices``); segments are concatenated in order. The caller checks the offsets
    (start at 0, non-decreasing, each segment a multiple of ``2*cp_size``): this is the one computation
    that the torch runtime (``longpack.runtime.context_parallel``) and the torch-free rollout packer share.

    >>> zigzag_source_indices([0, 8, 12], 2, 0).tolist()
    [0, 1, 6, 7, 8, 11]
    >>> zigzag_source_indices([0, 4], 1, 0).tolist()
    [0, 1, 2, 3]
    """
    import numpy as np  # numpy is a base dependency; imported here so `check` loads no more than it uses

    cu = np.asarray(cu_seqlens_padded, dtype=np.int64)
    if cp_size == 1:
        return np.arange(int(cu[-1]), dtype=np.int64)
    multiple = 2 * cp_size
    lengths = np.diff(cu)
    starts = cu[:-1]
    chunk = lengths // multiple
    local = lengths // cp_size
    seg_of_local = np.repeat(np.arange(lengths.size), local)
    local_starts = np.concatenate([[0], np.cumsum(local)])[:-1]
    offset = np.arange(int(local.sum()), dtype=np.int64) - local_starts[seg_of_local]
    seg_chunk = chunk[seg_of_local]
    first_half = offset < seg_chunk
    source = np.where(
        first_half,
        starts[seg_of_local] + cp_rank * seg_chunk + offset,
        starts[seg_of_local] + (multiple - 1 - cp_rank) * seg_chunk + (offset - seg_chunk),
    )
    return source.astype(np.int64)


@dataclass(frozen=True, kw_only=True)
class ParallelLayout:
    """A Megatron parallel layout on ``world_size`` GPUs.

    Dense layers use ``TP x CP x PP x DP = world_size``. MoE layers use parallel folding:
    ``ETP x EP x PP x EDP = world_size`` (expert DP is independent of CP). ``etp=None`` means
    ``expert_tensor_parallel_size`` defaults to TP, as in Megatron-Core.

    >>> ParallelLayout(world_size=8, tp=2).dp
    4
    >>> ParallelLayout(world_size=8, tp=3)
    Traceback (most recent call last):
    ...
    longpack.topology.TopologyError: world_size=8 is not divisible by TP*CP*PP = 3*1*1 = 3; ...
    """

    world_size: int
    tp: int = 1
    cp: int = 1
    pp: int = 1
    vpp: int | None = None
    ep: int = 1
    etp: int | None = None
    sp: bool = False

    def __post_init__(self) -> None:
        for name in ("world_size", "tp", "cp", "pp", "ep"):
            object.__setattr__(self, name, _size(getattr(self, name), name))
        for name in ("vpp", "etp"):
            object.__setattr__(self, name, _size(getattr(self, name), name, optional=True))
        if not isinstance(self.sp, bool):
            raise TopologyError(f"sp must be True or False, got {self.sp!r}", fields="sp")
        if self.vpp is not None and self.vpp > 1 and self.pp == 1:
            raise TopologyError(
                f"vpp={self.vpp} needs pipeline parallelism (pp > 1); set vpp=None or raise pp"
            )
        dense = self.tp * self.cp * self.pp
        if self.world_size % dense:
            raise TopologyError(
                f"world_size={self.world_size} is not divisible by TP*CP*PP = "
                f"{self.tp}*{self.cp}*{self.pp} = {dense}; choose sizes whose product divides the GPU count"
            )
        expert = self.expert_tp * self.ep * self.pp
        if self.world_size % expert:
            raise TopologyError(
                f"world_size={self.world_size} is not divisible by ETP*EP*PP = "
                f"{self.expert_tp}*{self.ep}*{self.pp} = {expert}; choose an EP (and ETP) whose product "
                "with PP divides the GPU count"
            )

    @property
    def expert_tp(self) -> int:
        """Expert tensor-parallel size (ETP); defaults to TP as in Megatron-Core."""
        return self.tp if self.etp is None else self.etp

    @property
    def dp(self) -> int:
        """Dense data-parallel size: ``world_size / (TP*CP*PP)``."""
        return self.world_size // (self.tp * self.cp * self.pp)

    @property
    def edp(self) -> int:
        """Expert data-parallel size with MoE parallel folding: ``world_size / (ETP*EP*PP)``."""
        return self.world_size // (self.expert_tp * self.ep * self.pp)

    @property
    def model_parallel_size(self) -> int:
        """GPUs that hold one dense model replica: ``TP*CP*PP``."""
        return self.tp * self.cp * self.pp

    @property
    def pad_seq_to_mult(self) -> int:
        """Per-sequence alignment multiple this layout needs for THD packing."""
        return pad_seq_to_mult(tp=self.tp, cp=self.cp, sp=self.sp)


def collate_pad_multiple(*, tp: int = 1, cp_sizes: tuple[int, ...] = (1,), sp: bool = False) -> int:
    """Per-sequence multiple over several CP sizes (training CP and, if set, evaluation CP).

    Megatron-Bridge's ``ConfigContainer.validate`` takes the lcm of :func:`pad_seq_to_mult` over
    ``{model.context_parallel_size, dist.eval_context_parallel_size}``.

    >>> collate_pad_multiple(tp=4, cp_sizes=(2,), sp=True)
    8
    >>> collate_pad_multiple(tp=2, cp_sizes=(2, 4), sp=True)
    8
    """
    return math.lcm(*(pad_seq_to_mult(tp=tp, cp=cp, sp=sp) for cp in cp_sizes))


def check_pad_seq_to_mult(value: int | None, *, tp: int = 1, cp: int = 1, sp: bool = False) -> int:
    """Validate a ``pad_seq_to_mult`` for offline packing against a topology; return the required one.

    Megatron-Bridge never derives or checks this value for offline packing, so a
    packer calls this before writing anything. Any multiple of the required value is accepted.

    >>> check_pad_seq_to_mult(8, tp=2, cp=4, sp=True)
    8
    >>> check_pad_seq_to_mult(2, tp=1, cp=4)
    Traceback (most recent call last):
    ...
    longpack.topology.TopologyError: pad_seq_to_mult=2 is not a multiple of 8 = lcm(2*CP, CP*TP if SP) for TP=1 CP=4 SP=False; ...
    """
    need = pad_seq_to_mult(tp=tp, cp=cp, sp=sp)
    if value is None or isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TopologyError(
            f"pad_seq_to_mult must be a positive integer, got {value!r}; use {need}", fields="pad_seq_to_mult"
        )
    if value % need:
        raise TopologyError(
            f"pad_seq_to_mult={value} is not a multiple of {need} = lcm(2*CP, CP*TP if SP) for TP={tp} CP={cp} "
            f"SP={sp}; every packed sequence must split into 2*CP equal chunks (and CP*TP with SP): use {need}"
        )
    return need


# --- Pipeline stage layouts ------------------------------------------------------------------------

#: Megatron-Core's layout characters (``PipelineParallelLayerLayout.parse_str_to_list``).
LAYOUT_CHARS = {"E": "embedding", "t": "decoder", "m": "mtp", "L": "loss"}
#: Bounds on a layout: its text, its ``(...)`` nesting and what it expands to. Real layouts are a few
#: dozen characters for models of a few hundred layers; ``t*99999999999`` must be an error, not hours
#: of expansion (or a MemoryError).
MAX_LAYOUT_TEXT = 10_000
MAX_LAYOUT_NESTING = 32
MAX_LAYOUT_ENTRIES = 100_000


def _shown(layout: object) -> str:
    """A layout as error messages show it: quoted, cut to 60 characters."""
    text = repr(layout) if isinstance(layout, str) else "<list layout>"
    return text if len(text) <= 60 else text[:57] + "...'"


def _expand_layout(layout: str) -> str:
    """``layout`` with commas and spaces removed and every ``x*n`` / ``(...)*n`` written out, within the
    bounds above."""
    if len(layout) > MAX_LAYOUT_TEXT:
        raise TopologyError(
            f"pipeline layout {_shown(layout)} is {len(layout)} characters long; at most {MAX_LAYOUT_TEXT} "
            "are read (write repeats as (...)*n)"
        )
    text = layout.replace(",", "").replace(" ", "")
    depth = deepest = 0
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        deepest = max(deepest, depth)
    if deepest > MAX_LAYOUT_NESTING:
        raise TopologyError(
            f"pipeline layout {_shown(layout)} nests parentheses {deepest} deep; at most {MAX_LAYOUT_NESTING}"
        )
    too_big = TopologyError(
        f"pipeline layout {_shown(layout)} expands to more than {MAX_LAYOUT_ENTRIES} layers and stage "
        "marks; no model has that many: check the repeat counts"
    )

    def expand(pattern: str, text: str) -> str:
        size = len(text)

        def repeat(match: re.Match[str]) -> str:
            nonlocal size
            body, count = match.group(1), match.group(2)
            if len(count) > 6:  # also keeps int() below Python's digit limit
                raise too_big
            size += len(body) * int(count) - len(match.group(0))
            if size > MAX_LAYOUT_ENTRIES:
                raise too_big
            return body * int(count)

        return re.sub(pattern, repeat, text)

    while True:  # innermost parentheses first, so nested groups expand too
        expanded = expand(r"\(([^()]*)\)\*(\d+)", text)
        if expanded == text:
            break
        text = expanded
    return expand(r"(.)\*(\d+)", text)


def parse_pipeline_layout(layout: str | list[list[str]] | tuple[tuple[str, ...], ...]) -> list[list[str]]:
    """Parse a ``pipeline_model_parallel_layout`` into one list of layer kinds per virtual stage.

    Same grammar as Megatron-Core: ``E`` embedding, ``t`` decoder layer, ``m`` MTP layer, ``L`` loss,
    ``|`` stage boundary, ``x*n`` and ``(...)*n`` repeat, commas are cosmetic. Stages are listed in
    virtual-stage-major order (all PP ranks of virtual stage 0, then virtual stage 1, ...). Lists of
    lists of names (``"embedding"``, ``"decoder"``, ``"mtp"``, ``"loss"``) are accepted as well.

    >>> parse_pipeline_layout("Et*2|(tt|)*2,tL")
    [['embedding', 'decoder', 'decoder'], ['decoder', 'decoder'], ['decoder', 'decoder'], ['decoder', 'loss']]
    >>> parse_pipeline_layout("Ex|L")
    Traceback (most recent call last):
    ...
    longpack.topology.TopologyError: pipeline layout 'Ex|L': unknown layer character 'x' ...
    """
    if not isinstance(layout, str):
        names = set(LAYOUT_CHARS.values())
        stages: list[list[str]] = []
        try:
            rows = list(layout)
        except TypeError:
            raise TopologyError(
                f"pipeline layout must be a string or a list of lists of layer names, got {layout!r}"
            ) from None
        if len(rows) > MAX_LAYOUT_ENTRIES:
            raise TopologyError(f"pipeline layout list has {len(rows)} stages; at most {MAX_LAYOUT_ENTRIES}")
        entries = 0
        for row in rows:
            if isinstance(row, str) or not isinstance(row, list | tuple):
                raise TopologyError(
                    f"pipeline layout list must hold lists of layer names, got {_shown(str(row))}"
                )
            entries += len(row)
            if entries > MAX_LAYOUT_ENTRIES:
                raise TopologyError(
                    f"pipeline layout list places more than {MAX_LAYOUT_ENTRIES} layers; no model has that many"
                )
            stage = [str(x).strip().lower() for x in row]
            bad = [x for x in stage if x not in names]
            if bad:
                raise TopologyError(f"pipeline layout: unknown layer names {bad}; use one of {sorted(names)}")
            stages.append(stage)
        return stages
    text = _expand_layout(layout)
    stages = []
    for chunk in text.split("|"):
        stage = []
        for ch in chunk:
            if ch not in LAYOUT_CHARS:
                raise TopologyError(
                    f"pipeline layout {_shown(layout)}: unknown layer character {ch!r} "
                    f"(known: {', '.join(LAYOUT_CHARS)}; '|' separates stages)"
                )
            stage.append(LAYOUT_CHARS[ch])
        stages.append(stage)
    return stages


@dataclass(frozen=True, kw_only=True)
class PipelineSplit:
    """Decoder (and MTP) layers on every pipeline rank and virtual stage.

    ``decoder[pp_rank][vpp_stage]`` counts decoder layers; ``method`` says how the split was derived
    (``"layout"``, ``"first_last"``, ``"account_for"``, ``"even"``).

    >>> split = pipeline_split(num_layers=8, pp=2, vpp=2)
    >>> split.decoder, split.vpp, split.method
    (((2, 2), (2, 2)), 2, 'even')
    """

    pp: int
    vpp: int
    decoder: tuple[tuple[int, ...], ...]
    mtp: tuple[tuple[int, ...], ...]
    method: str

    @property
    def max_layers_per_stage(self) -> int:
        """Largest decoder-layer count on one virtual stage."""
        return max(max(row) for row in self.decoder)


def pipeline_split(
    *,
    num_layers: int,
    pp: int,
    vpp: int | None = None,
    mtp_num_layers: int | None = None,
    layout: str | list[list[str]] | tuple[tuple[str, ...], ...] | None = None,
    first_stage_layers: int | None = None,
    last_stage_layers: int | None = None,
    account_for_embedding: bool = False,
    account_for_loss: bool = False,
) -> PipelineSplit:
    """Place ``num_layers`` decoder layers on ``pp`` ranks x ``vpp`` virtual stages, as Megatron-Core does.

    Raises :class:`TopologyError` with Megatron-Core's condition and the numbers when the split is
    impossible (rules from ``TransformerConfig.__post_init__`` and ``PipelineParallelLayerLayout``).
    DeepSeek-V3 (61 layers + 1 MTP) on PP8 x VPP4 needs a layout:

    >>> pipeline_split(num_layers=61, pp=8, vpp=4, mtp_num_layers=1, layout="Et|(tt|)*30mL").method
    'layout'
    >>> pipeline_split(num_layers=61, pp=8, vpp=4)
    Traceback (most recent call last):
    ...
    longpack.topology.TopologyError: num_layers=61 is not divisible by PP*VPP = 8*4 = 32; ...
    >>> pipeline_split(num_layers=94, pp=4, vpp=12, account_for_embedding=True, account_for_loss=True).decoder[0][:2]
    (1, 2)
    """
    num_layers, pp = _size(num_layers, "num_layers"), _size(pp, "pp")
    vpp = _size(vpp, "vpp", optional=True)
    mtp = mtp_num_layers or 0
    uneven = first_stage_layers is not None or last_stage_layers is not None
    accounted = account_for_embedding or account_for_loss
    if layout is not None:
        if uneven or accounted:
            raise TopologyError(
                "pipeline_model_parallel_layout cannot be combined with num_layers_in_first/last_pipeline_stage "
                "or account_for_embedding/loss_in_pipeline_split; keep only the layout"
            )
        return _split_from_layout(layout, num_layers=num_layers, pp=pp, vpp=vpp, mtp=mtp)
    if uneven and accounted:
        raise TopologyError(
            "num_layers_in_first/last_pipeline_stage cannot be combined with "
            "account_for_embedding/loss_in_pipeline_split; use one of the two mechanisms"
        )
    v = vpp or 1
    if uneven:
        return _split_first_last(num_layers, pp, v, first_stage_layers, last_stage_layers, mtp)
    counted = num_layers + int(account_for_embedding) + int(account_for_loss)
    if counted % (pp * v):
        what = "num_layers" if not accounted else "num_layers + accounted embedding/loss"
        raise TopologyError(
            f"{what}={counted} is not divisible by PP*VPP = {pp}*{v} = {pp * v}; give a "
            "pipeline_model_parallel_layout or num_layers_in_first/last_pipeline_stage, or change PP/VPP"
        )
    per = counted // (pp * v)
    grid = [[per] * v for _ in range(pp)]
    if account_for_embedding:
        grid[0][0] -= 1
    if account_for_loss:
        grid[pp - 1][v - 1] -= 1
    mtp_grid = [[0] * v for _ in range(pp)]
    mtp_grid[pp - 1][v - 1] = mtp
    return PipelineSplit(
        pp=pp,
        vpp=v,
        decoder=tuple(tuple(r) for r in grid),
        mtp=tuple(tuple(r) for r in mtp_grid),
        method="account_for" if accounted else "even",
    )


def _split_first_last(
    num_layers: int, pp: int, v: int, first: int | None, last: int | None, mtp: int
) -> PipelineSplit:
    if pp < 2:
        raise TopologyError("num_layers_in_first/last_pipeline_stage need pipeline_model_parallel_size > 1")
    middle_layers, middle_ranks = num_layers, pp
    for name, value in (("first", first), ("last", last)):
        if value is None:
            continue
        if value <= 0:
            raise TopologyError(f"num_layers_in_{name}_pipeline_stage must be > 0, got {value}")
        if value % v:
            raise TopologyError(
                f"num_layers_in_{name}_pipeline_stage={value} is not divisible by VPP={v}; "
                f"choose a multiple of {v}"
            )
        middle_layers -= value
        middle_ranks -= 1
    if middle_layers < 0:
        raise TopologyError(f"first/last stage layers exceed num_layers={num_layers}")
    if middle_ranks and middle_layers % middle_ranks:
        raise TopologyError(
            f"{middle_layers} layers left for the {middle_ranks} middle pipeline ranks do not divide evenly; "
            "adjust num_layers_in_first/last_pipeline_stage"
        )
    per_middle = middle_layers // middle_ranks if middle_ranks else 0
    if middle_ranks and per_middle % v:
        raise TopologyError(
            f"{per_middle} layers per middle pipeline rank are not divisible by VPP={v}; "
            "adjust num_layers_in_first/last_pipeline_stage or VPP"
        )
    per_rank = [per_middle] * pp
    if first is not None:
        per_rank[0] = first
    if last is not None:
        per_rank[-1] = last
    grid = tuple(tuple([n // v] * v) for n in per_rank)
    mtp_grid = [[0] * v for _ in range(pp)]
    mtp_grid[pp - 1][v - 1] = mtp
    return PipelineSplit(
        pp=pp, vpp=v, decoder=grid, mtp=tuple(tuple(r) for r in mtp_grid), method="first_last"
    )


def _split_from_layout(
    layout: str | list[list[str]] | tuple[tuple[str, ...], ...],
    *,
    num_layers: int,
    pp: int,
    vpp: int | None,
    mtp: int,
) -> PipelineSplit:
    stages = parse_pipeline_layout(layout)
    shown = _shown(layout)
    if len(stages) % pp:
        raise TopologyError(
            f"pipeline layout {shown} has {len(stages)} stages, not divisible by PP={pp}; "
            f"write PP*VPP stages separated by '|'"
        )
    v = len(stages) // pp
    if vpp is not None and vpp != v and not (vpp == 1 and v == 1):
        raise TopologyError(
            f"virtual_pipeline_model_parallel_size={vpp} conflicts with the layout's {len(stages)} stages / "
            f"PP={pp} = {v} virtual stages; set VPP to {v} or leave it unset"
        )
    flat = [kind for stage in stages for kind in stage]
    if not flat or flat[0] != "embedding" or flat.count("embedding") != 1:
        raise TopologyError(f"pipeline layout {shown} must start with exactly one 'E' (embedding)")
    if flat[-1] != "loss" or flat.count("loss") != 1:
        raise TopologyError(f"pipeline layout {shown} must end with exactly one 'L' (loss)")
    if flat.count("decoder") != num_layers:
        raise TopologyError(
            f"pipeline layout {shown} places {flat.count('decoder')} decoder layers ('t') but "
            f"num_layers={num_layers}"
        )
    if flat.count("mtp") != mtp:
        raise TopologyError(
            f"pipeline layout {shown} places {flat.count('mtp')} MTP layers ('m') but mtp_num_layers={mtp}"
        )
    if "mtp" in flat and "decoder" in flat[flat.index("mtp") :]:
        raise TopologyError(f"pipeline layout {shown}: decoder layers must come before MTP layers")
    # Megatron-Core lists stages virtual-stage-major: stage index = vpp_stage * PP + pp_rank.
    decoder = tuple(tuple(stages[s * pp + r].count("decoder") for s in range(v)) for r in range(pp))
    mtp_grid = tuple(tuple(stages[s * pp + r].count("mtp") for s in range(v)) for r in range(pp))
    for r in range(pp):
        if any(mtp_grid[r][s] for s in range(v - 1)):
            raise TopologyError(
                f"pipeline layout {shown}: MTP layers must be in the last virtual stage of their rank"
            )
    return PipelineSplit(pp=pp, vpp=v, decoder=decoder, mtp=mtp_grid, method="layout")
