"""The verify job: prove that a model sees what was packed (``longpack verify``).

:class:`VerifyConfig` names a packed folder and a model (a Hugging Face ``config.json`` or its folder, a
cached hub id, or a catalog model: dense, MoE or the hybrid Qwen3-Next); :meth:`~VerifyConfig.run` builds a
tiny float64 model of that family, checks rows of every split (as many as ``time_budget`` allows: the first and last row of every
file, the longest rows, then the rest in a seeded order), runs the CP and PP checks in real gloo processes
where the layout allows them, and returns a :class:`VerifyResult` whose ``certificate`` is the JSON record
(versions, model, layout, rows checked, worst figures, failures). What each check proves:
:data:`longpack.runtime.verify.CHECKS`.

``backend="megatron"`` runs the same checks with Megatron-Core's ``GPTModel`` and TransformerEngine attention;
it needs CUDA, megatron-core and transformer-engine, and says which are missing (a
:class:`~longpack.errors.MissingDependencyError`, exit 2).

>>> VerifyConfig(packed="p", model="qwen3_8b", fault="nope")
Traceback (most recent call last):
...
longpack.errors.ConfigError: fault must be one of conv-state-leak, cp-positions-shifted, dpo-attention-across-pairs, dpo-pairs-misaligned, drop-cu-seqlens, linear-cp-local, linear-state-leak, loss-on-padding, mtp-global-roll, positions-not-restarted, route-padding, token-across-boundary, got 'nope'
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from longpack import choices
from longpack.choices import VERIFY_BACKENDS
from longpack.errors import ConfigError, LongpackError, MissingDependencyError
from longpack.jobs.options import seed_option
from longpack.option import check_choices, option
from longpack.outputs import atomic_write_bytes
from longpack.packed.preference import DPO_BETA
from longpack.validate import finite_float, flag, non_negative_int, positive_int
from longpack.validate import seed as seed_value

if TYPE_CHECKING:
    from longpack.runtime.verify import RowReport
    from longpack.runtime.verify_dist import DistReport

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "VerifyConfig",
    "VerifyResult",
    "megatron_backend_missing",
    "structural_failures",
]

EXIT_OK, EXIT_FAILED = 0, 1
#: ``hf``: transformers on the CPU (float64). ``megatron``: Megatron-Core GPTModel + TransformerEngine (CUDA).
#: The fault names (one definition: ``longpack.runtime.verify.FAULTS``; listed here without importing torch).
FAULT_NAMES = (
    "conv-state-leak",
    "cp-positions-shifted",
    "dpo-attention-across-pairs",
    "dpo-pairs-misaligned",
    "drop-cu-seqlens",
    "linear-cp-local",
    "linear-state-leak",
    "loss-on-padding",
    "mtp-global-roll",
    "positions-not-restarted",
    "route-padding",
    "token-across-boundary",
)


#: Catalog families (``longpack.catalog``) verify can build from the catalog alone, by model type.
_CATALOG_MODEL_TYPES = {
    "qwen3_8b": "qwen3",
    "llama3_1_8b": "llama",
    "llama3_1_70b": "llama",
    "qwen3_30b_a3b": "qwen3_moe",
    "qwen3_235b_a22b": "qwen3_moe",
    "qwen3_next_80b_a3b": "qwen3_next",
}


def load_hf_config(name_or_path: str) -> dict[str, Any]:
    """A Hugging Face config as a dict: a ``config.json`` file or a folder holding one, a hub id found in the
    local Hugging Face cache (never downloaded), a catalog model (``qwen3_8b``, ``qwen3_30b_a3b``,
    ``qwen3_next_80b_a3b``, ...), or a VLM whose config ships with longpack (``qwen2_5_vl_7b``:
    :mod:`longpack.vlm.model_configs`).

    >>> load_hf_config("qwen3_8b")["model_type"], load_hf_config("qwen3_8b")["vocab_size"]
    ('qwen3', 151936)
    """
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path}: not a readable JSON config ({exc})", fields="model") from exc
        if not isinstance(data, dict) or "model_type" not in data:
            raise ConfigError(
                f"{path}: no 'model_type' key; is it a Hugging Face config.json?", fields="model"
            )
        from longpack.runtime.model_config import check_model_config

        check_model_config(data, str(path))
        return data
    catalog = _from_catalog(name_or_path)
    if catalog is not None:
        return catalog
    from longpack.vlm.model_configs import vlm_model_config

    shipped = vlm_model_config(name_or_path)  # a released VLM's config that ships with longpack
    if shipped is not None:
        return shipped
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(name_or_path, local_files_only=True)
        data = dict(config.to_dict())
    except Exception as exc:  # not cached, or not a hub id: say what is accepted
        from longpack.vlm.model_configs import VLM_MODEL_CONFIGS

        raise ConfigError(
            f"--model {name_or_path!r}: not a config.json file or folder, not a model of the catalog that "
            f"verify can build ({', '.join(sorted(_CATALOG_MODEL_TYPES))}; with --vlm "
            f"{', '.join(VLM_MODEL_CONFIGS)}), and not found in the local Hugging "
            "Face cache (nothing is downloaded); pass the folder holding the model's config.json",
            fields="model",
        ) from exc
    from longpack.runtime.model_config import check_model_config

    check_model_config(data, name_or_path)
    return data


def _from_catalog(name: str) -> dict[str, Any] | None:
    from longpack.catalog import catalog_entry, list_models

    key = name.strip().lower().replace("-", "_").replace(".", "_")
    known = {m.lower(): m for m in list_models()}
    if key not in known:
        for model in list_models():
            if str(catalog_entry(model).get("hf_id", "")).lower() == name.strip().lower():
                key = model
                break
        else:
            return None
    entry = catalog_entry(known.get(key, key))
    model_type = _CATALOG_MODEL_TYPES.get(known.get(key, key))
    if model_type is None:
        return None
    attention = entry["attention"]
    rope = attention.get("rope", {})
    config: dict[str, Any] = {
        "model_type": model_type,
        "vocab_size": entry["vocab_size"],
        "hidden_size": entry["hidden_size"],
        "num_hidden_layers": entry["num_layers"],
        "num_attention_heads": attention["num_attention_heads"],
        "num_key_value_heads": attention["num_kv_heads"],
        "head_dim": attention["head_dim"],
        "intermediate_size": entry["ffn_hidden_size"],
        "rope_theta": rope.get("theta", 10000),
        "max_position_embeddings": entry.get("max_position_embeddings", 131072),
    }
    config.update(_catalog_moe_and_hybrid(entry))
    if rope.get("scaling") == "llama3":
        config["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": rope.get("factor", 8.0),
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        }
    return config


def _catalog_moe_and_hybrid(entry: dict[str, Any]) -> dict[str, Any]:
    """The Hugging Face config keys of a catalog entry's experts, Gated DeltaNet layers, partial RoPE and MTP.

    >>> from longpack.catalog import catalog_entry
    >>> extra = _catalog_moe_and_hybrid(catalog_entry("qwen3_next_80b_a3b"))
    >>> extra["linear_num_value_heads"], extra["num_experts"], extra["mtp_num_hidden_layers"]
    (32, 512, 1)
    """
    out: dict[str, Any] = {}
    moe = entry.get("moe") or {}
    if moe:
        out |= {
            "num_experts": moe["num_experts"],
            "num_experts_per_tok": moe["top_k"],
            "moe_intermediate_size": moe["moe_ffn_hidden_size"],
            "norm_topk_prob": bool(moe.get("norm_topk_prob", True)),
        }
        if moe.get("shared_expert_ffn_hidden_size"):
            out["shared_expert_intermediate_size"] = moe["shared_expert_ffn_hidden_size"]
    gdn = entry.get("gated_deltanet") or {}
    if gdn:
        out |= {
            "linear_num_key_heads": gdn["num_key_heads"],
            "linear_key_head_dim": gdn["key_head_dim"],
            "linear_num_value_heads": gdn["num_value_heads"],
            "linear_value_head_dim": gdn["value_head_dim"],
            "linear_conv_kernel_dim": gdn["conv_kernel_dim"],
            "full_attention_interval": entry["layer_pattern"]["full_attention_interval"],
        }
    factor = entry["attention"].get("partial_rotary_factor")
    if factor is not None:
        out["partial_rotary_factor"] = factor
    if entry.get("mtp_layers"):
        out["mtp_num_hidden_layers"] = int(entry["mtp_layers"])
    return out


def megatron_backend_missing() -> list[str]:
    """What the ``megatron`` backend lacks on this machine (empty: it can run).

    >>> isinstance(megatron_backend_missing(), list)
    True
    """
    import importlib.util

    missing = []
    try:
        import torch

        if not torch.cuda.is_available():
            missing.append("a CUDA device (torch.cuda.is_available() is False)")
    except ImportError:
        missing.append("torch")
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        missing.append("megatron-core (pip install 'longpack[megatron]')")
    if importlib.util.find_spec("transformer_engine") is None:
        missing.append("transformer-engine (pip install transformer-engine[pytorch], on a CUDA machine)")
    return missing


@dataclass(frozen=True, kw_only=True)
class VerifyConfig:
    """What to verify: ``packed`` (a folder ``longpack pack`` wrote, ``.npy`` or Parquet) with a model of the
    family ``model``; ``split`` (default: every split); ``time_budget`` seconds for the row checks (``None``:
    every row), ``max_rows``; ``cp`` / ``pp``: sizes for the distributed checks (CP sizes the data's
    alignment does not allow are skipped and said so) on ``dist_rows`` rows; ``in_batch_rows``: rows that also
    get the in-batch check; ``fault``: inject one of the faults (the verdict must fail); ``certificate``:
    write the JSON certificate there; ``thorough``: the isolation check both ways on every row (default:
    even samples on even rows, odd samples on odd rows; one backward pass per row)."""

    command_help = (
        "Check with a tiny float64 model of the family that packed = unpacked: per-sample loss, gradients, no "
        "attention across samples, no loss on padding, positions, in-batch packing, CP ranks and PP stages.\n\n"
        "Prints a one-line verdict; exit status 1 names the failing row, sample and rank."
    )

    packed: str | Path | None = option(
        None,
        help="Packed output folder (Parquet or .npy); or give --vlm.",
        positional=True,
        cli_type=Path | None,
        metavar="PACKED_DIR",
    )
    model: str = option(help="HF config.json (or its folder), cached hub id, or catalog model.", cli_type=str)
    vlm: str | Path | None = option(
        None,
        help="VLM samples JSONL (as online-sim --vlm reads) instead of PACKED_DIR: prepared, packed in file "
        "order (first fit) into --pack-size rows and checked with a Qwen2-VL/Qwen2.5-VL --model.",
        cli_type=Path | None,
    )
    dpo: str | Path | None = option(
        None,
        help="Packed DPO rows (.npy in NeMo-Aligner's packed DPO layout, as longpack pack --output-format dpo writes, or that folder) instead "
        "of PACKED_DIR: each pair's DPO loss packed = its chosen and rejected sequences alone.",
        cli_type=Path | None,
    )
    dpo_beta: float = option(
        DPO_BETA, help="With --dpo: the DPO beta (NeMo-Aligner's dpo.ref_policy_kl_penalty).", cli_type=float
    )
    pack_size: int | None = option(
        None,
        help="With --vlm: row length in tokens (required); with --dpo: the trainer's seq_length (default: "
        "the longest row).",
    )
    pad_seq_to_mult: int = option(1, help="With --vlm: per-sample alignment multiple (2*CP ...).")
    split: str | None = option(None, help="One split (default: every split).", choices=choices.SPLITS)
    backend: str = option(
        choices.HF_BACKEND,
        help="hf: transformers, CPU, float64; megatron: Megatron-Core + TE (CUDA).",
        choices=VERIFY_BACKENDS,
    )
    time_budget: float | None = option(
        60.0, help="Wall-clock seconds for the whole run; 0 = every row.", cli_type=float
    )
    max_rows: int | None = option(None, help="At most this many rows per split.")
    cp: tuple[int, ...] = option(
        (2, 4),
        help="CP sizes to check (gloo processes), where the alignment allows.",
        cli_type=list[int] | None,
    )
    pp: tuple[int, ...] = option(
        (2,), help="PP sizes to check (one process per stage).", cli_type=list[int] | None
    )
    dist_rows: int = option(2, help="Rows checked under CP and PP (0: none).")
    in_batch_rows: int = option(8, help="Rows that also get the in-batch (MBS > 1) check.")
    fault: str | None = option(
        None, help="Inject a fault; the verdict must fail.", flag="--inject-fault", choices=FAULT_NAMES
    )
    seed: int = seed_option()
    certificate: str | Path | None = option(
        None, help="Write the JSON certificate here.", cli_type=Path | None
    )
    allow_no_manifest: bool = option(
        False,
        help="Read a folder without manifest.json (as Megatron-Bridge writes it).",
        flag="--no-manifest-ok",
    )
    thorough: bool = option(False, help="Isolation check both ways on every row.")
    #: A progress bar of the row checks on stderr (the CLI sets it on a terminal).
    progress: bool = False

    def __post_init__(self) -> None:
        from longpack.validate import plain_fields

        plain_fields(self)
        given = [name for name in ("packed", "vlm", "dpo") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ConfigError(
                "give exactly one input: PACKED_DIR (a folder written by longpack pack), --vlm SAMPLES.jsonl or "
                "--dpo PACKED.npy" + (f", not {' and '.join(given)}" if given else ""),
                fields=("packed", "vlm", "dpo"),
            )
        for name in ("packed", "vlm", "dpo"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str | os.PathLike):
                raise ConfigError(f"{name} must be a path, got {value!r}", fields=name)
        if self.vlm is not None:
            if self.pack_size is None:
                raise ConfigError("--vlm needs --pack-size (row length in tokens)", fields="pack_size")
            positive_int(self.pack_size, "pack_size")
            if self.backend != choices.HF_BACKEND:
                raise ConfigError("--vlm rows are checked with --backend hf only", fields="backend")
        if self.dpo is not None:
            if self.pack_size is not None:
                positive_int(self.pack_size, "pack_size")
            if self.backend != choices.HF_BACKEND:
                raise ConfigError("--dpo rows are checked with --backend hf only", fields="backend")
        finite_float(self.dpo_beta, "dpo_beta", lo=0.0)
        if self.dpo is None and self.dpo_beta != DPO_BETA:
            raise ConfigError(
                "--dpo-beta is the beta of --dpo rows; give --dpo or drop it", fields="dpo_beta"
            )
        positive_int(self.pad_seq_to_mult, "pad_seq_to_mult")
        if not isinstance(self.model, str) or not self.model:
            raise ConfigError(f"model must be a name or a config path, got {self.model!r}", fields="model")
        check_choices(self)
        if self.time_budget is not None:
            finite_float(self.time_budget, "time_budget", lo=0.0)
            if self.time_budget == 0:
                object.__setattr__(self, "time_budget", None)  # 0 = no limit, as on the command line
        if self.max_rows is not None:
            positive_int(self.max_rows, "max_rows")
        for name in ("cp", "pp"):
            value = getattr(self, name)
            sizes = (value,) if isinstance(value, int) else tuple(value)
            for size in sizes:
                positive_int(size, name, at_most=16, why="verify starts one process per rank on this machine")
            object.__setattr__(self, name, sizes)
        non_negative_int(self.dist_rows, "dist_rows")
        non_negative_int(self.in_batch_rows, "in_batch_rows")
        seed_value(self.seed)
        flag(self.thorough, "thorough")
        flag(self.progress, "progress")
        if self.certificate is not None:
            from longpack.outputs import check_output_file

            check_output_file(Path(self.certificate), field="certificate")  # before minutes of checks

    def run(self) -> VerifyResult:
        """Run every check; a folder or model that cannot be read raises a ``LongpackError``."""
        if self.packed is not None and _is_dpo_folder(Path(self.packed)):
            raise ConfigError(
                f"{self.packed} holds preference pairs, not SFT rows; verify them with --dpo {self.packed}",
                fields=("packed", "dpo"),
            )
        if self.backend == choices.MEGATRON_BACKEND:
            missing = megatron_backend_missing()
            if missing:
                raise MissingDependencyError(
                    "--backend megatron needs "
                    + "; ".join(missing)
                    + ". Run benchmarks/gpu_verify.py on a GPU "
                    "machine, or use --backend hf (transformers, CPU)",
                    fields="backend",
                )
            return _run_megatron(self)
        if self.vlm is not None:
            return _run_hf(self, vlm=True)
        if self.dpo is not None:
            return _run_hf(self, dpo=True)
        return _run_hf(self)


class CheckedRow(Protocol):
    """What every backend's per-row report says (``longpack.runtime.verify.RowReport`` and its kin)."""

    @property
    def ok(self) -> bool: ...


