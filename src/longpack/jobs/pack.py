"""The pack job: SFT data -> Megatron-Bridge packed Parquet (or ``.npy``), metadata, ``bridge_config.yaml`` and
a manifest, in one call.

>>> import tempfile, pathlib, json
>>> src = pathlib.Path(tempfile.mkdtemp()) / "sft.jsonl"
>>> _ = src.write_text("".join(json.dumps({"prompt": f"q{i}", "completion": "a" * i}) + "\\n" for i in range(1, 30)))
>>> r = PackConfig(inputs=[str(src)], out=src.parent / "packed", tokenizer="bytes", seq_length=64).run()
>>> r.counts["packed"], r.splits["training"].rows, r.megatron_bridge["packed_sequence_size"]
(29, 9, 64)
>>> PackConfig(inputs=[str(src)], out="o", tokenizer="bytes", seq_length=64, val_fraction=0.1,
...            val_inputs=[str(src)])
Traceback (most recent call last):
...
longpack.errors.ConfigError: give either val_inputs or val_fraction, not both
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from longpack import choices
from longpack.choices import BRIDGE_DEFAULT_SEED as BRIDGE_DEFAULT_SEED
from longpack.choices import DEFAULT_ALGORITHM, DEFAULT_OVERLENGTH, MEGATRON_ALGORITHM, MIX, TOKEN_STORE
from longpack.choices import DPO as DPO
from longpack.choices import INDEXED as INDEXED
from longpack.choices import OUTPUT_FORMATS as OUTPUT_FORMATS
from longpack.choices import OVERLENGTH_FRAGMENT as FRAGMENT
from longpack.choices import OVERLENGTH_POLICIES as OVERLENGTH_POLICIES
from longpack.errors import ConfigError, InputError
from longpack.jobs.options import DEMO_TOKENIZER as DEMO_TOKENIZER
from longpack.jobs.options import (
    algorithm_option,
    cp_option,
    fp8_recipe_option,
    hybridep_option,
    inputs_option,
    pad_seq_to_mult_option,
    seed_option,
    sp_option,
    tokenizer_option,
    tp_option,
    workers_option,
)
from longpack.option import check_choices, option, refuse_unknown_settings
from longpack.text.rows import TextConfig

if TYPE_CHECKING:
    from longpack.jobs.executors import PackExecutor
    from longpack.packed.formats import OutputFormat
    from longpack.packed.manifest import ManifestSettings, PackManifest, SplitRecord
    from longpack.packed.settings import PackSettings
from longpack.validate import finite_float, flag, optional_positive_int, positive_int
from longpack.validate import seed as seed_value

__all__ = [
    "BRIDGE_DEFAULT_SEED",
    "DEMO_SEQ_LENGTH",
    "DEMO_TOKENIZER",
    "PackConfig",
    "PackResult",
    "resolve_pad_seq_to_mult",
]

DEMO_SEQ_LENGTH = 4096
DEMO_LABEL = "<longpack-demo>"


def resolve_pad_seq_to_mult(
    pad_seq_to_mult: int | None,
    tp: int | None,
    cp: int | None,
    sp: bool,
    *,
    fp8_recipe: str | None = None,
    hybridep: bool = False,
) -> tuple[int, str]:
    """``(pad_seq_to_mult, where it came from)``: given, derived from TP/CP/SP (and the kernels' multiples:
    ``fp8_recipe``'s tokens per rank, HybridEP's 128-token chunk, :func:`longpack.topology.kernel_pad_multiple`,
    the multiple ``longpack topology`` suggests), or 1.

    >>> resolve_pad_seq_to_mult(None, 2, 2, True)
    (4, 'lcm(2*CP if CP>1 else 1, CP*TP if SP and TP>1 else 1) with TP=2 CP=2 SP=True')
    >>> resolve_pad_seq_to_mult(None, 1, 2, False, fp8_recipe="mxfp8")[0]
    64
    >>> resolve_pad_seq_to_mult(None, None, None, False, hybridep=True)[0]
    128
    >>> resolve_pad_seq_to_mult(8, 2, None, False)
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: give either pad_seq_to_mult or tp, cp, sp (and fp8_recipe, hybridep), not both
    """
    from longpack.topology import PAD_SEQ_TO_MULT_RULE, TopologyError, kernel_pad_multiple

    # 0 is an error, never "not given" (`tp or 1` below must not turn --cp 0 into CP 1).
    tp, cp = optional_positive_int(tp, "tp"), optional_positive_int(cp, "cp")
    sp = flag(sp, "sp")
    hybridep = flag(hybridep, "hybridep")
    if fp8_recipe is not None and (not isinstance(fp8_recipe, str) or not fp8_recipe.strip()):
        raise ConfigError(
            f"fp8_recipe must be a recipe name such as mxfp8, got {fp8_recipe!r}", fields="fp8_recipe"
        )
    kernels = fp8_recipe is not None or hybridep
    if pad_seq_to_mult is not None:
        if tp is not None or cp is not None or sp or kernels:
            raise ConfigError(
                "give either pad_seq_to_mult or tp, cp, sp (and fp8_recipe, hybridep), not both",
                fields=("pad_seq_to_mult", "tp", "cp", "sp", "fp8_recipe", "hybridep"),
            )
        pad_seq_to_mult = positive_int(pad_seq_to_mult, "pad_seq_to_mult")
        return pad_seq_to_mult, f"given: pad_seq_to_mult {pad_seq_to_mult}"
    if tp is None and cp is None and not sp and not kernels:
        return 1, "default: no pad_seq_to_mult, tp, cp or sp given"
    try:
        value = kernel_pad_multiple(tp=tp or 1, cp=cp or 1, sp=sp, fp8_recipe=fp8_recipe, hybridep=hybridep)
    except TopologyError as exc:
        raise ConfigError(str(exc), fields=("tp", "cp")) from exc
    source = f"{PAD_SEQ_TO_MULT_RULE} with TP={tp or 1} CP={cp or 1} SP={sp}"
    if kernels:
        parts = ([f"fp8_recipe={fp8_recipe}"] if fp8_recipe else []) + (["HybridEP"] if hybridep else [])
        source += f", and the kernels' multiple for {' and '.join(parts)} (as longpack topology suggests)"
    return value, source


def _paths(value: Any, name: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str | Path):
        return (str(value),)
    try:
        items = tuple(value)
    except TypeError:
        raise ConfigError(
            f"{name} must be a path or a list of paths, got {type(value).__name__}", fields=name
        ) from None
    if not all(isinstance(p, str | Path) for p in items):
        raise ConfigError(f"{name} must hold paths (str or Path), got {items!r}", fields=name)
    return tuple(str(p) for p in items)


def settle_data_source(
    config: Any,
    text: TextConfig,
    *,
    verb: str,
    inputs: Sequence[str] | None = None,
    store_clash: str | None = None,
    error: type[ConfigError] = ConfigError,
) -> tuple[Any, TextConfig]:
    """Where a job's samples come from, checked once for ``pack`` and ``sweep``: ``demo`` (the built-in
    data; the tokenizer defaults to :data:`DEMO_TOKENIZER`), a token ``store`` (its text options checked
    against ``text``) or ``inputs`` (``config.inputs`` unless given), with a tokenizer unless a store is read. Returns the tokenizer and the
    text options the job runs with (``config`` is not written). ``store_clash``: the caller's message when
    ``store`` comes with something it replaces (``None``: it does not). ``verb`` says what the job does with
    the demo data (``"packs"``).

    >>> from types import SimpleNamespace as NS
    >>> settle_data_source(NS(demo=False, inputs=(), store=None, tokenizer="bytes"), TextConfig(), verb="packs")
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: no inputs: give at least one input file, folder or glob in inputs, or set demo=True
    """
    tokenizer = config.tokenizer
    inputs = config.inputs if inputs is None else inputs
    if config.demo:
        if inputs or config.store is not None:
            raise error(
                f"demo=True {verb} the built-in data set; give no inputs with it", fields=("demo", "inputs")
            )
        if tokenizer is None:
            tokenizer = DEMO_TOKENIZER
    elif config.store is not None:
        from longpack.jobs.stores import store_text

        if store_clash is not None:
            raise error(store_clash, fields=("store", "inputs"))
        implied = config.text_implied() if hasattr(config, "text_implied") else None
        text = store_text(config.store, text, implied)  # the store's options, checked
    elif not inputs:
        raise error(
            "no inputs: give at least one input file, folder or glob in inputs, or set demo=True",
            fields=("inputs", "demo"),
        )
    if tokenizer is None and config.store is None:
        raise error(
            "tokenizer is required (a tokenizer.json, an HF model folder, 'qwen3', 'bytes' or a loaded "
            "tokenizer)",
            fields="tokenizer",
        )
    return tokenizer, text


@dataclass(frozen=True, kw_only=True)
class ResolvedPack:
    """What a :class:`PackConfig` runs with (:meth:`PackConfig.resolve`): the values that follow from its
    fields, beside them rather than over them.

    - ``inputs``: the files read (a mix's sources with ``mix``); ``tokenizer``: the one given, or the demo's;
    - ``text``: the text options, with the ``min_tokens`` a format or ``compat`` imposes and a store's own;
    - ``seq_length``: the one given, or the demo's; ``pad_to_max_length``: also on with ``pad_cu_seqlens``;
    - ``memory_budget``: the local backend's budget in bytes (``"8G"`` read), or ``None``;
    - ``settings``: the packed layer's settings; ``pad_seq_to_mult_source``: where its multiple came from.
    """

    inputs: tuple[str, ...]
    tokenizer: Any
    text: TextConfig
    seq_length: int
    pad_to_max_length: bool
    memory_budget: int | None
    settings: PackSettings
    pad_seq_to_mult_source: str


@dataclass(frozen=True, kw_only=True)
class PackConfig:
    """Everything ``longpack pack`` takes; validated on construction (the one place), run with :meth:`run`.

    - ``inputs``: JSONL / Parquet files, folders or globs (or ``demo=True`` for the built-in data);
      ``val_inputs`` the same for a validation split, or ``val_fraction`` to carve one out of ``inputs``.
    - ``tokenizer``: a spec (``"qwen3"``, ``"bytes"``, a ``tokenizer.json``, an HF model folder) or a loaded
      tokenizer (``transformers`` fast tokenizer, ``tokenizers.Tokenizer``, ``longpack.text.Tokenizer``).
    - ``seq_length``: the longest runtime length of one sample; ``pack_size``: ``packed_sequence_size``
      (default ``seq_length``).
    - ``pad_seq_to_mult``, or ``tp`` / ``cp`` / ``sp`` to derive it (default 1).
    - ``algorithm``, ``balance`` (a ``longpack.balance.BalanceTarget`` or its ``dp=..,gbs=..`` spec:
      workload-balanced rows in training order), ``seed`` (default 0; 1234 with ``compat``),
      ``overlength`` (``drop | truncate | fragment | error``; default ``drop``).
    - ``output_format``: ``parquet`` (Megatron-Bridge v0.4.0+ and main) or ``npy`` (Bridge <= 0.3.x and
      NeMo 2: one pickled object array per split); ``row_group_size`` (Parquet rows per row group).
    - ``compat="megatron-bridge"``: Bridge's prepare step exactly: ``first_fit_shuffle``, seed 1234,
      over-long samples dropped at ``pad_seq_to_mult`` 1 and truncated above it, one-token samples kept,
      Bridge's Parquet writer options, one file per split: the files are byte-identical to Bridge's on the
      same tokenized samples.
    - ``pad_to_max_length``, ``pad_cu_seqlens``: written into ``bridge_config.yaml`` (fixed-width rows,
      static ``cu_seqlens`` for CUDA graphs); they do not change the packed files.
    - ``text``: how rows become samples (:class:`~longpack.text.TextConfig`, one object shared with the
      sweep job, recorded as a unit in the manifest).
    - ``rows_per_shard``, ``overwrite``, ``ids_dtype`` (``int64`` | ``int32``).
    - ``backend``: ``"local"``, ``"ray"`` or an executor object (:class:`~longpack.jobs.LocalExecutor`,
      ``longpack.cluster.RayExecutor(address=...)``); ``workers`` caps its parallelism (with a name only).
    - ``progress``: rich progress bars on stderr when it is a terminal.
    """

    command_help = (
        "Tokenize SFT data or documents and write Megatron-Bridge packed Parquet (or .npy, or Megatron "
        ".bin/.idx with --output-format indexed, or preference pairs as NeMo-Aligner's packed DPO .npy with "
        "--output-format dpo), metadata and a manifest."
    )

    out: str | Path = option(
        help="Output folder (must not exist unless --overwrite); a URL (s3://...) is uploaded, manifest last.",
        cli_type=str,
    )
    inputs: Sequence[str | Path] | str | Path = inputs_option()
    tokenizer: Any = tokenizer_option()
    seq_length: int | None = option(None, help="Max runtime length of one sample (Megatron seq_length).")
    pack_size: int | None = option(
        None, help="packed_sequence_size in runtime tokens (default: --seq-length)."
    )
    pad_seq_to_mult: int | None = pad_seq_to_mult_option()
    tp: int | None = tp_option()
    cp: int | None = cp_option()
    sp: bool = sp_option()
    fp8_recipe: str | None = fp8_recipe_option(
        "FP8 recipe of the training run (mxfp8, delayed, ...): --pad-seq-to-mult also covers its tokens per "
        "rank (MXFP8 32, FP8 16; times CP, and TP with SP)."
    )
    hybridep: bool = hybridep_option(
        "HybridEP dispatch in the training run: --pad-seq-to-mult also covers its 128-token combine chunk."
    )
    algorithm: str = algorithm_option()
    balance: Any = option(
        None,
        help="Workload-balanced packing for a training topology: dp=D,gbs=B[,pp=P,vpp=V,mbs=M],"
        "model=M,gpu=G (planner catalog) or linear=..,quadratic=.. ; rows are written in training order.",
        cli_type=str | None,
    )
    seed: int | None = seed_option(
        None,
        f"Seed of every random step (Megatron: dataset.seed). Default 0; {BRIDGE_DEFAULT_SEED} with --compat.",
    )
    overlength: str | None = option(
        None,
        help="Samples longer than --seq-length (default drop; --compat: Bridge's rule; fragment: cut into "
        "pack-sized pieces packed like samples).",
        choices=choices.OVERLENGTH_POLICIES,
    )
    val_fraction: float = option(0.0, help="Fraction of samples for validation.")
    val_inputs: Sequence[str | Path] | str | Path = option(
        (), help="Validation inputs (repeatable).", flag="--val-input", cli_type=list[str] | None
    )
    text: TextConfig = option(default_factory=TextConfig, help="How rows become samples.", nested_except=())
    rows_per_shard: int | None = option(
        None, help="Rows per Parquet shard (default: ~2**27 tokens per shard)."
    )
    overwrite: bool = option(False, help="Replace an existing output folder.")
    ids_dtype: str = option(
        choices.DEFAULT_IDS_DTYPE,
        help="Parquet type of input_ids: int64 (as Megatron-Bridge writes) or int32 (opt-in, smaller and "
        "faster to write; Megatron-Bridge reads any integer type; needs a vocab that fits).",
        choices=choices.IDS_DTYPES,
    )
    output_format: str = option(
        choices.DEFAULT_OUTPUT_FORMAT,
        help="parquet: packed Parquet for Megatron-Bridge v0.4.0+ and main; npy: one .npy per split for "
        "Megatron-Bridge <= 0.3.x (the PyPI release) and NeMo 2; indexed: Megatron .bin/.idx document "
        "datasets for pretraining (--data-path); dpo: preference pairs (prompt, chosen, rejected) in "
        "NeMo-Aligner's packed DPO .npy.",
        choices=choices.OUTPUT_FORMATS,
    )
    row_group_size: int | None = option(
        None,
        # longpack.packed.files.ROW_GROUP_TOKENS and ROW_GROUP_SIZE (a test checks the figures)
        help="Parquet rows per row group (default: about 65,536 tokens per group, at most 500; Bridge's "
        "reader decodes a whole group per random access).",
    )
    compat: str | None = option(
        None,
        help=f"megatron-bridge: Bridge's prepare step exactly ({MEGATRON_ALGORITHM}, seed {BRIDGE_DEFAULT_SEED}, "
        "its over-length and one-token rules, its Parquet writer): byte-identical files on the same tokenized "
        "samples.",
        choices=choices.COMPAT_MODES,
    )
    pad_to_max_length: bool = option(
        False,
        help="Write dataset_kwargs.pad_to_max_length: true into bridge_config.yaml (fixed-width rows).",
    )
    pad_cu_seqlens: bool = option(
        False,
        help="Write pad_cu_seqlens: true (and pad_to_max_length) into bridge_config.yaml (CUDA graphs).",
    )
    backend: Any = option(
        choices.LOCAL_BACKEND,
        help="local: this machine; ray: tokenize and write on a Ray cluster.",
        choices=choices.BACKENDS,
        or_object=True,
    )
    #: The Ray cluster ``backend="ray"`` joins (``"auto"``, ``"ray://host:10001"``; ``None``: start one).
    ray_address: str | None = option(
        None, help="Ray cluster to join ('auto', 'ray://host:10001'); default: start one."
    )
    workers: int | None = workers_option()
    demo: bool = option(
        False,
        help=f"Pack the built-in demo SFT data (defaults: --tokenizer {DEMO_TOKENIZER} --seq-length "
        f"{DEMO_SEQ_LENGTH}).",
    )
    progress: bool = False
    #: Weighted sources instead of ``inputs``: ``["a.jsonl=0.7", "b/=0.3"]``, a YAML file, or a
    #: ``longpack.text.mix.Mix`` (see that module: shares of the mix, up/down-sampled by epochs, seeded).
    mix: Any = option(
        None,
        help="Weighted sources instead of inputs: PATH=WEIGHT (repeatable; more PATH=WEIGHT may follow as "
        "arguments) or one YAML mix file. Weights are shares of the mix, met by up/down-sampling.",
        cli_type=list[str] | None,
    )
    #: Token data the local backend holds in memory (bytes, or ``"8G"``; ``None``: half of this machine's
    #: memory). Past it the job packs in two passes through a scratch folder next to ``out``
    #: (``longpack.jobs.out_of_core``); the output is byte-identical.
    memory_budget: int | str | None = option(
        None,
        help="Token data held in memory (e.g. 8G; default: half of this machine's memory). Past it, tokens "
        "go to a scratch folder next to --out and the rows are filled from there in a second pass: the "
        "same output, flat memory.",
        cli_type=str | None,
    )
    #: A token store (``longpack tokenize``) to pack instead of tokenizing ``inputs``; ``keep_store``: a
    #: folder to keep this run's tokens in as a store (``longpack.jobs.stores``).
    store: str | Path | None = option(
        None,
        help="Pack a token store (longpack tokenize) instead of tokenizing INPUTs (a folder or a URL).",
        cli_type=str | None,
    )
    keep_store: str | Path | None = option(
        None, help="Also keep this run's tokens as a store in this folder (or at a URL).", cli_type=str | None
    )
    #: A jinja chat template file (a model's ``chat_template.jinja``) that renders chat rows instead of the
    #: tokenizer's own (a ``tokenizer.json`` alone has none); hashed into the manifest.
    chat_template: str | Path | None = option(
        None,
        help="A jinja chat template file (a model's chat_template.jinja) for chat rows, instead of the "
        "tokenizer's own.",
        cli_type=Path | None,
    )
    #: Largest share (0..1) of the samples or runtime tokens that may be dropped or truncated; past it the job
    #: raises ``longpack.packed.drops.DropLimitError`` (CLI exit 1) before writing anything. ``None``: no
    #: limit; a loss past 5 % still warns (length percentiles, the larger pack sizes that would keep the samples).
    max_drop_fraction: float | None = option(
        None,
        help="Fail (exit 1, nothing written) when more than this share (0..1) of the samples or tokens would "
        "be dropped or truncated. Past 5 % a pack always warns.",
    )

    def __post_init__(self) -> None:
        from longpack.validate import plain_fields

        plain_fields(self)
        # frozen: a given value is only put in its canonical type here (a list of paths as a tuple, a path
        # as a Path: the same value, so ``dataclasses.replace`` round-trips); what follows from the settings is
        # :meth:`resolve`'s, never written over a field.
        set_ = object.__setattr__
        if self.mix is not None:
            from longpack.text.mix import parse_mix

            set_(self, "mix", parse_mix(self.mix))
            if self.inputs or self.demo:
                raise ConfigError("give either mix or inputs (or demo), not both", fields=("mix", "inputs"))
            if not self._supports(MIX):
                raise ConfigError("mix runs on the local backend only", fields=("mix", "backend"))
        set_(self, "inputs", _paths(self.inputs, "inputs"))
        set_(self, "val_inputs", _paths(self.val_inputs, "val_inputs"))
        if not isinstance(self.out, str | os.PathLike) or not str(self.out):
            raise ConfigError(f"out must be a folder path, got {self.out!r}", fields="out")
        from longpack.remote import as_path

        set_(self, "out", as_path(self.out))
        if self.chat_template is not None:
            if (
                not isinstance(self.chat_template, str | os.PathLike)
                or not Path(self.chat_template).is_file()
            ):
                raise ConfigError(
                    f"chat_template must be a jinja template file, got {self.chat_template!r}",
                    fields="chat_template",
                )
            set_(self, "chat_template", Path(self.chat_template))
        for name in ("sp", "overwrite", "demo", "progress", "pad_to_max_length", "pad_cu_seqlens"):
            flag(getattr(self, name), name)
        for name in ("seq_length", "pack_size", "rows_per_shard", "row_group_size", "workers"):
            set_(self, name, optional_positive_int(getattr(self, name), name))
        if self.seed is not None:  # None: the default (0, or Bridge's with compat)
            set_(self, "seed", seed_value(self.seed))
        set_(
            self,
            "val_fraction",
            finite_float(self.val_fraction, "val_fraction", lo=0.0, hi=1.0, hi_open=True),
        )
        self.resolved  # noqa: B018 - every check runs now, on construction

    @functools.cached_property
    def resolved(self) -> ResolvedPack:
        """:meth:`resolve`'s result, computed once (on construction)."""
        return self.resolve()

    def resolve(self) -> ResolvedPack:
        """What this job runs with, derived from the fields (a new object; no field is written): the
        tokenizer and text options the data source implies, the demo's ``seq_length``, the ``text`` a format
        or ``compat`` imposes, ``pad_to_max_length`` with ``pad_cu_seqlens``, and the packed layer's settings.
        Every check of the settings together runs here."""
        text = self.text
        if self.compat is not None and text.min_tokens != 1:
            # Bridge's prepare step keeps one-token samples (runtime length 0); the text layer must too.
            text = replace(text, min_tokens=1)
        inputs = cast(tuple[str, ...], self.inputs) if self.mix is None else self.mix.inputs
        tokenizer, text = settle_data_source(
            self,
            text,
            verb="packs",
            inputs=inputs,
            store_clash=(
                "store replaces inputs (mix, val_inputs: use val_fraction); give one of them, and keep_store "
                "only with inputs"
                if self.inputs or self.mix is not None or self.keep_store is not None or self.val_inputs
                else None
            ),
        )
        seq_length = DEMO_SEQ_LENGTH if self.demo and self.seq_length is None else self.seq_length
        from longpack.packed.formats import known_format

        named = known_format(self.output_format)  # an unknown name is refused with the other choices, below
        if seq_length is None and named is not None and named.preference_pairs and self.pack_size is not None:
            seq_length = self.pack_size  # a pair is one item of a row: pack_size bounds it, not seq_length
        if seq_length is None:
            raise ConfigError(
                "seq_length is required (the longest runtime length of one sample, e.g. 4096)",
                fields="seq_length",
            )
        self._check_settings()
        # Bridge asserts pad_to_max_length with pad_cu_seqlens
        pad_to_max_length = self.pad_to_max_length or self.pad_cu_seqlens
        self._check_format(pad_to_max_length)
        memory_budget = self._check_executor()
        fmt = self.format
        if fmt.fixed_min_tokens is not None and text.min_tokens != fmt.fixed_min_tokens:
            text = replace(text, min_tokens=fmt.fixed_min_tokens)  # Megatron keeps one-token documents
        mult, source = resolve_pad_seq_to_mult(
            self.pad_seq_to_mult,
            self.tp,
            self.cp,
            self.sp,
            fp8_recipe=self.fp8_recipe,
            hybridep=self.hybridep,
        )
        return ResolvedPack(
            inputs=inputs,
            tokenizer=tokenizer,
            text=text,
            seq_length=seq_length,
            pad_to_max_length=pad_to_max_length,
            memory_budget=memory_budget,
            settings=self._pack_settings(mult, seq_length),
            pad_seq_to_mult_source=source,
        )

    def _check_settings(self) -> None:
        """Settings that exclude each other, the text options' type, every choice, the backend's options."""
        if self.val_inputs and self.val_fraction:
            raise ConfigError(
                "give either val_inputs or val_fraction, not both", fields=("val_inputs", "val_fraction")
            )
        if not isinstance(self.text, TextConfig):
            raise ConfigError(
                f"text must be a longpack.text.TextConfig, got {type(self.text).__name__}", fields="text"
            )
        # overlength, output_format, compat, ids_dtype, algorithm, backend (a name)
        check_choices(self, also={"algorithm": (choices.BALANCED_ALGORITHM,)})
        if not isinstance(self.backend, str):
            if self.workers is not None or self.ray_address is not None:
                raise ConfigError(
                    "workers and ray_address go to the executor object given as backend, not next to it",
                    fields=("workers", "ray_address"),
                )
        elif self.ray_address is not None and self.backend != choices.RAY_BACKEND:
            raise ConfigError("ray_address needs backend ray", fields=("ray_address", "backend"))

    def _check_format(self, pad_to_max_length: bool) -> None:
        """The settings the output format refuses (:class:`~longpack.packed.formats.OutputFormat`), and
        what it needs of the executor."""
        fmt = self.format
        given = {
            **{f.name: getattr(self, f.name) for f in fields(self)},
            "pad_to_max_length": pad_to_max_length,
        }
        defaults = {f.name: f.default for f in fields(self)}
        for refusal in fmt.refused:
            value = given[refusal.setting]
            if value not in (None, (), False, 0.0) and value != defaults[refusal.setting]:
                raise ConfigError(refusal.message, fields=refusal.fields)
        for capability, refusal in fmt.needs.items():
            if not self._supports(capability):
                raise ConfigError(refusal.message, fields=refusal.fields)

    def _check_executor(self) -> int | None:
        """What the settings need of the executor (``PackExecutor.supports``); ``max_drop_fraction`` in
        [0, 1]; the memory budget in bytes (``memory_budget`` read), only with the named local backend."""
        fmt = self.format
        # a format written from a sharded store (indexed) reads and writes stores on every executor that writes it
        from_shards = fmt.sharded_store and self._supports(choices.SHARDED_INDEXED)
        if self.demo and from_shards and not self._supports(choices.ONE_FILE_PER_SPLIT):
            raise ConfigError(
                f"output_format {fmt.name} on backend {self.backend} reads inputs or a store; drop demo (or use "
                "the local backend)",
                fields=("demo", "backend"),
            )
        if (
            (self.store is not None or self.keep_store is not None)
            and not self._supports(TOKEN_STORE)
            and not from_shards
        ):
            raise ConfigError(
                "token stores are read and written by the local backend (and by ray for output_format "
                "indexed); use backend local",
                fields=("store" if self.store is not None else "keep_store", "backend"),
            )
        if self.max_drop_fraction is not None:
            finite_float(self.max_drop_fraction, "max_drop_fraction", lo=0.0, hi=1.0)
        if self.overlength == choices.OVERLENGTH_FRAGMENT and not self._supports(FRAGMENT):
            raise ConfigError(
                "overlength fragment runs on the local backend (the Ray writer routes whole samples)",
                fields=("overlength", "backend"),
            )
        if self.memory_budget is None:
            return None
        from longpack.jobs.out_of_core import parse_memory_budget

        budget = parse_memory_budget(self.memory_budget)
        if self.backend != choices.LOCAL_BACKEND:
            raise ConfigError(
                "memory_budget applies to the local backend (give the executor object its own settings)",
                fields=("memory_budget", "backend"),
            )
        return budget

    def text_implied(self) -> dict[str, tuple[str, str]]:
        """Text options this job sets itself, by the setting that sets them: ``{field: (why, setting)}``, so
        that a store tokenized otherwise is refused naming that setting, not the text option."""
        from longpack.errors import LongpackError

        try:
            fixed = self.format.fixed_min_tokens
        except LongpackError:  # an unknown output_format: refused with its own message later
            fixed = None
        if fixed is not None:
            return {
                "min_tokens": (
                    f"output_format {self.output_format} keeps one-token documents, as Megatron does",
                    "output_format",
                )
            }
        if self.compat is not None:
            return {
                "min_tokens": (
                    f"compat {self.compat} keeps one-token samples, as Bridge's prepare step does",
                    "compat",
                )
            }
        return {}

    @property
    def format(self) -> OutputFormat:
        """The record of ``output_format`` (what the format is and can do)."""
        from longpack.packed.formats import output_format

        return output_format(self.output_format)

    def _supports(self, capability: str) -> bool:
        """Whether the executor ``backend`` names, or is, has ``capability`` (``PackExecutor.supports``); an
        executor object without ``supports`` has none."""
        backend: Any = self.backend
        if isinstance(backend, str):
            from longpack.jobs.executors import executor_class

            backend = executor_class(backend)
        supports = getattr(backend, "supports", None)
        return bool(supports(capability)) if callable(supports) else False

    def _pack_settings(self, mult: int, seq_length: int) -> PackSettings:
        """The packed layer's settings; the algorithm and the balance spec are settled here, once."""
        from longpack.choices import BALANCED_ALGORITHM as BALANCED
        from longpack.packed.settings import PackSettings

        algorithm = self.algorithm
        seed = self.seed
        overlength = self.overlength
        if self.compat is not None:
            if algorithm not in (DEFAULT_ALGORITHM, MEGATRON_ALGORITHM) or self.balance is not None:
                raise ConfigError(
                    f"compat {self.compat} packs with {MEGATRON_ALGORITHM}, as Bridge's prepare step does; drop "
                    "algorithm and balance",
                    fields=("compat", "algorithm", "balance"),
                )
            algorithm = MEGATRON_ALGORITHM
            seed = BRIDGE_DEFAULT_SEED if seed is None else seed
            # Bridge: the histogram step skips over-long samples at pad_seq_to_mult 1; above it the pre-pad
            # step truncates them first.
            bridge_overlength = choices.OVERLENGTH_DROP if mult == 1 else choices.OVERLENGTH_TRUNCATE
            if overlength not in (None, bridge_overlength):
                raise ConfigError(
                    f"compat {self.compat} with pad_seq_to_mult {mult} {bridge_overlength}s over-long samples, "
                    f"as Bridge does; drop overlength {overlength!r}",
                    fields=("compat", "overlength"),
                )
            overlength = bridge_overlength
        if self.balance is not None:
            if algorithm not in (DEFAULT_ALGORITHM, BALANCED):
                raise ConfigError(
                    f"balance chooses the balanced packer; drop algorithm {algorithm!r}",
                    fields=("balance", "algorithm"),
                )
            algorithm = BALANCED
        elif algorithm == BALANCED:
            raise ConfigError(
                "algorithm 'balanced' needs balance (dp=..,gbs=..,model=..,gpu=..)",
                fields=("algorithm", "balance"),
            )
        if seed is None:
            seed = self.format.seed_default
        # a bad spec fails now, before any tokenization; the planner's cost model is for rows of seq_length
        balance = balance_target(self.balance, seq_length=seq_length)
        resolved = {
            "seq_length": seq_length,
            "pad_seq_to_mult": mult,
            "algorithm": algorithm,
            "seed": 0 if seed is None else seed,
            "overlength": overlength or DEFAULT_OVERLENGTH,
            "balance": balance,
        }
        # Every other packed setting is this config's field of the same name, passed on as given: the
        # list of settings is PackSettings' own, so a new one is declared there and as an option here.
        given = {f.name: getattr(self, f.name) for f in fields(PackSettings) if f.name not in resolved}
        return PackSettings(**given, **resolved)

    @property
    def settings(self) -> PackSettings:
        """The ``longpack.packed.PackSettings`` this job writes with."""
        return self.resolved.settings

    @property
    def handoff_options(self) -> dict[str, Any]:
        """What only ``bridge_config.yaml`` needs: the topology given and the fixed-width options
        (``longpack.packed.bridge_config.HANDOFF_OPTIONS``, each a field of this config)."""
        from longpack.packed.bridge_config import HANDOFF_OPTIONS

        resolved = {"pad_to_max_length": self.resolved.pad_to_max_length}
        return {name: resolved.get(name, getattr(self, name)) for name in HANDOFF_OPTIONS}

    @property
    def pad_seq_to_mult_source(self) -> str:
        """Where ``pad_seq_to_mult`` came from (given, derived from TP/CP/SP, or the default)."""
        return self.resolved.pad_seq_to_mult_source

    def executor(self) -> PackExecutor:
        """The executor ``backend`` names (a new one per call), or the executor object given."""
        if not isinstance(self.backend, str):
            return self.backend
        if self.backend == choices.RAY_BACKEND:
            from longpack.cluster.ray_pack import RayExecutor

            return RayExecutor(address=self.ray_address, workers=self.workers)
        from longpack.jobs.executors import LocalExecutor

        return LocalExecutor(workers=self.workers, memory_budget=self.resolved.memory_budget)

    def run(self) -> PackResult:
        """Tokenize, plan and write; return the manifest (and a summary) of the finished folder.

        The output folder is checked before the (long) tokenization; the manifest is written last, so an
        interrupted run leaves a folder that reads as unfinished. What the CLI prints as a warning (a token
        loss past a threshold, ...) is issued as a :class:`~longpack.errors.LongpackWarning` and listed by
        :meth:`PackResult.notes`.
        """
        from longpack.errors import warn_all
        from longpack.remote import has_urls

        paths = (self.inputs, self.val_inputs, self.store, str(self.out), self.keep_store)
        result = self._run_staged() if has_urls(*paths) else self._run()
        warn_all(result.manifest.extra.get("warnings", ()))
        return result

    def _run_staged(self) -> PackResult:
        """:meth:`_run` on a local stage (:mod:`longpack.remote`): remote inputs and ``store`` downloaded
        first, ``out`` and ``keep_store`` at URLs uploaded after, manifests last."""
        import json

        from longpack.packed.manifest import PackManifest
        from longpack.remote import is_url, stage_inputs, staged

        out = str(self.out)
        inputs = cast(tuple[str, ...], self.inputs)
        val_inputs = cast(tuple[str, ...], self.val_inputs)
        key = out if is_url(out) else json.dumps([*inputs, *val_inputs, str(self.store), out])
        with staged(key) as stage:
            changes: dict[str, Any] = {
                "inputs": stage_inputs(stage, inputs),
                "val_inputs": stage_inputs(stage, val_inputs),
            }
            if is_url(self.store):
                changes["store"] = stage.input(str(self.store))
            if is_url(out):
                changes["out"] = stage.output(out, name="out", overwrite=self.overwrite)
            if is_url(self.keep_store):
                changes["keep_store"] = stage.output(
                    str(self.keep_store), name="keep_store", overwrite=self.overwrite, field="keep_store"
                )
            result = replace(self, **changes)._run()
            stage.publish()
            manifest = PackManifest.from_dict(
                json.loads(stage.to_urls(json.dumps(result.manifest.to_dict())))
            )
        return replace(result, out=cast(Path, self.out) if is_url(out) else result.out, manifest=manifest)

    def _run(self) -> PackResult:
        from longpack.outputs import OutputLock, output_write_errors
        from longpack.packed.manifest import PackManifest
        from longpack.packed.pipeline import (
            Provenance,
            check_ids_dtype,
            check_out_dir,
            finish_packed_output,
            plan_splits,
            prepare_out_dir,
        )
        from longpack.text.tokenizers import as_tokenizer

        out = Path(self.out)
        resolved = self.resolved
        settings = resolved.settings
        given = resolved.inputs + cast(tuple[str, ...], self.val_inputs)
        check_out_dir(out, self.overwrite, inputs=given)
        with contextlib.ExitStack() as stack:
            # Held to the end: a second writer of `out` fails now, not after tokenizing, and overwrite's
            # removal of the old files happens under it. The folder is checked again under the lock.
            stack.enter_context(OutputLock(out))
            check_out_dir(out, self.overwrite)
            tokenizer = as_tokenizer(resolved.tokenizer) if resolved.tokenizer is not None else None
            if self.chat_template is not None:
                if tokenizer is None:
                    raise ConfigError(
                        "chat_template renders rows while tokenizing, and a store holds tokens already; drop "
                        "chat_template, or pack the inputs with it instead of the store",
                        fields=("chat_template", "store"),
                    )
                tokenizer = tokenizer.with_chat_template(self.chat_template)
            if self.format.preference_pairs:  # their own tokenization and file
                from longpack.jobs.preference import pack_preference_folder

                written = pack_preference_folder(
                    inputs=resolved.inputs,
                    out=out,
                    tokenizer=tokenizer,
                    pack_size=int(settings.resolved_pack_size),
                    algorithm=self.algorithm,
                    seed=int(self.seed or 0),
                    overwrite=self.overwrite,
                )
                return PackResult(out=out, manifest=written)
            if self.format.sharded_store and (
                not self._supports(choices.ONE_FILE_PER_SPLIT) or self.memory_budget is not None
            ):  # through a sharded store: one shard per worker, one prefix at a time
                from longpack.jobs.sharded_tokenize import pack_indexed_sharded

                return pack_indexed_sharded(self, out, tokenizer, stack)
            executor = self.executor()
            stack.enter_context(executor)
            from longpack.jobs.executors import LocalExecutor

            if isinstance(self.backend, str) and isinstance(executor, LocalExecutor) and self.format.spills:
                from longpack.jobs.out_of_core import spill_folder

                executor.spill_dir = stack.enter_context(spill_folder(out))  # used past the memory budget
            inputs = list(resolved.inputs)
            demo_prefix = ""
            if self.demo:
                demo = _demo_folder(stack)
                inputs = [str(demo)]
                demo_prefix = str(demo.parent)
            from longpack.jobs.stores import tokenized_or_stored

            train, train_handle, store_info = tokenized_or_stored(self, executor, inputs, tokenizer)
            val, val_handle = (None, None)
            if self.val_inputs:
                assert tokenizer is not None  # val_inputs are refused with a store (__post_init__)
                val, val_handle = executor.tokenize(
                    list(cast(tuple[str, ...], self.val_inputs)),
                    tokenizer=tokenizer,
                    config=resolved.text,
                    progress=self.progress,
                )
            if demo_prefix:
                # Temp paths would make every demo output differ; name the built-in data instead.
                files = tuple(f.replace(demo_prefix, DEMO_LABEL) for f in train.samples.files)
                train = replace(train, samples=replace(train.samples, files=files))
            mix_report = None
            if self.mix is not None:
                train, mix_report = self._mixed(train, getattr(executor, "spill_dir", None))
            eos_id = train.tokenizer.get("eos_id")
            if eos_id is None:
                raise InputError(
                    f"tokenizer {train.tokenizer.get('name')!r} has no EOS id; packing pads with EOS",
                    fields="tokenizer",
                )
            check_ids_dtype(settings.ids_dtype, train.tokenizer.get("vocab_size"))
            if not self.format.executor_writes:
                eod = int(eos_id) if train.eod_id is None else int(train.eod_id)
                return self._write_indexed(
                    out, train, eod, demo_prefix, executor, mixed=mix_report is not None
                )
            splits = plan_splits(
                train.samples, settings, eos_id=int(eos_id), validation=val.samples if val else None
            )
            provenance = self._provenance(train, val, demo_prefix, Provenance)
            if store_info is not None:
                provenance.extra["store"] = store_info
            from longpack.packed.drops import DropLimitError, check_drop_limit, drop_report

            drops = drop_report(splits)  # never quiet: a warning past 5 %, an error past max_drop_fraction
            try:
                check_drop_limit(drops, self.max_drop_fraction)
            except DropLimitError as exc:
                if self.keep_store is None:
                    raise
                raise DropLimitError(  # the store was written before: say so, and how to use it
                    f"{exc}; the token store keep_store {self.keep_store} was written: pack it again without "
                    "tokenizing (store, another seq_length or overlength)",
                    fields=(*exc.fields, "keep_store", "store"),
                ) from None
            if drops.warning() is not None:
                provenance.extra["warnings"].insert(0, drops.warning())
            provenance.extra["drops"] = drops.to_dict()
            _count_supervised_outside(splits, provenance.extra)
            if mix_report is not None:
                provenance.extra["mix"] = _mix_outcome(mix_report, splits)
            else:
                _file_outcomes(provenance.inputs, train, val, splits)
            # The validation split indexes the validation set, or (val_fraction) the training set.
            sources = {"training": train_handle, "validation": val_handle if val else train_handle}
            with output_write_errors(out):  # a full disk: a clear error, no manifest
                prepare_out_dir(out, self.overwrite)
                files_written = executor.write(out, splits, settings, sources=sources, progress=self.progress)
                manifest = finish_packed_output(
                    out, splits, settings, provenance, files_written, handoff=self.handoff_options
                )
            report = executor.report()
        return PackResult(
            out=out.resolve(),
            manifest=PackManifest.from_dict(manifest),
            pad_seq_to_mult_source=self.pad_seq_to_mult_source,
            backend=None if report is None else {"name": executor.name, **report},
        )

    def _write_indexed(
        self,
        out: Path,
        train: Any,
        eos_id: int,
        demo_prefix: str,
        executor: Any,
        *,
        mixed: bool = False,
        write: Any = None,
    ) -> PackResult:
        """Every document into Megatron indexed datasets (``longpack.packed.indexed``); manifest last.
        ``write(out, provenance)``: another writer of the prefixes and manifest (Ray tasks from a store)."""
        import numpy as np

        from longpack.outputs import output_write_errors
        from longpack.packed.indexed import check_trains_everywhere, write_indexed_output
        from longpack.packed.manifest import PackManifest
        from longpack.packed.pipeline import Provenance, prepare_out_dir

        if train.samples is not None:  # a sharded store's shards are checked by its writer (below)
            check_trains_everywhere(train.samples, train.format)  # before anything is written or replaced
        provenance = self._provenance(train, None, demo_prefix, Provenance)
        empty_per_file: dict[str, int] = {}
        for source in train.empty:
            name = source.rsplit(":", 1)[0]
            empty_per_file[name] = empty_per_file.get(name, 0) + 1
        for info in provenance.inputs:  # every document of every file is written whole
            empty = empty_per_file.get(info["path"], 0)
            info.update(packed=info["rows"] - info.get("malformed", 0) - empty, truncated=0, dropped=0)
        with output_write_errors(out):
            prepare_out_dir(out, self.overwrite)
            if write is not None:
                manifest = write(out, provenance)
            else:
                manifest = write_indexed_output(
                    out,
                    train.samples,
                    self.settings,
                    provenance,
                    vocab_size=int(train.tokenizer["vocab_size"]),
                    eos_id=eos_id,
                    # where preprocess_data.py's index holds the empty documents (not after a mix: resampled)
                    empty_before=None if mixed else np.asarray(train.empty_before, dtype=np.int64),
                )
        report = None if executor is None else executor.report()
        return PackResult(
            out=out.resolve(),
            manifest=PackManifest.from_dict(manifest),
            backend=None if report is None else {"name": executor.name, **report},
        )

    def _provenance(self, train: Any, val: Any, demo_prefix: str, provenance_cls: Any) -> Any:
        malformed = train.malformed + (val.malformed if val else ())
        inputs_info = train.inputs + (val.inputs if val else ())
        if demo_prefix:

            def relabel(text: str) -> str:
                return text.replace(demo_prefix, DEMO_LABEL)

            inputs_info = tuple({**d, "path": relabel(d["path"])} for d in inputs_info)
            malformed = tuple((relabel(src), reason) for src, reason in malformed)
        skipped = tuple(getattr(train, "skipped_inputs", ())) + tuple(
            getattr(val, "skipped_inputs", ()) if val else ()
        )
        warnings = tuple(getattr(train, "warnings", ())) + tuple(getattr(val, "warnings", ()) if val else ())
        extra: dict[str, Any] = {
            "skipped_inputs": [{"path": p, "reason": r} for p, r in skipped],
            "warnings": list(warnings),
        }
        empty = tuple(getattr(train, "empty", ())) + tuple(getattr(val, "empty", ()) if val else ())
        if empty:  # text rows that tokenize to no token: no document, as in Megatron-LM's preprocess_data.py
            from longpack.packed.pipeline import MAX_LISTED

            relabelled = [e.replace(demo_prefix, DEMO_LABEL) if demo_prefix else e for e in empty]
            extra["empty_documents"] = {"count": len(empty), "listed": relabelled[:MAX_LISTED]}
        return provenance_cls(
            extra=extra,
            inputs=inputs_info,
            tokenizer=train.tokenizer,
            text_settings={
                **{f.name: getattr(self.resolved.text, f.name) for f in fields(self.resolved.text)},
                "detected_format": train.format,
                "validation_detected_format": val.format if val else None,
                "demo": self.demo,
            },
            rows_read=train.rows_read + (val.rows_read if val else 0),
            malformed=malformed,
        )

    def _mixed(self, train: Any, spill_dir: Path | None = None) -> tuple[Any, dict[str, Any]]:
        """The tokenized samples resampled by the mix, and the mix report (sources, counts, indices)."""
        import numpy as np

        from longpack.text.inputs import find_inputs
        from longpack.text.mix import mix_samples

        source_of_file: dict[str, int] = {}
        for k, source in enumerate(self.mix.sources):
            for f in find_inputs(list(source.inputs)).files:
                other = source_of_file.setdefault(f.label, k)
                if other != k:
                    raise ConfigError(
                        f"{f.label} is in two mix sources ({self.mix.sources[other].name!r} and "
                        f"{source.name!r}); give each file to one source",
                        fields="mix",
                    )
        files = train.samples.files
        file_source = np.array([source_of_file[f] for f in files], dtype=np.int64)
        source_of_sample = file_source[train.samples.source_file]
        indices, reports, total, seed = mix_samples(source_of_sample, self.mix, seed=self.settings.seed)
        for info in train.inputs:
            k = source_of_file[info["path"]]
            reports[k].setdefault("files", []).append(info["path"])
            reports[k]["rows_read"] = reports[k].get("rows_read", 0) + info["rows"]
            reports[k]["malformed"] = reports[k].get("malformed", 0) + info.get("malformed", 0)
        from longpack.jobs.out_of_core import take

        mixed = replace(train, samples=take(train.samples, indices, spill_dir))  # spilled stays spilled
        report = {
            "seed": seed,
            "samples": total,
            "sources": reports,
            "source_of_mixed": source_of_sample[indices],
        }
        return mixed, report


def _count_supervised_outside(splits: Any, extra: dict[str, Any]) -> None:
    """Manifest key ``supervised_outside_cu_seqlens`` (with ``pad_seq_to_mult > 1``) and a warning when any
    supervised token lies outside ``cu_seqlens`` (``longpack.packed.align.supervised_outside_cu_seqlens``)."""
    from longpack.packed.align import supervised_outside_cu_seqlens

    if not splits or splits[0].aligned.pad_seq_to_mult <= 1:
        return
    counts = {split.name: supervised_outside_cu_seqlens(split.aligned) for split in splits}
    extra["supervised_outside_cu_seqlens"] = counts
    for name, c in counts.items():
        if c["tokens"]:
            extra.setdefault("warnings", []).append(
                f"{name}: {c['tokens']} supervised token(s) in {c['samples']} sample(s) lie outside cu_seqlens "
                f"(first: {c['listed'][0]}): the sample's inputs end in EOS tokens and an EOS label inside that "
                "run has loss_mask 1; Megatron-Bridge's collate marks those positions as padding, so they carry "
                "loss where attention never reaches. Fix: drop the trailing EOS from the inputs, or pack with "
                "--pad-seq-to-mult 1 (the layout is Bridge's and is kept)"
            )


def _demo_folder(stack: contextlib.ExitStack) -> Path:
    """The demo data set's folder: the cached copy (made on first use), or, where the cache cannot be
    written, a copy in a temporary folder that ``stack`` removes. Named ``longpack-demo`` either way; the
    manifest names it ``<longpack-demo>/longpack-demo``, wherever it lies."""
    from longpack.text import demo_folder, write_demo_dataset

    try:
        return demo_folder()
    except OSError:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="longpack-demo-"))
        return write_demo_dataset(Path(tmp) / "longpack-demo")


