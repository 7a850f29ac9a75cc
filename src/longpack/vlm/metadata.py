"""VLM sample metadata from a JSONL file: token counts, visual tokens and prepared-sequence memory, without
decoding a pixel (what ``longpack online-sim --vlm`` and packing plans read).

Each line is a sample: ``messages`` (or ShareGPT ``conversations``) with ``<image>`` placeholders or image
parts, and either ``images`` or image parts naming their file (relative paths, in the lists and in the parts
alike, resolve against the JSONL file's folder: :func:`with_media_paths`; only each file's header is read) or
``image_sizes`` (``[[width, height], ...]``, e.g. a metadata column exported from a dataset).

>>> import json, pathlib, tempfile
>>> from longpack.vlm.vision import VisionConfig
>>> from longpack.vlm.prepare import QwenVLPreparer, VLMConfig
>>> path = pathlib.Path(tempfile.mkdtemp()) / "vlm.jsonl"
>>> row = {"messages": [{"role": "user", "content": "<image>What is it?"}, {"role": "assistant", "content": "A cat."}],
...        "image_sizes": [[640, 480]]}
>>> _ = path.write_text(json.dumps(row) + "\\n")
>>> prep = QwenVLPreparer("qwen3", config=VLMConfig(vision=VisionConfig()))  # sizes only: no processor built
>>> table = read_vlm_metadata(path, prep)
>>> table.tokens.tolist(), table.visual_tokens.tolist(), table.keys
([421], [391], ['vlm.jsonl:1'])
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from longpack.topology import align_up
from longpack.vlm.chat import media_sources, normalize_conversation
from longpack.vlm.errors import REJECT_REASONS, SampleError, SampleRejected, VLMError, check_image_size
from longpack.vlm.prepare import QwenVLPreparer


@dataclass
class VLMMetadata:
    """Per-sample metadata of the accepted samples (in file order) and the refusals by reason."""

    keys: list[str]
    tokens: np.ndarray  # int64, tokens after image-pad expansion
    visual_tokens: np.ndarray  # int64
    images: np.ndarray  # int64, images per sample
    prepared_nbytes: np.ndarray  # int64, host bytes of the prepared sequence (pixel tensors included)
    rejected: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REJECT_REASONS, 0))
    examples: list[str] = field(default_factory=list)  # the first messages of refused samples
    skipped: list[dict[str, str]] = field(default_factory=list)  # every refused sample: {"key", "reason"}

    def summary(self) -> dict[str, Any]:
        """Counts and distributions, JSON-ready."""

        def q(a: np.ndarray, p: float) -> int:
            return int(np.percentile(a, p)) if len(a) else 0

        return {
            "samples": len(self.keys),
            "rejected": dict(self.rejected),
            "tokens_p50": q(self.tokens, 50),
            "tokens_p95": q(self.tokens, 95),
            "tokens_max": int(self.tokens.max()) if len(self.tokens) else 0,
            "visual_tokens_mean": round(float(self.visual_tokens.mean()), 1) if len(self.keys) else 0.0,
            "prepared_mib_mean": round(float(self.prepared_nbytes.mean()) / 2**20, 3)
            if len(self.keys)
            else 0.0,
            "prepared_mib_p95": round(q(self.prepared_nbytes, 95) / 2**20, 3),
            "prepared_mib_max": round(int(self.prepared_nbytes.max()) / 2**20, 3) if len(self.keys) else 0.0,
            "examples": self.examples[:5],
            "skipped": list(self.skipped),
        }


def _rows(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """The JSON objects of a VLM JSONL file (plain, or gzip-compressed: read by its magic bytes, whatever
    its name), with their ``NAME:LINE`` keys; a line that is not UTF-8 or not JSON is a :class:`VLMError`."""
    import gzip

    with open(path, "rb") as probe:
        compressed = probe.read(2) == b"\x1f\x8b"
    opened = gzip.open(path, "rt", encoding="utf-8") if compressed else open(path, encoding="utf-8")  # noqa: SIM115
    lineno = 0
    try:
        with opened as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                where = f"{path.name}:{lineno}"
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise VLMError(f"{path}:{lineno}: not valid JSON ({exc.msg}); fix the line") from None
                except RecursionError:
                    raise VLMError(f"{path}:{lineno}: JSON nested too deeply to read; fix the line") from None
                if not isinstance(row, dict):
                    raise VLMError(
                        f"{path}:{lineno}: a sample must be a JSON object, got {type(row).__name__}"
                    )
                yield where, row
    except UnicodeDecodeError as exc:
        raise VLMError(
            f"{path}:{lineno + 1}: not UTF-8 text (byte {exc.start} of the line); a VLM JSONL file is UTF-8 "
            "JSON Lines, plain or gzip-compressed"
        ) from None
    except (OSError, EOFError) as exc:  # a damaged gzip stream
        raise VLMError(f"{path}:{lineno + 1}: cannot be read ({exc}); is the file complete?") from None


def _resolved(value: Any, base: Path) -> Any:
    """A media source resolved against ``base``: a file name (relative ones joined to ``base``, absolute
    ones kept), a frame list of file names, anything else as it is."""
    if isinstance(value, str):
        return str(base / value)
    if isinstance(value, list):
        return [str(base / f) if isinstance(f, str) else f for f in value]
    return value


def with_media_paths(row: dict[str, Any], base: Path) -> dict[str, Any]:
    """A copy of a JSONL sample whose media file names are resolved against ``base``, the JSONL file's
    folder: one rule for every place a record names a file: the ``images`` / ``videos`` lists (a video as a
    file or a frame list of image files) and the ``image`` / ``video`` of content parts inside ``messages`` /
    ``conversation`` / ``conversations`` turns.

    >>> with_media_paths({"images": ["a.png"], "videos": [["f0.png", "f1.png"]]}, Path("/d"))["videos"]
    [['/d/f0.png', '/d/f1.png']]
    >>> part = {"type": "image", "image": "sub/b.png"}
    >>> with_media_paths({"messages": [{"role": "user", "content": [part]}]}, Path("/d"))["messages"][0]
    {'role': 'user', 'content': [{'type': 'image', 'image': '/d/sub/b.png'}]}
    """
    sample = dict(row)
    for name in ("images", "videos"):
        if isinstance(row.get(name), list):
            if name == "images":
                sample[name] = [str(base / p) if isinstance(p, str) else p for p in row[name]]
            else:
                sample[name] = [_resolved(v, base) for v in row[name]]
    for name, content_key in (
        ("messages", "content"),
        ("conversation", "content"),
        ("conversations", "value"),
    ):
        turns = row.get(name)
        if not isinstance(turns, list):
            continue
        resolved_turns = []
        for turn in turns:
            content = turn.get(content_key) if isinstance(turn, dict) else None
            if isinstance(content, list):
                parts = []
                for part in content:
                    if isinstance(part, dict):
                        part = dict(part)
                        for kind in ("image", "video"):
                            if part.get(kind) is not None:
                                part[kind] = _resolved(part[kind], base)
                    parts.append(part)
                turn = {**turn, content_key: parts}
            resolved_turns.append(turn)
        sample[name] = resolved_turns
    return sample


def vlm_samples(path: str | os.PathLike[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The samples of a VLM JSONL file in file order, as ``(key, sample)``: the key is ``NAME:LINE`` (as
    :func:`read_vlm_metadata` names them), media paths resolved beside the file (:func:`with_media_paths`)."""
    path = Path(path)
    if not path.is_file():
        raise VLMError(f"{path}: no such file (a JSONL of VLM samples)")
    for key, row in _rows(path):
        yield key, with_media_paths(row, path.parent)