def _is_dpo_folder(path: Path) -> bool:
    """Whether ``path`` is a folder ``pack --output-format dpo`` wrote (its manifest says so)."""
    from longpack.packed.formats import known_format
    from longpack.packed.manifest import PackManifest

    if not (path / "manifest.json").is_file():
        return False
    try:
        manifest = PackManifest.read(path)
    except LongpackError:
        return False  # the folder's own reader says what is wrong with it
    named = known_format(manifest.output_format)
    return named is not None and named.preference_pairs


@dataclass(frozen=True, kw_only=True)
class VerifyResult:
    """The verdict, the per-row and distributed figures, notes (skipped checks) and the certificate."""

    ok: bool
    verdict: str
    rows: tuple[CheckedRow, ...]
    distributed: tuple[DistReport, ...]
    failures: tuple[dict[str, Any], ...]
    notes: tuple[str, ...]
    certificate: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.ok else EXIT_FAILED

    def to_dict(self) -> dict[str, Any]:
        """The certificate (what ``--json`` prints)."""
        return self.certificate

    def present(self) -> list[str]:
        """The lines ``longpack verify`` prints: the verdict, notes, then the next failures."""
        lines = [self.verdict, *(f"  note: {note}" for note in self.notes)]
        for failure in self.failures[1:10]:
            sample = "" if failure.get("sample") is None else f" sample {failure['sample']}"
            lines.append(
                f"  {failure['check']}: {failure['split']} {failure['file']} row {failure['row']}{sample} "
                f"({failure['rank']}): {failure['detail']}"
            )
        return lines