def _file_outcomes(inputs: Sequence[dict[str, Any]], train: Any, val: Any, splits: Any) -> None:
    """Add ``packed``, ``truncated`` and ``dropped`` to every input entry, so that per file
    ``rows = malformed + packed + dropped`` (``packed`` includes the truncated samples)."""
    import numpy as np

    # Each split reports its own fragmented samples: a validation split carved out of the training inputs
    # (val_fraction) holds some of the training inputs' fragmented samples.
    carved = [s.aligned.fragmented for s in splits[1:]] if val is None else []
    sets = [(train, splits[0].aligned, np.concatenate([splits[0].aligned.fragmented, *carved]))]
    if val is not None:
        sets.append((val, splits[1].aligned, splits[1].aligned.fragmented))
    offset = 0
    for result, aligned, fragmented_samples in sets:
        n = len(result.inputs)
        of_file = result.samples.source_file
        samples = np.bincount(of_file, minlength=n)
        truncated = np.bincount(of_file[aligned.truncated], minlength=n)
        dropped = np.bincount(of_file[aligned.dropped], minlength=n)
        fragmented = np.bincount(of_file[fragmented_samples.astype(np.int64)], minlength=n)
        for k in range(n):
            inputs[offset + k].update(
                packed=int(samples[k] - dropped[k]), truncated=int(truncated[k]), dropped=int(dropped[k])
            )
            if len(fragmented_samples):
                inputs[offset + k]["fragmented"] = int(fragmented[k])
        offset += n