def _image_sizes(sizes: object) -> list[tuple[int, int]]:
    """A row's ``image_sizes`` as whole-pixel ``(width, height)`` pairs, or the sample is refused."""
    if not isinstance(sizes, list) or not all(isinstance(s, list) and len(s) == 2 for s in sizes):
        raise VLMError(f"image_sizes must be [[width, height], ...], got {sizes!r:.60}")
    return [check_image_size(w, h) for w, h in sizes]


def read_vlm_metadata(
    path: str | os.PathLike[str],
    preparer: QwenVLPreparer,
    *,
    max_length: int | None = None,
    pad_to_multiple_of: int = 1,
) -> VLMMetadata:
    """Lengths and prepared memory of every sample of a VLM JSONL file; the preparer's limits
    (``max_images``, ``max_visual_tokens``) and ``max_length`` (aligned to ``pad_to_multiple_of``) refuse
    samples, counted by reason, as do image files whose header cannot be read."""
    path = Path(path)
    if not path.is_file():
        raise VLMError(f"{path}: no such file (a JSONL of VLM samples)")
    base = path.parent
    config = preparer.config
    keys: list[str] = []
    cols: dict[str, list[int]] = {"tokens": [], "visual": [], "images": [], "nbytes": []}
    empty = np.zeros(0, np.int64)
    out = VLMMetadata(keys, empty, empty, empty, empty)
    for key, row in _rows(path):
        sizes = row.get("image_sizes")
        sample = with_media_paths(row, base)
        try:
            if sizes is not None:
                sizes = _image_sizes(sizes)  # a VLMError is named by file and key below, once
                sample["images"] = [f"<image {i}>" for i in range(len(sizes))]
            try:  # the images the conversation places (parts with their own source and the list's)
                n_images = len(media_sources(normalize_conversation(sample))[0])
            except SampleError as exc:
                raise exc.named(key) from None
            config.refuse_images(key, n_images)
            length = preparer.length(
                sample,
                key=key,
                image_sizes=[(int(w), int(h)) for w, h in sizes] if sizes is not None else None,
            )
            config.refuse_visual_tokens(key, length.visual_tokens)
            if max_length is not None and align_up(length.tokens, pad_to_multiple_of) > max_length:
                raise SampleRejected(
                    key,
                    "too_long",
                    f"{length.tokens} tokens (aligned to {pad_to_multiple_of}) > {max_length}",
                )
        except SampleError as exc:  # SampleRejected, or a problem of this sample found without its key
            exc = exc.named(key)
            out.rejected[exc.reason] += 1
            out.skipped.append({"key": exc.key, "reason": exc.reason})
            if len(out.examples) < 20:
                out.examples.append(str(exc))
            continue
        except VLMError as exc:
            raise VLMError(f"{path}: {key}: {exc}") from None
        keys.append(key)
        cols["tokens"].append(length.tokens)
        cols["visual"].append(length.visual_tokens)
        cols["images"].append(n_images)
        cols["nbytes"].append(length.prepared_nbytes)
    out.tokens = np.asarray(cols["tokens"], dtype=np.int64)
    out.visual_tokens = np.asarray(cols["visual"], dtype=np.int64)
    out.images = np.asarray(cols["images"], dtype=np.int64)
    out.prepared_nbytes = np.asarray(cols["nbytes"], dtype=np.int64)
    return out