def _versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    from longpack._version import __version__

    out: dict[str, str | None] = {"longpack": __version__}
    for name in ("torch", "transformers", "megatron-core", "transformer-engine", "transformer_engine"):
        try:
            out[name.replace("_", "-")] = version(name)
        except PackageNotFoundError:
            out.setdefault(name.replace("_", "-"), None)
    return out


def _write_certificate(path: str | Path | None, certificate: dict[str, Any]) -> None:
    """Write the certificate as indented JSON to ``path`` (atomically), when one is asked for.

    >>> import tempfile
    >>> out = Path(tempfile.mkdtemp()) / "cert.json"
    >>> _write_certificate(str(out), {"ok": True}); out.read_text()
    '{\\n  "ok": true\\n}\\n'
    """
    if path is not None:
        atomic_write_bytes(Path(path), (json.dumps(certificate, indent=2) + "\n").encode())


def _certified(
    config: VerifyConfig,
    certificate: dict[str, Any],
    *,
    ok: bool,
    verdict: str,
    rows: Sequence[CheckedRow],
    distributed: Sequence[DistReport],
    failures: Any,
    notes: Any,
    seconds: float,
) -> VerifyResult:
    """Every backend's ending: the certificate gets its first 100 failures and the run time, is written
    where ``config.certificate`` asks, and comes back inside the result."""
    certificate = {**certificate, "failures": list(failures)[:100], "seconds": round(seconds, 2)}
    _write_certificate(config.certificate, certificate)
    return VerifyResult(
        ok=ok,
        verdict=verdict,
        rows=tuple(rows),
        distributed=tuple(distributed),
        failures=tuple(failures),
        notes=tuple(notes),
        certificate=certificate,
        seconds=seconds,
    )


