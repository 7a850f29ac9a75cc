"""The online-sim job: fill of the online (candidate-buffer) packer against offline packing, for several
buffer sizes, on a synthetic workload, a length list or (``vlm``) VLM samples whose buffer memory is also
reported (``longpack.online.simulate``).

>>> r = OnlineSimConfig(pack_size=4096, buffer_sizes="8,64", samples=2000).run()
>>> [row["buffer_size"] for row in r.to_dict()["rows"]], r.to_dict()["capacity"]
([8, 64], 4096)
>>> OnlineSimConfig(pack_size=4096, buffer_sizes="8,x")
Traceback (most recent call last):
...
longpack.errors.ConfigError: buffer_sizes must be comma-separated positive integers (e.g. 8,64,512), got '8,x'
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from longpack import choices
from longpack.errors import ConfigError, InputError, LongpackError
from longpack.jobs.options import seed_option
from longpack.option import check_choices, option
from longpack.validate import positive_int
from longpack.validate import seed as seed_value

__all__ = ["MAX_SAMPLES", "OnlineSimConfig", "OnlineSimResult", "read_length_lines"]

#: Synthetic samples at most: the simulation runs every buffer size over them in Python.
MAX_SAMPLES = 1_000_000
#: Qwen-VL's vision and video settings, each with the ``VLMConfig`` field it goes to
#: (``longpack.online.simulate.vlm_report`` passes a field to the families that read it, ``config_fields``);
#: the other families read their image settings from their processor (``--tokenizer`` folder).
QWEN_ONLY = {
    **dict.fromkeys(("patch_size", "merge_size", "min_pixels", "max_pixels"), "vision"),
    **dict.fromkeys(("video_fps", "video_max_num_frames"), "video"),
}


def _unread_settings(config_fields: tuple[str, ...]) -> tuple[str, ...]:
    """The Qwen-VL settings a family with these ``config_fields`` does not read.

    >>> _unread_settings(("vision", "video")), _unread_settings(("max_images",))[-1]
    ((), 'video_max_num_frames')
    """
    return tuple(name for name, group in QWEN_ONLY.items() if group not in config_fields)


def _family_patch(name: str) -> int:
    """The vision patch of a family's processor (Qwen2/2.5-VL 14, Qwen3-VL 16): ``patch_size``'s default,
    so that online-sim counts the visual tokens the family counts.

    >>> _family_patch("qwen3_vl"), _family_patch("qwen2_5_vl")
    (16, 14)
    """
    from longpack.vlm.families import vlm_family

    vision = getattr(vlm_family(name), "vision", None)
    return int(vision.patch_size) if vision is not None else 14


def read_length_lines(path: Path) -> list[int]:
    """One runtime length per line (``#`` comments, blank lines skipped); an ``InputError`` names file:line.
    A token store (``longpack tokenize``) gives its samples' runtime lengths."""
    from longpack.store import is_store, store_lengths

    if is_store(path):
        return store_lengths(path).tolist()  # type: ignore[no-any-return]
    try:
        text_lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})", fields="lengths_file") from exc
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{path}: not UTF-8 text at byte {exc.start}; give one runtime length per line",
            fields="lengths_file",
        ) from None
    out = []
    for lineno, line in enumerate(text_lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        try:
            value = int(text)
        except ValueError:
            raise InputError(
                f"{path}:{lineno}: expected one runtime length (an integer) per line, got {text!r}"
            ) from None
        if value < 1:
            raise InputError(f"{path}:{lineno}: runtime length {value} < 1; remove empty samples")
        if value >= 2**62:
            raise InputError(f"{path}:{lineno}: runtime length {text[:30]} is not a token count")
        out.append(value)
    if not out:
        raise InputError(f"{path}: no lengths found (one runtime length per line)")
    return out


@dataclass(frozen=True, kw_only=True)
class OnlineSimConfig:
    """What to simulate; validated on construction."""

    command_help = (
        "Simulate Energon-style online packing for several buffer sizes; compare with offline best fit.\n\n"
        "With --vlm, the samples' lengths come from their image sizes (headers only, no pixel decoded) and "
        "each row also reports the packing buffer's host memory (prepared pixel tensors), per worker and per "
        "rank."
    )

    pack_size: int | None = option(
        None, help="Pack size in runtime tokens (seq_length; required).", aliases=("--capacity",)
    )
    buffer_sizes: str | Sequence[int] = option("8,16,64,256,1024,4096", help="Comma-separated.", cli_type=str)
    workload: str = option(
        choices.LOGNORMAL_WORKLOAD, help="Synthetic workload of sample lengths.", choices=choices.WORKLOADS
    )
    lengths_file: str | Path | None = option(
        None,
        help="Text file with one runtime length per line, or a token store (instead of --workload).",
        flag="--lengths",
        cli_type=Path | None,
    )
    samples: int = option(20000, help="Number of synthetic samples.")
    pad_seq_to_mult: int = option(
        1, help="Per-sample alignment multiple (2*CP ...).", aliases=("--pad-to-multiple-of",)
    )
    algorithm: str | None = option(
        None,
        help="Bin packing (default: best_fit_decreasing; with --vlm first_fit_decreasing, Bridge's).",
        choices=choices.ALGORITHMS,
    )
    seed: int = seed_option()
    vlm: str | Path | None = option(
        None,
        help="JSONL of VLM samples (messages + images or image_sizes): also report the buffer's host memory.",
        cli_type=Path | None,
    )
    vlm_family: str = option(
        choices.DEFAULT_VLM_FAMILY,
        help="With --vlm: model family whose processor counts the tokens (gemma3: --tokenizer is a local "
        "Gemma3 processor folder).",
        choices=choices.VLM_FAMILIES,
    )
    tokenizer: str = option("qwen3", help="With --vlm: tokenizer spec or folder.")
    loader_workers: int = option(1, help="With --vlm: Energon loader workers per rank (one buffer each).")
    patch_size: int | None = option(
        None, help="With --vlm: vision patch (default: the family's; 14, Qwen3-VL 16).", cli_type=int | None
    )
    merge_size: int = option(2, help="With --vlm: spatial merge size.")
    min_pixels: int = option(200704, help="With --vlm: processor min_pixels.")
    max_pixels: int = option(1003520, help="With --vlm: processor max_pixels.")
    max_images: int | None = option(10, help="With --vlm: images per sample limit.")
    max_visual_tokens: int | None = option(16384, help="With --vlm: visual tokens per sample limit.")
    video_fps: float | None = option(
        None,
        help="With --vlm: frames sampled per second of a video file (default: the video processor's, 2).",
    )
    video_max_num_frames: int | None = option(
        None, help="With --vlm: frames kept of a frame-list video (default: Bridge's max_num_frames, 60)."
    )
    write_lengths: str | Path | None = option(
        None,
        help="With --vlm: also write each accepted sample's tokens, one per line (a --lengths file).",
        cli_type=Path | None,
    )

    def __post_init__(self) -> None:
        from longpack.validate import plain_fields

        plain_fields(self)
        if self.pack_size is None:
            raise ConfigError("pack_size is required (pack size in runtime tokens)", fields="pack_size")
        positive_int(self.pack_size, "pack_size")
        positive_int(self.pad_seq_to_mult, "pad_seq_to_mult")
        positive_int(self.samples, "samples", at_most=MAX_SAMPLES, why="the simulation is pure Python")
        positive_int(self.loader_workers, "loader_workers")
        for name in ("max_images", "max_visual_tokens", "video_max_num_frames"):
            if getattr(self, name) is not None:
                positive_int(getattr(self, name), name)
        fps = self.video_fps  # a number > 0 ("" or a list is refused here, not compared with 0)
        if fps is not None and (
            isinstance(fps, bool) or not isinstance(fps, int | float) or not 0 < fps < math.inf
        ):
            raise ConfigError(
                f"video_fps must be > 0 (a finite number of frames per second), got {fps!r}",
                fields="video_fps",
            )
        seed_value(self.seed)
        check_choices(self)
        sizes: tuple[int, ...] = ()
        if isinstance(self.buffer_sizes, str):
            try:
                sizes = tuple(int(x) for x in self.buffer_sizes.split(",") if x.strip())
            except ValueError:
                sizes = ()
        elif isinstance(self.buffer_sizes, list | tuple | range):
            sizes = tuple(self.buffer_sizes)
        if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
            raise ConfigError(
                "buffer_sizes must be comma-separated positive integers (e.g. 8,64,512), got "
                f"{self.buffer_sizes!r}",
                fields="buffer_sizes",
            )
        object.__setattr__(self, "buffer_sizes", sizes)
        self._check_vlm_settings()

    def _check_vlm_settings(self) -> None:
        """VLM settings without ``vlm``, Qwen's vision settings with another family, a family longpack
        does not prepare, and a processor-read family without a processor folder are refused here, before
        any sample is read, each naming the setting."""
        import dataclasses

        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        given = [name for name in VLM_ONLY if getattr(self, name) != defaults[name]]
        if self.vlm is None:
            if given:
                raise ConfigError(
                    f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to VLM samples only; give "
                    "vlm (a JSONL of VLM samples) or drop " + ("it" if len(given) == 1 else "them"),
                    fields=(*given, "vlm"),
                )
            return
        from longpack.vlm.families import vlm_family

        family = vlm_family(self.vlm_family)
        if not family.can_prepare:
            try:
                family.preparer()
            except LongpackError as exc:
                raise ConfigError(
                    f"vlm_family {self.vlm_family}: {exc}; online-sim counts the families longpack prepares: "
                    + ", ".join(n for n in choices.VLM_FAMILIES if vlm_family(n).can_prepare),
                    fields="vlm_family",
                ) from None
        unread = _unread_settings(family.config_fields)
        if not unread:  # the family reads them all (Qwen-VL) and counts with no processor folder
            return
        qwen_only = [name for name in unread if getattr(self, name) != defaults[name]]
        if qwen_only:
            raise ConfigError(
                f"{', '.join(qwen_only)}: Qwen-VL image and video settings; vlm_family {self.vlm_family} reads "
                "its image settings from the processor in the tokenizer folder; drop them",
                fields=(*qwen_only, "vlm_family", "tokenizer"),
            )
        # a path must be a folder; a loaded tokenizer object (from Python) goes to the family's preparer
        if self.tokenizer is None or (
            isinstance(self.tokenizer, str | os.PathLike) and not _is_folder(self.tokenizer)
        ):
            raise ConfigError(
                f"vlm_family {self.vlm_family} counts visual tokens with its transformers processor: give "
                f"tokenizer a local folder holding one (processor.save_pretrained(folder)), got {self.tokenizer!r}",
                fields=("tokenizer", "vlm_family"),
            )

    @property
    def sizes(self) -> tuple[int, ...]:
        """The buffer sizes, as integers (``buffer_sizes`` after validation)."""
        return cast(tuple[int, ...], self.buffer_sizes)

    def run(self) -> OnlineSimResult:
        assert self.pack_size is not None
        if self.vlm is not None:
            return self._vlm()
        from longpack.online.simulate import simulate, smallest_buffer_within, synthetic_lengths

        algorithm = self.algorithm or choices.DEFAULT_ALGORITHM
        try:
            if self.lengths_file is not None:
                lengths = read_length_lines(Path(self.lengths_file))
                source = str(self.lengths_file)
            else:
                lengths = synthetic_lengths(
                    self.workload, self.samples, self.pack_size, seed=self.seed
                ).tolist()
                source = f"{self.workload} x {self.samples} (seed {self.seed})"
            rows = simulate(
                lengths,
                self.pack_size,
                list(self.sizes),
                pad_to_multiple_of=self.pad_seq_to_mult,
                algorithm=algorithm,
                seed=self.seed,
            )
        except (ValueError, OSError) as exc:
            if isinstance(exc, LongpackError):
                raise
            raise ConfigError(str(exc)) from exc
        report = {
            "source": source,
            "capacity": self.pack_size,
            "rows": rows,
            "smallest_buffer_within_1pct": smallest_buffer_within(rows),
        }
        return OnlineSimResult(report=report, algorithm=algorithm, pad_seq_to_mult=self.pad_seq_to_mult)

    def _video(self) -> Any:
        """The video settings: the family's video processor defaults unless given."""
        import dataclasses

        from longpack.vlm.video import default_video_config

        given: dict[str, Any] = {"fps": self.video_fps, "max_num_frames": self.video_max_num_frames}
        base = default_video_config(self.vlm_family)
        return dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None})

    def _vlm(self) -> OnlineSimResult:
        from longpack.online.simulate import vlm_report
        from longpack.vlm.vision import VisionConfig

        assert self.pack_size is not None and self.vlm is not None
        # before the samples are read: a folder, or a file that cannot be written (a missing parent folder
        # is made, as longpack.online.packer.write_text_atomic does)
        if self.write_lengths is not None and Path(self.write_lengths).parent.is_dir():
            from longpack.outputs import check_output_file

            check_output_file(self.write_lengths, field="write_lengths")
        try:
            is_folder = Path(self.vlm).is_dir()
        except OSError as exc:  # e.g. a name too long for the file system
            raise InputError(f"vlm {str(self.vlm)[:200]!r}: {exc.strerror or exc}", fields="vlm") from None
        if is_folder:
            raise InputError(
                f"vlm {self.vlm} is a folder; give a JSONL file of VLM samples (messages + images or image_sizes)",
                fields="vlm",
            )
        algorithm = self.algorithm or choices.FIRST_FIT_DECREASING  # Megatron-Bridge's online packer
        report = vlm_report(
            str(self.vlm),
            self.pack_size,
            list(self.sizes),
            vision=VisionConfig(
                patch_size=self.patch_size if self.patch_size is not None else _family_patch(self.vlm_family),
                merge_size=self.merge_size,
                min_pixels=self.min_pixels,
                max_pixels=self.max_pixels,
            ),
            pad_to_multiple_of=self.pad_seq_to_mult,
            tokenizer=self.tokenizer,
            family=self.vlm_family,
            video=self._video(),
            workers=self.loader_workers,
            max_images=self.max_images,
            max_visual_tokens=self.max_visual_tokens,
            algorithm=algorithm,
            seed=self.seed,
        )
        lengths = report.pop("lengths")
        if not lengths:  # nothing to pack: every figure would be 0 / 0
            summary = report["samples"]
            refused = {k: v for k, v in summary["rejected"].items() if v}
            named = "; ".join(f"{s['key']}: {s['reason']}" for s in summary["skipped"][:3])
            raise InputError(
                f"vlm {self.vlm}: no sample to pack"
                + (
                    f" (refused: {', '.join(f'{k} {v}' for k, v in refused.items())}; e.g. {named})"
                    if refused
                    else " (the file holds no samples)"
                )
                + "; fix the samples or the limits (pack_size, max_images, max_visual_tokens)",
                fields=("vlm", "pack_size", "max_images", "max_visual_tokens"),
            )
        if self.write_lengths is not None:
            from longpack.online.packer import write_text_atomic

            write_text_atomic(Path(self.write_lengths), "".join(f"{n}\n" for n in lengths))
        return OnlineSimResult(
            report=report, algorithm=algorithm, pad_seq_to_mult=self.pad_seq_to_mult, vlm=True
        )


def _is_folder(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a folder; a name the file system refuses (too long) is not one."""
    try:
        return Path(path).is_dir()
    except OSError:
        return False


def _vlm_only() -> tuple[str, ...]:
    import dataclasses

    from longpack.option import option_of

    return tuple(
        f.name
        for f in dataclasses.fields(OnlineSimConfig)
        if (spec := option_of(f)) is not None and spec.help.startswith("With --vlm:")
    )


#: Settings read only with ``vlm`` (their help says so: "With --vlm: ..."); one given (not its default)
#: without ``vlm`` is refused, not ignored.
VLM_ONLY: tuple[str, ...] = _vlm_only()


@dataclass(frozen=True, kw_only=True)
class OnlineSimResult:
    """The simulation's report: ``rows`` (per buffer size: online and offline fill and packs, their ratio;
    with ``vlm`` the buffer's host memory too) and ``smallest_buffer_within_1pct``."""

    report: dict[str, Any]
    algorithm: str
    pad_seq_to_mult: int
    vlm: bool = False

    def to_dict(self) -> dict[str, Any]:
        return self.report