def _mix_outcome(report: dict[str, Any], splits: Any) -> dict[str, Any]:
    """The manifest's ``mix`` entry: per source its rows read, malformed, samples, drawn (with repeats),
    unused, repeated, packed, truncated and dropped; ``rows_read = malformed + samples``,
    ``drawn = samples - unused + repeated`` and ``drawn = packed + dropped`` hold for each source."""
    import numpy as np

    source_of = report["source_of_mixed"]
    aligned = splits[0].aligned  # truncations and drops are reported with the training split
    n = len(report["sources"])
    truncated = np.bincount(source_of[aligned.truncated], minlength=n)
    dropped = np.bincount(source_of[aligned.dropped], minlength=n)
    sources = []
    for k, src in enumerate(report["sources"]):
        sources.append(
            {
                **src,
                "packed": int(src["drawn"] - dropped[k]),
                "truncated": int(truncated[k]),
                "dropped": int(dropped[k]),
            }
        )
    return {"seed": report["seed"], "samples": report["samples"], "sources": sources}


def balance_target(balance: Any, *, seq_length: int | None = None) -> Any:
    """The one place a ``balance`` value becomes a ``longpack.balance.BalanceTarget``: a target is kept, a
    ``dp=..,gbs=..`` spec string is read by the planner (``parse_balance_spec``: it builds the cost model
    from the catalog; with ``seq_length`` and no ``seq_length=`` in the spec, the pack length is added to
    it, so the cost model is for the rows being packed and the manifest's spec says so), ``None`` stays
    ``None``.

    >>> balance_target("dp=2,gbs=4,linear=1.0,quadratic=0.001").dp
    2
    >>> balance_target("dp=2,gbs=4,model=llama3_1_8b,gpu=h100", seq_length=4096).spec
    'dp=2,gbs=4,model=llama3_1_8b,gpu=h100,seq_length=4096'
    """
    if balance is None:
        return None
    from longpack.balance import BalanceTarget

    if isinstance(balance, BalanceTarget):
        return balance
    if not isinstance(balance, str):
        raise ConfigError(
            f"balance must be a longpack.balance.BalanceTarget or its 'dp=..,gbs=..' spec, got "
            f"{type(balance).__name__}",
            fields="balance",
        )
    from longpack.planner.balance_costs import parse_balance_spec

    if seq_length is not None and "model=" in balance and "seq_length=" not in balance:
        # the planner's cost model depends on the row width: the spec recorded in the manifest says which
        balance = f"{balance},seq_length={seq_length}"
    try:
        return parse_balance_spec(balance)
    except ValueError as exc:
        raise ConfigError(str(exc), fields="balance") from exc