def _order_rows(scan: Any, seed: int) -> list[int]:
    """Rows of a split in checking order: every file's first and last row, the 4 longest rows, the rest
    in a seeded permutation."""
    import numpy as np

    order: list[int] = []
    start = 0
    for n in scan.file_rows:
        if n:
            order += [start, start + n - 1]
        start += n
    order += [int(i) for i in np.argsort(-scan.row_stored, kind="stable")[:4]]
    order += [int(i) for i in np.random.default_rng(seed).permutation(scan.rows)]
    return list(dict.fromkeys(order))


def _locate(scan: Any, index: int) -> tuple[str, int]:
    import numpy as np

    ends = np.cumsum(scan.file_rows)
    f = int(np.searchsorted(ends, index, side="right"))
    return scan.files[f], index - int(ends[f] - scan.file_rows[f])


def _cp_unaligned(
    rows: list[tuple[dict[str, Any], dict[str, Any], int]], collate: Any, size: int
) -> str | None:
    """Why these rows cannot be split over ``size`` CP ranks (``None``: they can)."""
    from longpack.errors import LongpackError
    from longpack.runtime.context_parallel import check_thd_alignment, physical_cu_seqlens

    for row, where, _ in rows:
        batch = collate([row])
        try:
            physical = physical_cu_seqlens(batch)
            assert physical is not None
            check_thd_alignment(physical, int(batch["tokens"].size(1)), cp_size=size)
        except LongpackError as exc:
            return f"{where['split']} {where['file']} row {where['row']}: {exc}"
    return None


def structural_failures(config: VerifyConfig) -> tuple[list[dict[str, Any]], bool]:
    """What the structural verifier (``longpack inspect --verify``: every row's labels, alignment, pack
    size, the manifest's hashes and counts) finds wrong with ``config.packed``, as verify failures, and
    whether the model checks can read the folder at all (not when a file is damaged or the manifest cannot
    be read). A model check proves nothing about a folder whose files no longer match what was packed, so
    it runs first."""
    from longpack.packed import inspect_output

    assert config.packed is not None
    report = inspect_output(Path(config.packed), verify=True, no_manifest_ok=config.allow_no_manifest)
    if report["ok"]:
        return [], True
    readable = not report.get("damaged") and not report.get("manifest_unreadable")
    return [
        {
            "check": "structure",
            "split": None,
            "file": str(config.packed),
            "row": None,
            "sample": None,
            "rank": "longpack inspect --verify",
            "detail": str(problem),
        }
        for problem in report["problems"]
    ], readable


def _unreadable(config: VerifyConfig, structural: list[dict[str, Any]], began: float) -> VerifyResult:
    """The verdict on a folder the model checks cannot read (a damaged file, an unreadable manifest): FAIL
    with the structural verifier's problems (exit 1, as ``longpack inspect --verify`` exits); no model runs."""
    verdict = (
        f"FAIL: the structural verifier (longpack inspect --verify) found {len(structural)} problem(s) that "
        f"keep the model checks from reading the folder; first: {structural[0]['detail']}"
    )
    notes = ["no row was run through the model: the folder cannot be read"]
    certificate = {
        "verdict": "fail",
        "summary": verdict,
        "versions": _versions(),
        "data": {"path": str(config.packed)},
        "structure": {
            "checked": "every row (longpack inspect --verify)",
            "problems": [f["detail"] for f in structural],
        },
        "rows_checked": {},
        "rows_not_checked": None,
        "fault_injected": config.fault,
        "notes": notes,
    }
    return _certified(
        config,
        certificate,
        ok=False,
        verdict=verdict,
        rows=(),
        distributed=(),
        failures=structural,
        notes=notes,
        seconds=time.perf_counter() - began,
    )


def _distributed(
    config: VerifyConfig,
    dist_rows: list[tuple[dict[str, Any], dict[str, Any], int]],
    collators: dict[str, Any],
    source: dict[str, Any],
    multiple: int,
    began: float,
    notes: list[str],
) -> list[DistReport]:
    """The CP and PP checks on ``dist_rows``, each started only while the time budget (wall time since
    ``began``) has room for it (as long as the longest one so far); those not run are said in ``notes``."""
    from longpack.runtime.verify_dist import run_cp_verify, run_pp_verify

    distributed: list[DistReport] = []
    if not dist_rows:
        return distributed
    collate = collators[dist_rows[0][1]["split"]]
    longest = 0.0
    for kind, size in [("cp", s) for s in config.cp] + [("pp", s) for s in config.pp]:
        if kind == "cp":
            unaligned = _cp_unaligned(dist_rows, collate, size)
            if unaligned is not None:
                notes.append(
                    f"CP {size}: skipped: {unaligned}; the data is aligned to pad_seq_to_mult={multiple} and "
                    f"CP {size} needs every packed sequence a multiple of 2*CP={2 * size} (pack with --cp {size})"
                )
                continue
        if config.time_budget is not None and distributed:
            left = config.time_budget - (time.perf_counter() - began)
            if left < longest:
                notes.append(
                    f"{kind.upper()} {size}: not run: {max(left, 0.0):.0f} s of the {config.time_budget:g} s time "
                    f"budget left, a distributed check took {longest:.0f} s; raise --time-budget (0: no limit)"
                )
                continue
        run = run_cp_verify if kind == "cp" else run_pp_verify
        t = time.perf_counter()
        distributed.append(
            run(size, dist_rows, model=source, collate=collate, seed=config.seed, fault=config.fault)
        )
        longest = max(longest, time.perf_counter() - t)
    return distributed


def _run_hf(config: VerifyConfig, *, vlm: bool = False, dpo: bool = False) -> VerifyResult:
    import torch

    from longpack.runtime.verify import THREADS

    before = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    try:
        if dpo:
            return _run_dpo_checks(config)
        return _run_vlm_checks(config) if vlm else _run_hf_checks(config)
    finally:
        torch.set_num_threads(before)


