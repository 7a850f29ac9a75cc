"""The settings that shape a packed output (:class:`PackSettings`), in a light module: choices, checks and
the format records only, no numpy or pyarrow, so a job config can name the class (and the CLI's help load)
without the packed layer's writers (``tests/packed/test_settings_module.py`` checks it). ``longpack.packed``
and ``longpack.packed.pipeline`` re-export it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from longpack import choices
from longpack.choices import (
    BALANCED_ALGORITHM,
    COMPAT_MODES,
    DEFAULT_ALGORITHM,
    DEFAULT_OVERLENGTH,
    IDS_DTYPES,
    MEGATRON_ALGORITHM,
    OUTPUT_FORMATS,
    OVERLENGTH_POLICIES,
)
from longpack.errors import ConfigError
from longpack.packed.formats import output_format
from longpack.validate import finite_float, one_of, optional_positive_int, positive_int
from longpack.validate import seed as seed_value

if TYPE_CHECKING:
    from longpack.balance import BalanceTarget
    from longpack.packed.align import AlignedSamples
    from longpack.packed.files import ParquetWriterOptions
    from longpack.samples import TokenizedSamples

__all__ = ["PackSettings"]


@dataclass(frozen=True, kw_only=True)
class PackSettings:
    """Every setting that shapes the packed output.

    ``seq_length`` caps one sample's runtime length (Megatron-Bridge's ``max_single_sequence_length`` or
    ``seq_length``); ``pack_size`` is ``packed_sequence_size`` (default ``seq_length``).

    >>> PackSettings(seq_length=4096).resolved_pack_size
    4096
    >>> PackSettings(seq_length=4096, pack_size=2048)
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: seq_length (4096) must not exceed pack_size (2048): a sample longer than a pack cannot be packed; lower seq_length or raise pack_size
    """

    seq_length: int
    pack_size: int | None = None
    pad_seq_to_mult: int = 1
    algorithm: str = DEFAULT_ALGORITHM
    seed: int = 0
    overlength: str = DEFAULT_OVERLENGTH
    val_fraction: float = 0.0
    rows_per_shard: int | None = None
    #: Topology and cost model for ``algorithm="balanced"`` (a ``longpack.balance.BalanceTarget``; the text
    #: ``dp=8,pp=4,gbs=128,model=M,gpu=G`` is read by ``longpack.planner.balance_costs.parse_balance_spec``):
    #: packs are written in workload-balanced training order. The manifest records ``balance.spec``.
    balance: BalanceTarget | None = None
    #: Parquet type of ``input_ids``: ``int64`` (what Megatron-Bridge's own packer writes) or the opt-in
    #: ``int32`` (its reader accepts any integer type; encodes ~2x faster). ``int32`` needs a
    #: vocabulary that fits in int32 (:func:`check_ids_dtype`).
    ids_dtype: str = choices.DEFAULT_IDS_DTYPE
    #: ``parquet`` (Bridge main) or ``npy`` (Bridge <= 0.3, NeMo 2; one file per split, no shards).
    output_format: str = choices.DEFAULT_OUTPUT_FORMAT
    #: Rows per Parquet row group (``None``: about 65,536 tokens per group, 1..500 rows; see
    #: ``longpack.packed.files.default_row_group_size``).
    row_group_size: int | None = None
    #: ``"megatron-bridge"``: keep one-token samples and write with Bridge's Parquet options, so that with
    #: ``first_fit_shuffle`` the files are byte-identical to Bridge's prepare step on the same samples.
    compat: str | None = None

    def __post_init__(self) -> None:
        one_of(self.output_format, OUTPUT_FORMATS, "output_format")
        if self.row_group_size is not None and (
            not isinstance(self.row_group_size, int) or self.row_group_size < 1
        ):
            raise ConfigError(
                f"row_group_size must be a positive integer, got {self.row_group_size!r}",
                fields="row_group_size",
            )
        if self.compat is not None:
            from longpack.packed.files import BRIDGE_ROW_GROUP_SIZE

            one_of(self.compat, COMPAT_MODES, "compat")
            if self.algorithm != MEGATRON_ALGORITHM:
                raise ConfigError(
                    f"compat {self.compat} packs with {MEGATRON_ALGORITHM} (Bridge's algorithm), got algorithm "
                    f"{self.algorithm!r}; drop algorithm",
                    fields=("compat", "algorithm"),
                )
            if self.row_group_size not in (None, BRIDGE_ROW_GROUP_SIZE):
                raise ConfigError(
                    f"compat {self.compat} writes Bridge's {BRIDGE_ROW_GROUP_SIZE}-row groups; drop "
                    f"row_group_size {self.row_group_size}",
                    fields=("compat", "row_group_size"),
                )
            if self.rows_per_shard is not None:
                raise ConfigError(
                    f"compat {self.compat} writes one file per split, as Bridge does; drop rows_per_shard",
                    fields=("compat", "rows_per_shard"),
                )
        one_of(self.ids_dtype, IDS_DTYPES, "ids_dtype")
        from longpack.binpack import MAX_CAPACITY

        why = "the bin packer's working memory grows with it"
        positive_int(self.seq_length, "seq_length", at_most=MAX_CAPACITY, why=why)
        optional_positive_int(self.pack_size, "pack_size", at_most=MAX_CAPACITY, why=why)
        positive_int(self.pad_seq_to_mult, "pad_seq_to_mult")
        optional_positive_int(self.rows_per_shard, "rows_per_shard")
        seed_value(self.seed)
        finite_float(self.val_fraction, "val_fraction", lo=0.0, hi=1.0, hi_open=True)
        if self.seq_length > self.resolved_pack_size:
            raise ConfigError(
                f"seq_length ({self.seq_length}) must not exceed pack_size ({self.resolved_pack_size}): a "
                "sample longer than a pack cannot be packed; lower seq_length or raise pack_size",
                fields=("seq_length", "pack_size"),
            )
        one_of(self.overlength, OVERLENGTH_POLICIES, "overlength")
        if (self.algorithm == BALANCED_ALGORITHM) != (self.balance is not None):
            raise ConfigError(
                "algorithm='balanced' and a balance target go together: give balance dp=..,gbs=..,model=..,gpu=..",
                fields=("balance", "algorithm"),
            )
        if self.balance is not None:
            from longpack.balance import BalanceTarget

            if not isinstance(self.balance, BalanceTarget):
                raise ConfigError(
                    f"balance must be a longpack.balance.BalanceTarget, got {type(self.balance).__name__} "
                    "(read a 'dp=..,gbs=..,model=..,gpu=..' text with "
                    "longpack.planner.balance_costs.parse_balance_spec)",
                    fields="balance",
                )

    @property
    def resolved_pack_size(self) -> int:
        return self.seq_length if self.pack_size is None else self.pack_size

    @property
    def resolved_rows_per_shard(self) -> int | None:
        """Rows per shard; ``None`` = one file per split (the npy format and the compat mode)."""
        fmt = output_format(self.output_format)
        if not fmt.sharded:
            return None
        if not fmt.default_shards:
            return self.rows_per_shard
        if self.compat is not None:
            return None
        from longpack.packed.files import default_rows_per_shard

        return self.rows_per_shard or default_rows_per_shard(self.resolved_pack_size)

    @property
    def writer_options(self) -> ParquetWriterOptions:
        """The Parquet encoding options (Bridge's own in compat mode)."""
        from longpack.packed.files import (
            BRIDGE_WRITER_OPTIONS,
            ParquetWriterOptions,
            default_row_group_size,
            one_row_pages,
        )

        if self.compat is not None:
            return BRIDGE_WRITER_OPTIONS
        pages = one_row_pages(self.resolved_pack_size)
        return ParquetWriterOptions(
            row_group_size=self.row_group_size or default_row_group_size(self.resolved_pack_size),
            # one row per data page: a reader can decode one row, not its whole group
            max_rows_per_page=pages["max_rows_per_page"],
            data_page_size=pages["data_page_size"],
            compression=pages["compression"],
        )

    @property
    def keep_single_token(self) -> bool:
        """Whether one-token samples (runtime length 0) are packed, as Megatron-Bridge does (compat mode)."""
        return self.compat is not None

    def align(self, samples: TokenizedSamples, *, eos_id: int) -> AlignedSamples:
        """``samples`` aligned as these settings say (:func:`~longpack.packed.align.align_samples`)."""
        from longpack.packed.align import align_samples

        return align_samples(
            samples,
            max_seq_length=self.seq_length,
            pad_seq_to_mult=self.pad_seq_to_mult,
            eos_id=eos_id,
            overlength=self.overlength,
            keep_single_token=self.keep_single_token,
        )