@dataclass(frozen=True, kw_only=True)
class PackResult:
    """A finished pack: its folder, its manifest (:class:`longpack.packed.manifest.PackManifest`, what
    ``manifest.json`` holds) and what the CLI prints about it (:meth:`to_dict`).

    ``counts``, ``splits``, ``settings`` and ``tokenizer`` are the manifest's; ``megatron_bridge`` holds
    the ``dataset.offline_packing_specs`` for Megatron-Bridge with absolute paths.
    """

    out: Path
    manifest: PackManifest
    pad_seq_to_mult_source: str = ""
    #: The executor's report (``{"name": "ray", "driver_peak_rss_bytes": ..., ...}``), or ``None`` (local).
    backend: dict[str, Any] | None = None

    @property
    def counts(self) -> dict[str, Any]:
        """``rows_read``, ``malformed``, ``samples_read``, ``packed``, ``truncated``, ``dropped``, ``rows``."""
        counts: dict[str, Any] = self.manifest.counts
        return counts

    @property
    def splits(self) -> dict[str, SplitRecord]:
        """Split name -> ``SplitRecord`` (files, rows, metadata, truncated / dropped samples)."""
        return self.manifest.splits

    @property
    def settings(self) -> ManifestSettings:
        """The settings that shaped the files, as the manifest records them."""
        return self.manifest.settings

    @property
    def format(self) -> OutputFormat:
        """The record of the output format the manifest records (what the format is and can do)."""
        from longpack.packed.formats import output_format

        return output_format(self.manifest.output_format)

    @property
    def tokenizer(self) -> dict[str, Any]:
        tokenizer: dict[str, Any] = self.manifest.tokenizer
        return tokenizer

    @property
    def megatron_bridge(self) -> dict[str, Any]:
        """``dataset.offline_packing_specs`` for Megatron-Bridge, paths made absolute."""
        mb = dict(self.manifest.megatron_bridge)
        for key in ("packed_train_data_path", "packed_val_data_path", "packed_metadata_path"):
            if key in mb:
                mb[key] = str(self.out / mb[key])
        return mb

    @property
    def bridge_config(self) -> Any:
        """The :class:`longpack.packed.bridge_config.BridgeHandoff` of this output (what
        ``bridge_config.yaml`` holds; ``.overrides()`` and ``.python()`` give the other two forms)."""
        from longpack.packed.bridge_config import handoff_from_manifest

        options = dict(self.manifest.bridge_config.get("options", {}))
        return handoff_from_manifest(self.out, self.manifest, **options)

    @property
    def bridge_config_path(self) -> Path:
        from longpack.packed.bridge_config import BRIDGE_CONFIG_NAME

        return self.out / self.manifest.bridge_config.get("name", BRIDGE_CONFIG_NAME)

    def notes(self) -> list[str]:
        """What a user should know: the pack's warnings (``warning: ...``, as the CLI prints them), then how
        the data was read (not a problem): for prompt/completion data with no separator, that the two texts
        are joined with nothing between them.

        >>> from longpack.packed.manifest import PackManifest
        >>> m = PackManifest.from_dict({"settings": {"text": {"separator": "",
        ...                             "detected_format": "prompt_completion"}}, "splits": {}})
        >>> PackResult(out=Path("o"), manifest=m).notes()[0][:60]
        'prompt and completion are joined with nothing between them ('
        """
        warned = [f"warning: {w}" for w in self.manifest.extra.get("warnings", ())]
        return warned + self.read_notes()

    def read_notes(self) -> list[str]:
        """The notes of :meth:`notes` about how the data was read (the pack's warnings left out)."""
        record = self.manifest.to_dict()
        text = self.manifest.settings.text or {}
        formats = {i.get("format") for i in record.get("inputs", []) if isinstance(i, dict)}
        for key in ("detected_format", "validation_detected_format"):
            formats |= set(str(text.get(key) or "").split(","))  # "chat,prompt_completion": several inputs
        if choices.PROMPT_COMPLETION_FORMAT in formats and text.get("separator", "") == "":
            return [
                "prompt and completion are joined with nothing between them (an empty separator, as "
                "Megatron-Bridge does: 'What is 2+2?' + '4' is trained as 'What is 2+2?4'); to put text "
                "between them pass separator (e.g. ' ' or '\\n') or shape the prompt with prompt_template; "
                "`longpack preview` shows a sample as packed"
            ]
        return []

    def to_dict(self) -> dict[str, Any]:
        """What ``longpack pack --json`` prints."""
        from longpack.packed.formats import load, output_format

        settings = self.settings
        summary = output_format(settings.output_format).summary
        if summary is not None:
            return dict(load(summary)(self.out, self.manifest.to_dict()))
        doc: dict[str, Any] = {
            "out": str(self.out),
            "finished": True,
            "format": (settings.text or {}).get("detected_format"),
            "tokenizer": self.tokenizer,
            "pad_seq_to_mult": settings.pad_seq_to_mult,
            "pad_seq_to_mult_source": self.pad_seq_to_mult_source,
            "algorithm": settings.algorithm,
            "seed": settings.seed,
            "counts": self.counts,
            "malformed_listed": len(self.manifest.malformed),
            "splits": {
                name: {
                    "metadata": s.metadata,
                    "rows": s.rows,
                    "samples_packed": s.samples_packed,
                    "fill_mean": s.fill_mean,
                    "files": list(s.file_names),
                    "truncated": s.truncated_count,
                    "dropped": s.dropped_count,
                    "fragmented": s.extra.get("fragmented_count", 0),
                    # how many of those the manifest lists one by one (it stops at a cap)
                    "truncated_listed": len(s.truncated),
                    "dropped_listed": len(s.dropped),
                }
                for name, s in self.splits.items()
            },
            "megatron_bridge": self.megatron_bridge,
            "warnings": list(self.manifest.extra.get("warnings", [])),
            "notes": self.read_notes(),  # the warnings are under "warnings"
            "skipped_inputs": len(self.manifest.extra.get("skipped_inputs", [])),
            "output_format": self.manifest.output_format,
            "compat": settings.compat,
            "alignment": self.manifest.alignment,
            "bridge_config": {
                "path": str(self.bridge_config_path),
                "api": self.bridge_config.api,
                "overrides": self.bridge_config.overrides(),
                "python": self.bridge_config.python(),
                "check": self.bridge_config.check_command(),
            },
        }
        if "mix" in self.manifest.extra:
            doc["mix"] = self.manifest.extra["mix"]
        if self.backend is not None:
            doc["backend"] = self.backend
        return doc


# A setting of a nested config given at the top (PackConfig(skip_malformed=True)) names where it belongs.
refuse_unknown_settings(PackConfig)