def _run_hf_checks(config: VerifyConfig) -> VerifyResult:
    import torch

    from longpack.packed.folder import PackedFolder
    from longpack.progress import ProgressBar
    from longpack.runtime.collate import PackedCollator
    from longpack.runtime.dataset import PackedDataset
    from longpack.runtime.verify import CHECKS, RowVerifier, coverage
    from longpack.runtime.verify_model import (
        HEAD_CLASSES,
        THD_ATTENTION,
        build_model,
        tiny_config,
    )

    began = time.perf_counter()
    assert config.packed is not None
    source = load_hf_config(config.model)
    structural, readable = structural_failures(config)  # first: the model checks below add to what it finds
    if not readable:
        return _unreadable(config, structural, began)
    folder = PackedFolder.open(config.packed, allow_no_manifest=config.allow_no_manifest)
    splits = [config.split] if config.split is not None else list(folder.split_names)
    options = dict((folder.manifest.bridge_config or {}).get("options", {})) if folder.manifest else {}
    pad_to_max = bool(options.get("pad_to_max_length"))
    pad_cu = bool(options.get("pad_cu_seqlens"))
    model = build_model(source, seed=config.seed)
    threads = torch.get_num_threads()
    reports: list[RowReport] = []
    chosen: dict[str, list[int]] = {}
    notes: list[str] = []
    dist_rows: list[tuple[dict[str, Any], dict[str, Any], int]] = []
    collators: dict[str, Any] = {}
    total_rows = 0
    row_seconds: list[float] = []
    scans = {split: folder.scan(split) for split in splits}
    for split in splits:
        collators[split] = PackedCollator.for_data(
            folder, split=split, pad_to_max_length=pad_to_max, pad_cu_seqlens=pad_cu
        )
    # The CP and PP checks first (a few rows, but seconds of process start-up each), so that the time budget
    # is the whole run's wall time: the row checks get what is left of it.
    if config.dist_rows and splits:
        leading = PackedDataset(folder, split=splits[0], prefetch=0)
        for index in _order_rows(scans[splits[0]], config.seed)[: config.dist_rows]:
            file, row_in_file = _locate(scans[splits[0]], index)
            dist_rows.append((leading[index], {"split": splits[0], "file": file, "row": row_in_file}, index))
        leading.close()
    distributed = _distributed(
        config, dist_rows, collators, source, folder.pad_seq_to_mult or 1, began, notes
    )
    unchecked = 0
    for position, split in enumerate(splits):
        # Each split gets an equal share of what is left of the budget (at least its first row is checked).
        share = None if config.time_budget is None else (config.time_budget - (time.perf_counter() - began))
        deadline = None if share is None else time.perf_counter() + share / (len(splits) - position)
        scan = scans[split]
        total_rows += scan.rows
        dataset = PackedDataset(folder, split=split, prefetch=0)
        collate = collators[split]
        verifier = RowVerifier(
            model,
            collate=collate,
            seed=config.seed,
            fault=config.fault,
            in_batch_multiple=collate.pad_seq_to_mult,
            thorough=config.thorough,
        )
        chosen[split] = []
        order = _order_rows(scan, config.seed)
        want = len(order) if config.max_rows is None else min(len(order), config.max_rows)
        with ProgressBar(f"verify {split} rows", want, enabled=config.progress) as advance:
            for n, index in enumerate(order):
                if len(chosen[split]) >= want:
                    break
                if deadline is not None and row_seconds and chosen[split]:
                    estimate = max(row_seconds[-3:])
                    if time.perf_counter() + estimate > deadline:
                        break
                file, row_in_file = _locate(scan, index)
                where = {"split": split, "file": file, "row": row_in_file}
                row = dataset[index]
                t = time.perf_counter()
                reports.append(verifier.verify(row, where, index, in_batch=n < config.in_batch_rows))
                row_seconds.append(time.perf_counter() - t)
                chosen[split].append(index)
                if advance is not None:
                    advance(1)
        dataset.close()
        if len(chosen[split]) < scan.rows:
            unchecked += scan.rows - len(chosen[split])
            notes.append(
                f"{split}: {len(chosen[split])} of {scan.rows} rows checked, {scan.rows - len(chosen[split])} not "
                f"(time budget {config.time_budget} s of wall time, max_rows {config.max_rows}; every file's "
                "first and last row and the longest rows first; --time-budget 0 checks every row)"
            )
    if config.fault == "route-padding" and not any(r.router_padding_tokens for r in reports):
        notes.append("route-padding: no checked row has padding tokens, so the fault had nothing to route")
    failures = [asdict(f) for r in reports for f in r.failures]
    failures += [dict(f) for d in distributed for f in d.failures]
    failures += structural
    ok = not failures
    checked = sum(len(v) for v in chosen.values())
    seconds = time.perf_counter() - began
    if ok:
        dist_text = ", ".join(f"{d.kind.upper()} {d.size}" for d in distributed) or "no CP/PP"
        parts = coverage(model.config)["parts"]
        dist_text = (
            ("MoE router statistics; " if parts["moe_router"]["covered"] else "")
            + ("MTP; " if parts["mtp"]["covered"] else "")
            + dist_text
        )
        verdict = (
            f"PASS: {checked} of {total_rows} rows, packed = unpacked (loss, gradients, isolation, padding, "
            f"positions; {dist_text}) with a tiny {source.get('model_type')} in float64 ({seconds:.1f} s); "
            f"structure of every row checked (inspect --verify)"
            + (f"; {unchecked} row(s) not run through the model" if unchecked else "")
        )
    else:
        first = failures[0]
        sample = "" if first.get("sample") is None else f" sample {first['sample']}"
        verdict = (
            f"FAIL: {len(failures)} difference(s); first: {first['check']} in {first['split']} {first['file']} "
            f"row {first['row']}{sample} ({first['rank']}): {first['detail']}"
        )
        if structural:
            verdict += (
                f"; the structural verifier (longpack inspect --verify) found {len(structural)} problem(s), "
                f"first: {structural[0]['detail']}"
            )
    tiny = tiny_config(source)
    certificate = {
        "verdict": "pass" if ok else "fail",
        "summary": verdict,
        "versions": _versions(),
        "model": {
            "source": str(config.model),
            "model_type": source.get("model_type"),
            "kept": {
                k: tiny.get(k)
                for k in (
                    "vocab_size",
                    "rope_theta",
                    "rope_scaling",
                    "rope_parameters",
                    "sliding_window",
                    "layer_types",
                    "max_position_embeddings",
                )
                if tiny.get(k) is not None
            },
            "shrunk": {
                k: tiny.get(k)
                for k in (
                    "num_hidden_layers",
                    "hidden_size",
                    "num_attention_heads",
                    "num_key_value_heads",
                    "head_dim",
                    "intermediate_size",
                )
            },
            "dtype": "float64 (transformers' float32 upcasts promoted)",
            "seed": config.seed,
            "isolation": "both parities on every row"
            if config.thorough
            else "even samples on even rows, odd on odd",
            "packed_attention": f"{THD_ATTENTION} (transformers AttentionInterface: causal SDPA per packed "
            "sequence, from cu_seqlens)",
            "reference": "transformers sdpa, each sample on its own",
            "loss_head": f"cross-entropy over label id mod {HEAD_CLASSES}",
            "threads": threads,
        },
        "data": {
            "path": str(config.packed),
            "format": folder.format,
            "splits": splits,
            "alignment": asdict(folder.alignment()) if folder.manifest else None,
            "collate": {"pad_to_max_length": pad_to_max, "pad_cu_seqlens": pad_cu},
        },
        "layout": {
            "cp_checked": [d.size for d in distributed if d.kind == "cp"],
            "pp_checked": [d.size for d in distributed if d.kind == "pp"],
            "in_batch_mbs": "all samples of a row",
            "micro_batch_size": 1,
        },
        "checks": CHECKS,
        "coverage": coverage(
            model.config,
            cp=[d.size for d in distributed if d.kind == "cp"],
            pp=[d.size for d in distributed if d.kind == "pp"],
        ),
        "rows_checked": chosen,
        "rows_total": total_rows,
        "worst": {
            "loss_rel_diff": max((r.loss_max_rel_diff for r in reports), default=0.0),
            "grad_rel_diff": max((r.grad_max_rel_diff for r in reports), default=0.0),
            "embedding_grad_rel_diff": max((r.embedding_grad_max_rel_diff for r in reports), default=0.0),
            "cross_sample_gradient": max((r.leak_max_abs for r in reports), default=0.0),
            "in_batch_rel_diff": max((r.in_batch_max_rel_diff for r in reports), default=0.0),
            "router_rel_diff": max((r.router_max_rel_diff for r in reports), default=0.0),
            "mtp_loss_rel_diff": max((r.mtp_loss_max_rel_diff for r in reports), default=0.0),
            "mtp_cross_sample_gradient": max((r.mtp_leak_max_abs for r in reports), default=0.0),
            "distributed": [asdict(d) | {"failures": len(d.failures)} for d in distributed],
        },
        "structure": {
            "checked": "every row (longpack inspect --verify)",
            "problems": [f["detail"] for f in structural],
        },
        "rows_not_checked": unchecked,
        "fault_injected": config.fault,
        "notes": notes,
    }
    return _certified(
        config,
        certificate,
        ok=ok,
        verdict=verdict,
        rows=reports,
        distributed=distributed,
        failures=failures,
        notes=notes,
        seconds=seconds,
    )


