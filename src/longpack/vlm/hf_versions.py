"""Which transformers the VLM preparers follow: the supported range and what differs inside it.

longpack restates transformers' processors (resize rules, video sampling, the text a processor writes for an
image or a video), so a prepared sequence equals the processor's only for the versions whose source it was
checked against. The range is :data:`TRANSFORMERS_SPEC` (``pyproject.toml``'s ``vlm`` extra states the same;
``tests/vlm/test_vlm_hf_versions.py`` checks them equal). Inside it one behaviour differs:

- **Qwen3-VL video text.** The Qwen3-VL chat template writes ``<|vision_start|><|video_pad|><|vision_end|>``
  for a video, and ``Qwen3VLProcessor.replace_video_token`` replaces the pad with ``<t seconds>`` and
  ``<|vision_start|>`` pads ``<|vision_end|>`` per temporal grid. transformers 5.24 keeps the template's outer
  pair around them; 5.25 (``Qwen3VLProcessor.get_text_with_replacements``) collapses the outer
  ``<|vision_start|><|video_pad|><|vision_end|>`` into a bare ``<|video_pad|>`` first, so each video is two
  tokens shorter.

The version is the installed transformers' (``VLMConfig.transformers_version`` names another: the one the
training job runs, when packing runs elsewhere). For the installed one the Qwen3-VL behaviour is read from the
processor itself (its ``get_text_with_replacements`` run on the template's video text), the version table
being the fallback. A version outside the range is refused with the range.

>>> behaviour("5.24.0").qwen3_video_outer_wrapper, behaviour("5.25.1").qwen3_video_outer_wrapper
(True, False)
>>> behaviour("5.26.0")
Traceback (most recent call last):
...
longpack.vlm.errors.VLMError: transformers 5.26.0 (VLMConfig.transformers_version) is outside the range longpack's VLM preparation was checked against (transformers>=5.24,<5.26): its processors may write other tokens or pixels; install a version in the range (pip install 'transformers>=5.24,<5.26') or name one with VLMConfig(transformers_version=...)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from longpack.vlm.errors import VLMError

#: The transformers versions longpack's VLM preparation follows: ``[low, high)`` as ``(major, minor)``.
TRANSFORMERS_RANGE: tuple[tuple[int, int], tuple[int, int]] = ((5, 24), (5, 26))
TRANSFORMERS_SPEC = f">={TRANSFORMERS_RANGE[0][0]}.{TRANSFORMERS_RANGE[0][1]},<{TRANSFORMERS_RANGE[1][0]}.{TRANSFORMERS_RANGE[1][1]}"
#: The first version whose ``Qwen3VLProcessor`` drops the template's outer video wrapper.
QWEN3_VIDEO_WRAPPER_DROPPED: tuple[int, int] = (5, 25)
QWEN3_VIDEO_WRAPPER = "<|vision_start|><|video_pad|><|vision_end|>"


@dataclass(frozen=True)
class TransformersBehaviour:
    """What a transformers version's processors do where supported versions differ."""

    version: str
    source: str  # "installed" or "VLMConfig.transformers_version"
    qwen3_video_outer_wrapper: bool  # the template's outer <|vision_start|>/<|vision_end|> kept (5.24)


def parse_version(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a version string.

    >>> parse_version("5.25.0.dev0"), parse_version("4.57.1")
    ((5, 25), (4, 57))
    """
    match = re.match(r"\s*v?(\d+)\.(\d+)", str(version))
    if match is None:
        raise VLMError(f"transformers version {version!r} is not a version number like '5.24.0'")
    return int(match.group(1)), int(match.group(2))


def installed_transformers_version() -> str | None:
    """The installed transformers' version (package metadata; nothing imported), ``None`` when absent."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("transformers")
    except PackageNotFoundError:
        return None


def _in_range(version: str, source: str) -> tuple[int, int]:
    parsed = parse_version(version)
    low, high = TRANSFORMERS_RANGE
    if not low <= parsed < high:
        raise VLMError(
            f"transformers {version} ({source}) is outside the range longpack's VLM preparation was checked "
            f"against (transformers{TRANSFORMERS_SPEC}): its processors may write other tokens or pixels; "
            f"install a version in the range (pip install 'transformers{TRANSFORMERS_SPEC}') or name one with "
            "VLMConfig(transformers_version=...)"
        )
    return parsed


def behaviour(version: str, *, source: str = "VLMConfig.transformers_version") -> TransformersBehaviour:
    """The behaviour of transformers ``version`` from the version table (a version outside the range refused)."""
    parsed = _in_range(version, source)
    return TransformersBehaviour(version, source, parsed < QWEN3_VIDEO_WRAPPER_DROPPED)


def probe_qwen3_video_outer_wrapper() -> bool | None:
    """Whether the installed ``Qwen3VLProcessor`` keeps the template's outer video wrapper, read from its own
    ``get_text_with_replacements`` run on ``<|vision_start|><|video_pad|><|vision_end|>`` with one
    replacement (no tokenizer, no weights); ``None`` when it cannot be run."""
    try:
        from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

        owner = object.__new__(Qwen3VLProcessor)
        for name, token in (
            ("image_token", "<|image_pad|>"),
            ("video_token", "<|video_pad|>"),
            ("vision_start_token", "<|vision_start|>"),
            ("vision_end_token", "<|vision_end|>"),
        ):
            owner.__dict__[name] = token
        text, _ = owner.get_text_with_replacements([QWEN3_VIDEO_WRAPPER], [], ["<frames>"], [])
    except Exception:  # an import or API this probe does not know: the version table decides
        return None
    if text == ["<|vision_start|><frames><|vision_end|>"]:
        return True
    if text == ["<frames>"]:
        return False
    return None


@lru_cache(maxsize=1)
def _installed(version: str) -> TransformersBehaviour:
    found = behaviour(version, source="installed")
    probed = probe_qwen3_video_outer_wrapper()
    if probed is not None and probed != found.qwen3_video_outer_wrapper:
        found = TransformersBehaviour(version, "installed (Qwen3VLProcessor's behaviour)", probed)
    return found


def checked_version(version: str | None = None) -> str | None:
    """``version`` or the installed transformers' version (``None`` if neither), refused outside the range;
    reads package metadata only."""
    if version is not None:
        _in_range(version, "VLMConfig.transformers_version")
        return version
    installed = installed_transformers_version()
    if installed is not None:
        _in_range(installed, "installed")
    return installed


def transformers_behaviour(version: str | None = None) -> TransformersBehaviour | None:
    """The behaviour of ``version`` (a :class:`VLMConfig` setting) or of the installed transformers (``None``
    when ``version`` is ``None`` and none is installed); a version outside the range raises
    :class:`~longpack.vlm.errors.VLMError` naming the range."""
    if version is not None:
        return behaviour(version)
    installed = installed_transformers_version()
    return None if installed is None else _installed(installed)


def require_behaviour(found: TransformersBehaviour | None, purpose: str) -> TransformersBehaviour:
    """``found``, or a :class:`VLMError` saying that ``purpose`` depends on the transformers version."""
    if found is None:
        raise VLMError(
            f"{purpose} depends on the transformers version and transformers is not installed; install it "
            f"(pip install 'transformers{TRANSFORMERS_SPEC}') or name the training job's version with "
            "VLMConfig(transformers_version=...)"
        )
    return found