#: What a ``--vlm`` row check proves (``longpack.runtime.verify_vlm``); CP and PP are not run on Qwen-VL rows.
VLM_CHECKS = {
    "metadata": "cu_seqlens equal the row's sequences; every sequence's 3-D (mRoPE) positions equal "
    "transformers' get_rope_index on the sequence alone",
    "vision": "image features of the packed row's pixels = each sequence's own",
    "loss": "per-sequence packed loss = the sequence's unpacked loss",
    "gradients": "parameter and input-embedding gradients packed = unpacked",
    "isolation": "gradient of one sequence's loss w.r.t. another sequence's embeddings is exactly zero",
    "padding": "no loss on a token outside cu_seqlens",
}


def _vlm_preparer(source: dict[str, Any]) -> Any:
    """The Qwen-VL preparer for ``source`` (built-in ``qwen3`` tokenizer, transformers' default image
    processor), refused when the model's patch, merge or image token differ from what it prepares."""
    from longpack.vlm.prepare import QwenVLPreparer, VLMConfig

    preparer = QwenVLPreparer("qwen3", config=VLMConfig())
    vision = dict(source.get("vision_config") or {})
    model_sizes = {
        "patch_size": vision.get("patch_size", 14),
        "merge_size": vision.get("spatial_merge_size", 2),
        "temporal_patch_size": vision.get("temporal_patch_size", 2),
        "image_token_id": source.get("image_token_id", preparer.image_token_id),
    }
    prepared_sizes = {
        "patch_size": preparer.vision.patch_size,
        "merge_size": preparer.vision.merge_size,
        "temporal_patch_size": preparer.vision.temporal_patch_size,
        "image_token_id": preparer.image_token_id,
    }
    if model_sizes != prepared_sizes:
        raise ConfigError(
            f"--model {source.get('model_type')}: {model_sizes} differ from the samples' preparation "
            f"{prepared_sizes} (Qwen2-VL image processor defaults, the qwen3 tokenizer)",
            fields="model",
        )
    return preparer


def _run_vlm_checks(config: VerifyConfig) -> VerifyResult:
    """``--vlm``: prepare the JSONL's samples, first fit in file order into ``pack_size`` rows, check each
    row with :func:`longpack.runtime.verify_vlm.verify_visual_row`."""
    import torch

    from longpack.binpack.megatron import first_fit
    from longpack.runtime.verify_vlm import VISUAL_FAULTS, build_visual_model, verify_visual_row
    from longpack.topology import align_up
    from longpack.vlm.errors import REJECT_REASONS, SampleRejected
    from longpack.vlm.metadata import vlm_samples

    began = time.perf_counter()
    assert config.vlm is not None and config.pack_size is not None
    faults = sorted(set(VISUAL_FAULTS) & set(FAULT_NAMES))
    if config.fault is not None and config.fault not in faults:
        raise ConfigError(
            f"with --vlm, the injected fault must be one of {', '.join(faults)}, got {config.fault!r}",
            fields="fault",
        )
    source = load_hf_config(config.model)
    model = build_visual_model(source, seed=config.seed)  # refuses a family that is not Qwen-VL
    preparer = _vlm_preparer(source)
    multiple = config.pad_seq_to_mult
    keys: list[str] = []
    sequences: list[Any] = []
    refused = dict.fromkeys(REJECT_REASONS, 0)
    skipped: list[dict[str, str]] = []
    for key, record in vlm_samples(config.vlm):
        try:
            prepared = preparer.prepare(record, key=key)
            if align_up(prepared.sequence_length, multiple) > config.pack_size:
                raise SampleRejected(
                    key,
                    "too_long",
                    f"{prepared.sequence_length} tokens (aligned to {multiple}) > pack_size={config.pack_size}",
                )
        except SampleRejected as exc:
            refused[exc.reason] = refused.get(exc.reason, 0) + 1
            skipped.append({"key": exc.key, "reason": exc.reason, "detail": str(exc)})
            continue
        keys.append(key)
        sequences.append(prepared)
    lengths = [align_up(s.sequence_length, multiple) for s in sequences]
    rows = first_fit(list(range(len(sequences))), config.pack_size, item_lengths=lengths) if sequences else []
    name = Path(config.vlm).name
    reports: list[RowReport] = []
    row_seconds: list[float] = []
    checked: list[int] = []
    deadline = None if config.time_budget is None else began + config.time_budget
    for index, members in enumerate(rows):
        if config.max_rows is not None and len(checked) >= config.max_rows:
            break
        if deadline is not None and row_seconds and time.perf_counter() + max(row_seconds[-3:]) > deadline:
            break
        t = time.perf_counter()
        reports.append(
            verify_visual_row(
                [sequences[i] for i in members],
                model,
                pad_to_multiple_of=multiple,
                seed=config.seed,
                where={"split": "vlm", "file": name, "row": index},
                fault=config.fault,
            )
        )
        row_seconds.append(time.perf_counter() - t)
        checked.append(index)
    notes = ["CP and PP checks are not run on Qwen-VL rows (single process)"]
    if len(checked) < len(rows):
        notes.append(
            f"vlm: {len(checked)} of {len(rows)} rows checked (time budget {config.time_budget} s, "
            f"max_rows {config.max_rows}; rows in file order)"
        )
    if skipped:
        counts = ", ".join(f"{reason} {n}" for reason, n in refused.items() if n)
        notes.append(f"{len(skipped)} sample(s) refused ({counts}); first: {skipped[0]['detail']}")
    if not rows:
        raise ConfigError(
            f"{config.vlm}: no sample could be prepared into a row of {config.pack_size} tokens "
            f"({len(skipped)} refused)",
            fields="vlm",
        )
    failures = [asdict(f) for r in reports for f in r.failures]
    for failure in failures:
        failure["samples"] = [keys[i] for i in rows[failure["row"]]]
    ok = not failures
    samples_checked = sum(len(rows[i]) for i in checked)
    seconds = time.perf_counter() - began
    if ok:
        verdict = (
            f"PASS: {len(checked)} of {len(rows)} rows ({samples_checked} samples, {len(skipped)} refused), "
            f"packed = unpacked (loss, gradients, isolation, padding, mRoPE positions, image features) with a "
            f"tiny {source.get('model_type')} in float64 ({seconds:.1f} s)"
        )
    else:
        first = failures[0]
        sample = "" if first.get("sample") is None else f" sample {first['sample']}"
        verdict = (
            f"FAIL: {len(failures)} difference(s); first: {first['check']} in {first['split']} {first['file']} "
            f"row {first['row']}{sample} ({first['rank']}): {first['detail']}"
        )
    certificate = {
        "verdict": "pass" if ok else "fail",
        "summary": verdict,
        "versions": _versions(),
        "model": {
            "source": str(config.model),
            "model_type": source.get("model_type"),
            "dtype": "float64",
            "seed": config.seed,
            "reference": "transformers sdpa, each sequence on its own, get_rope_index positions",
            "threads": torch.get_num_threads(),
        },
        "data": {
            "path": str(config.vlm),
            "format": "vlm-jsonl",
            "pack_size": config.pack_size,
            "pad_seq_to_mult": multiple,
            "packing": "first_fit in file order",
            "samples": len(sequences),
            "samples_checked": samples_checked,
            "refused": {reason: n for reason, n in refused.items() if n},
            "skipped": [{"key": s["key"], "reason": s["reason"]} for s in skipped],
        },
        "layout": {"cp_checked": [], "pp_checked": [], "micro_batch_size": 1},
        "checks": VLM_CHECKS,
        "rows_checked": {"vlm": checked},
        "row_samples": {str(i): [keys[j] for j in rows[i]] for i in checked},
        "rows_total": len(rows),
        "worst": {
            "loss_rel_diff": max((r.loss_max_rel_diff for r in reports), default=0.0),
            "grad_rel_diff": max((r.grad_max_rel_diff for r in reports), default=0.0),
            "embedding_grad_rel_diff": max((r.embedding_grad_max_rel_diff for r in reports), default=0.0),
            "cross_sample_gradient": max((r.leak_max_abs for r in reports), default=0.0),
            "vision_rel_diff": max((getattr(r, "vision_max_rel_diff", 0.0) for r in reports), default=0.0),
        },
        "fault_injected": config.fault,
        "notes": notes,
    }
    return _certified(
        config,
        certificate,
        ok=ok,
        verdict=verdict,
        rows=reports,
        distributed=(),
        failures=failures,
        notes=notes,
        seconds=seconds,
    )


def _run_dpo_checks(config: VerifyConfig) -> VerifyResult:
    """``--dpo``: every row of a packed DPO ``.npy`` (as many as the time budget allows, in file order)
    checked with :class:`longpack.runtime.verify_dpo.DPOVerifier` (a policy and a reference model)."""
    import torch

    from longpack.packed.preference import read_packed_dpo
    from longpack.runtime.verify import DPO_FAULTS
    from longpack.runtime.verify_dpo import DPO_CHECKS, DPOVerifier
    from longpack.runtime.verify_model import build_model

    began = time.perf_counter()
    assert config.dpo is not None
    if config.fault is not None and config.fault not in DPO_FAULTS:
        raise ConfigError(
            f"with --dpo, the injected fault must be one of {', '.join(sorted(DPO_FAULTS))}, got {config.fault!r}",
            fields="fault",
        )
    source = load_hf_config(config.model)
    path = Path(config.dpo)
    if path.is_dir():  # a folder `longpack pack --output-format dpo` wrote: its manifest names the file
        from longpack.packed.manifest import MANIFEST_NAME, PackManifest

        if not (path / MANIFEST_NAME).is_file():
            raise ConfigError(f"{path}: no {MANIFEST_NAME}; give the packed DPO .npy file", fields="dpo")
        record = PackManifest.read(path / MANIFEST_NAME).extra.get("preference")
        if not isinstance(record, dict) or "file" not in record:
            raise ConfigError(
                f"{path}: not a packed DPO folder (its manifest has no preference record); pack it with "
                "--output-format dpo, or give the .npy file",
                fields="dpo",
            )
        path = path / str(record["file"])
    rows = read_packed_dpo(path)
    name = path.name
    longest = max(len(r["input_ids"]) for r in rows)
    seq_length = config.pack_size if config.pack_size is not None else longest
    policy = build_model(source, seed=config.seed)
    reference = build_model(source, seed=config.seed + 1)  # the frozen reference policy: other weights
    for p in reference.parameters():
        p.requires_grad_(False)
    eos = source.get("eos_token_id")
    eos_id = (
        int(eos[0] if isinstance(eos, list) and eos else eos) if isinstance(eos, int | list) and eos else 0
    )
    verifier = DPOVerifier(
        policy,
        reference,
        seq_length=seq_length,
        eos_id=eos_id,
        beta=config.dpo_beta,
        seed=config.seed,
        fault=config.fault,
    )
    candidates = list(range(len(rows)))
    if config.fault is not None:  # the faults cross pairs: rows of two pairs or more
        candidates = [i for i in candidates if len(rows[i]["lengths"]) >= 4]
        if not candidates:
            raise ConfigError(
                f"fault {config.fault!r} crosses pairs and every row of {name} holds one pair; pack with a larger "
                "pack size to inject it",
                fields="fault",
            )
    reports: list[Any] = []
    row_seconds: list[float] = []
    deadline = None if config.time_budget is None else began + config.time_budget
    for index in candidates:
        if config.max_rows is not None and len(reports) >= config.max_rows:
            break
        if deadline is not None and row_seconds and time.perf_counter() + max(row_seconds[-3:]) > deadline:
            break
        t = time.perf_counter()
        reports.append(verifier.verify(rows[index], {"split": "dpo", "file": name, "row": index}))
        row_seconds.append(time.perf_counter() - t)
    checked = [r.row for r in reports]
    notes = ["CP and PP checks are not run on DPO rows (single process, micro-batch 1 as NeMo-Aligner packs)"]
    if len(checked) < len(rows):
        notes.append(
            f"dpo: {len(checked)} of {len(rows)} rows checked (time budget {config.time_budget} s, max_rows "
            f"{config.max_rows}"
            + ("; rows of one pair left out: the fault crosses pairs" if config.fault else "")
            + ")"
        )
    failures = [asdict(f) for r in reports for f in r.failures]
    ok = not failures
    pairs_checked = sum(len(r.pairs) for r in reports)
    seconds = time.perf_counter() - began
    worst = {
        "logps_rel_diff": max((r.logps_max_rel_diff for r in reports), default=0.0),
        "logratio_rel_diff": max((r.logratio_max_rel_diff for r in reports), default=0.0),
        "dpo_loss_rel_diff": max((r.loss_max_rel_diff for r in reports), default=0.0),
        "grad_rel_diff": max((r.grad_max_rel_diff for r in reports), default=0.0),
    }
    if ok:
        verdict = (
            f"PASS: {len(checked)} of {len(rows)} rows ({pairs_checked} pairs), DPO packed = unpacked (log-prob "
            f"sums, log-ratio, loss, gradients; worst relative {max(worst.values()):.1e}) with a tiny "
            f"{source.get('model_type')} policy and reference in float64 ({seconds:.1f} s)"
        )
    else:
        first = failures[0]
        pair = "" if first.get("sample") is None else f" pair {first['sample']}"
        verdict = (
            f"FAIL: {len(failures)} difference(s); first: {first['check']} in {first['file']} row {first['row']}"
            f"{pair}: {first['detail']}"
        )
    certificate = {
        "verdict": "pass" if ok else "fail",
        "summary": verdict,
        "versions": _versions(),
        "model": {
            "source": str(config.model),
            "model_type": source.get("model_type"),
            "dtype": "float64",
            "seed": config.seed,
            "reference_policy_seed": config.seed + 1,
            "beta": config.dpo_beta,
            "unpacked": "transformers sdpa, each chosen and rejected sequence on its own",
            "threads": torch.get_num_threads(),
        },
        "data": {
            "path": str(config.dpo),
            "format": "nemo-aligner-packed-dpo",
            "seq_length": seq_length,
            "rows": len(rows),
            "pairs_checked": pairs_checked,
        },
        "layout": {"cp_checked": [], "pp_checked": [], "micro_batch_size": 1},
        "checks": DPO_CHECKS,
        "rows_checked": {"dpo": checked},
        "row_pairs": {str(r.row): list(r.pairs) for r in reports},
        "rows_total": len(rows),
        "worst": worst,
        "fault_injected": config.fault,
        "notes": notes,
    }
    return _certified(
        config,
        certificate,
        ok=ok,
        verdict=verdict,
        rows=reports,
        distributed=(),
        failures=failures,
        notes=notes,
        seconds=seconds,
    )


def _run_megatron(config: VerifyConfig) -> VerifyResult:
    """The megatron backend: Megatron-Core GPTModel + TE attention on one CUDA device, packed vs alone."""
    import torch

    from longpack.packed.folder import PackedFolder
    from longpack.runtime.collate import PackedCollator
    from longpack.runtime.dataset import PackedDataset
    from longpack.runtime.verify import expected_spans
    from longpack.runtime.verify_megatron import TOLERANCE, build_megatron_model, sample_losses

    began = time.perf_counter()
    assert config.packed is not None
    source = load_hf_config(config.model)
    structural, readable = structural_failures(config)
    if not readable:
        return _unreadable(config, structural, began)
    folder = PackedFolder.open(config.packed, allow_no_manifest=config.allow_no_manifest)
    split = config.split or folder.split_names[0]
    collate = PackedCollator.for_data(folder, split=split)
    model = build_megatron_model(int(source["vocab_size"]), collate.max_seq_length, config.seed)
    model.eval()
    dataset = PackedDataset(folder, split=split, prefetch=0)
    scan = folder.scan(split)
    failures: list[dict[str, Any]] = []
    checked: list[int] = []
    worst = 0.0
    for index in _order_rows(scan, config.seed):
        if config.max_rows is not None and len(checked) >= config.max_rows:
            break
        if config.time_budget is not None and checked and time.perf_counter() - began > config.time_budget:
            break
        file, row_in_file = _locate(scan, index)
        row = dataset[index]
        for sample, got, want in sample_losses(model, collate([row]), expected_spans(row)):
            diff = abs(got - want) / max(1.0, abs(want))
            worst = max(worst, diff)
            if diff > TOLERANCE:
                failures.append(
                    {
                        "check": "loss",
                        "split": split,
                        "file": file,
                        "row": row_in_file,
                        "sample": sample,
                        "rank": "megatron-core GPTModel, TE attention",
                        "detail": f"packed mean loss {got:.6g} != alone {want:.6g} (relative {diff:.2e})",
                    }
                )
        checked.append(index)
    failures += structural
    ok = not failures
    seconds = time.perf_counter() - began
    if ok:
        verdict = (
            f"PASS: {len(checked)} of {scan.rows} rows, packed = unpacked with Megatron-Core GPTModel + TE "
            f"attention (bf16, worst relative {worst:.1e}; {seconds:.1f} s)"
        )
    else:
        first = failures[0]
        verdict = (
            f"FAIL: {len(failures)} difference(s); first: {first['check']} in {split} {first['file']} row "
            f"{first['row']} sample {first['sample']} ({first['rank']}): {first['detail']}"
        )
    certificate = {
        "verdict": "pass" if ok else "fail",
        "summary": verdict,
        "backend": choices.MEGATRON_BACKEND,
        "versions": _versions(),
        "device": torch.cuda.get_device_name(0),
        "rows_checked": {split: checked},
        "rows_total": scan.rows,
        "worst": {"loss_rel_diff": worst},
        "tolerance": TOLERANCE,
    }
    return _certified(
        config,
        certificate,
        ok=ok,
        verdict=verdict,
        rows=(),
        distributed=(),
        failures=failures,
        notes=(),
        seconds=seconds,
    )
