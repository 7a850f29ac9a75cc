"""VLM conversations: messages with image/video parts -> rendered ids with one pad token per media item.

Accepted forms (those Megatron-Bridge's Qwen-VL paths read):

- ``{"messages": [{"role", "content"}, ...]}`` or ShareGPT ``{"conversations": [{"from", "value"}, ...]}``;
- ``content`` as a string with ``<image>`` / ``<video>`` placeholders (Energon ChatML), filled in order
  from the sample's ``images`` / ``videos`` lists, or as a list of parts ``{"type": "text", "text"}``,
  ``{"type": "image", "image": <source>}``, ``{"type": "video", "video": <frames>}``.

Rendering (``chat_template="qwen2_vl"``, the default) is the Qwen2-VL / Qwen2.5-VL Instruct chat template:
a default system turn ``You are a helpful assistant.`` when the first message is not a system one, ChatML
turns, an image part as ``<|vision_start|><|image_pad|><|vision_end|>`` and a video part as
``<|vision_start|><|video_pad|><|vision_end|>``, parts joined without separators. The turns go through
``longpack.text``'s ChatML renderer, so assistant ownership (and so the loss mask) is the text layer's.
``chat_template="tokenizer"`` uses the tokenizer's own template instead (an HF tokenizer folder's jinja
template receives the parts; the built-in ``qwen3`` renders the Qwen3 text template). ``media_first=True``
moves media parts before the text of each turn (Bridge's Energon Qwen-VL encoder does this).

>>> msgs = normalize_conversation({"messages": [{"role": "user", "content": "Look <image> here"},
...                                              {"role": "assistant", "content": "A cat."}]},
...                               images=["img0"])
>>> [(m["role"], m["content"]) for m in msgs]  # doctest: +NORMALIZE_WHITESPACE
[('user', [{'type': 'text', 'text': 'Look'}, {'type': 'image', 'image': 'img0'}, {'type': 'text', 'text': 'here'}]),
 ('assistant', [{'type': 'text', 'text': 'A cat.'}])]
>>> render_pieces(msgs)[0]
('<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n<|im_start|>user\\nLook<|vision_start|><|image_pad|><|vision_end|>here<|im_end|>\\n<|im_start|>assistant\\n', -1)
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from longpack.text.tokenizers import Piece, Tokenizer, chatml_pieces
from longpack.vlm.errors import SampleError, VLMError

CHAT_TEMPLATES: tuple[str, ...] = ("qwen2_vl", "tokenizer")
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."
IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
VIDEO_PLACEHOLDER = "<|vision_start|><|video_pad|><|vision_end|>"
_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "system": "system",
    "tool": "tool",
}
_PLACEHOLDER_RE = re.compile(r"(<image>|<video>)")

Part = dict[str, Any]
VLMMessage = dict[str, Any]


def _turns(sample: Mapping[str, Any]) -> tuple[list[Any], bool]:
    for key, sharegpt in (("messages", False), ("conversation", False), ("conversations", True)):
        if key in sample:
            value = sample[key]
            if isinstance(value, str | bytes):
                try:
                    value = json.loads(value)
                except ValueError as exc:
                    raise SampleError("malformed", f"key {key!r} is a string but not JSON ({exc})") from None
            if isinstance(value, Mapping):  # {"conversations": [...]} nested (Energon ChatML JSON)
                return _turns(value)
            if not isinstance(value, list):
                raise SampleError(
                    "malformed", f"key {key!r} must be a list of turns, got {type(value).__name__}"
                )
            if value and isinstance(value[0], Mapping) and "from" in value[0]:
                sharegpt = True
            return value, sharegpt
    raise SampleError(
        "malformed", f"a VLM sample needs 'messages' or 'conversations', has keys {sorted(sample)}"
    )


def normalize_conversation(
    sample: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    *,
    images: Sequence[Any] | None = None,
    videos: Sequence[Any] | None = None,
    media_first: bool = False,
) -> list[VLMMessage]:
    """The conversation as ``[{"role", "content": [parts]}]`` with every media part holding its source.

    ``images`` / ``videos`` (or the sample's ``images`` / ``videos`` keys) fill ``<image>`` / ``<video>``
    placeholders and media parts without a source, in order; parts that name their own source
    (``{"type": "image", "image": PATH}``) keep it, and a list that repeats exactly those sources (a dataset's
    media column beside content parts) places nothing twice. A count mismatch is a ``SampleError`` (reason
    ``placeholder_mismatch``) saying which of these it met; a conversation that cannot be read one with
    reason ``malformed``.

    >>> part = {"role": "user", "content": [{"type": "image", "image": "a.png"}, {"type": "text", "text": "?"}]}
    >>> media_sources(normalize_conversation({"messages": [part], "images": ["a.png"]}))
    (['a.png'], [])
    """
    if isinstance(sample, Mapping):
        turns, sharegpt = _turns(sample)
        if images is None:
            images = sample.get("images")
        if videos is None:
            videos = sample.get("videos")
    else:
        turns, sharegpt = (
            list(sample),
            bool(sample) and isinstance(sample[0], Mapping) and "from" in sample[0],
        )
    pools = {"image": list(images or []), "video": list(videos or [])}
    taken = {"image": 0, "video": 0}
    own: dict[str, list[Any]] = {"image": [], "video": []}  # sources named inside the parts

    def media(kind: str, part: Mapping[str, Any] | None) -> Part:
        if part is not None and part.get(kind) is not None:
            own[kind].append(part[kind])
            return {"type": kind, kind: part[kind]}
        if taken[kind] >= len(pools[kind]):
            raise SampleError(
                "placeholder_mismatch",
                f"the conversation has more {kind} placeholders / {kind} parts without a source than the "
                f"{len(pools[kind])} {kind}s of the sample's {kind + 's'!r} list"
                + (f" ({len(own[kind])} more {kind} parts name their own source)" if own[kind] else ""),
            )
        source = pools[kind][taken[kind]]
        taken[kind] += 1
        return {"type": kind, kind: source}

    out: list[VLMMessage] = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, Mapping):
            raise SampleError("malformed", f"turn {i} must be an object, got {type(turn).__name__}")
        role_raw = turn.get("from") if sharegpt else turn.get("role")
        role = _ROLES.get(str(role_raw).lower()) if role_raw is not None else None
        if role is None:
            raise SampleError(
                "malformed", f"turn {i}: unknown role {role_raw!r}; use one of {sorted(_ROLES)}"
            )
        content = turn.get("value") if sharegpt else turn.get("content")
        parts: list[Part] = []
        if content is None:
            pass
        elif isinstance(content, str):
            for piece in _PLACEHOLDER_RE.split(content):
                if piece == "<image>":
                    parts.append(media("image", None))
                elif piece == "<video>":
                    parts.append(media("video", None))
                elif piece.strip(" "):
                    parts.append({"type": "text", "text": piece.strip(" ")})
        elif isinstance(content, list):
            for j, part in enumerate(content):
                if isinstance(part, str):
                    parts.append({"type": "text", "text": part})
                    continue
                if not isinstance(part, Mapping):
                    raise SampleError(
                        "malformed", f"turn {i} part {j}: expected an object, got {type(part).__name__}"
                    )
                kind = part.get("type")
                if kind == "text" or (kind is None and "text" in part):
                    parts.append({"type": "text", "text": str(part.get("text", ""))})
                elif kind in ("image", "video") or (kind is None and ("image" in part or "video" in part)):
                    parts.append(media(kind or ("image" if "image" in part else "video"), part))
                else:
                    raise SampleError(
                        "malformed", f"turn {i} part {j}: unknown part type {kind!r} (text, image, video)"
                    )
        else:
            raise SampleError(
                "malformed",
                f"turn {i}: content must be a string or a list of parts, got {type(content).__name__}",
            )
        if media_first:
            parts = [p for p in parts if p["type"] != "text"] + [p for p in parts if p["type"] == "text"]
        out.append({"role": role, "content": parts})
    for kind in ("image", "video"):
        if taken[kind] == len(pools[kind]):
            continue
        if taken[kind] == 0 and _same_sources(own[kind], pools[kind]):
            continue  # the list repeats the parts' own sources (a dataset's media column): each placed once
        if own[kind]:
            raise SampleError(
                "placeholder_mismatch",
                f"the sample's {kind + 's'!r} list has {len(pools[kind])} {kind}s but the conversation takes "
                f"{taken[kind]} of them: {len(own[kind])} {kind} parts name their own source and the list is "
                f"not those same {kind}s; give each {kind} once: in its part "
                f'({{"type": "{kind}", "{kind}": ...}}) or in the list with a source-less part / <{kind}> '
                "placeholder",
            )
        raise SampleError(
            "placeholder_mismatch",
            f"{len(pools[kind])} {kind}s given but the conversation places {taken[kind]}; add a <{kind}> "
            "placeholder for each or drop the extra ones",
        )
    if not out:
        raise SampleError("malformed", "the conversation is empty")
    return out


def _same_sources(parts: Sequence[Any], listed: Sequence[Any]) -> bool:
    """Whether a sample's media list names exactly the sources its parts name, in order (paths and bytes
    compared by value, other objects by identity)."""

    def same(a: Any, b: Any) -> bool:
        if a is b:
            return True
        return isinstance(a, str | bytes) and type(a) is type(b) and a == b

    return len(parts) == len(listed) and all(same(a, b) for a, b in zip(parts, listed, strict=True))


def media_sources(messages: Sequence[VLMMessage]) -> tuple[list[Any], list[Any]]:
    """``(images, videos)`` in conversation order.

    >>> media_sources([{"role": "user", "content": [{"type": "image", "image": "a"}, {"type": "text", "text": "x"}]}])
    (['a'], [])
    """
    images: list[Any] = []
    videos: list[Any] = []
    for m in messages:
        for part in m["content"]:
            if part["type"] == "image":
                images.append(part["image"])
            elif part["type"] == "video":
                videos.append(part["video"])
    return images, videos


def _flat_text(parts: Sequence[Part]) -> str:
    out = []
    for part in parts:
        if part["type"] == "text":
            out.append(part["text"])
        elif part["type"] == "image":
            out.append(IMAGE_PLACEHOLDER)
        else:
            out.append(VIDEO_PLACEHOLDER)
    return "".join(out)


def render_pieces(messages: Sequence[VLMMessage]) -> list[Piece]:
    """The Qwen2-VL Instruct template's text as ``longpack.text`` pieces (assistant turns own their content
    through ``<|im_end|>``)."""
    flat: list[dict[str, Any]] = [{"role": m["role"], "content": _flat_text(m["content"])} for m in messages]
    if not flat or flat[0]["role"] != "system":
        flat.insert(0, {"role": "system", "content": DEFAULT_SYSTEM_PROMPT})
    return chatml_pieces(flat, qwen3_thinking=False)


def render_ids(
    messages: Sequence[VLMMessage], tokenizer: Tokenizer, *, chat_template: str = "qwen2_vl"
) -> tuple[list[int], list[tuple[int, int, int]]]:
    """Ids of the rendered conversation (one pad token per media item) and the assistant token ranges
    ``(first, stop, turn)``."""
    if chat_template == "qwen2_vl":
        return tokenizer.encode_pieces(render_pieces(messages))
    if chat_template == "tokenizer":
        if getattr(tokenizer, "kind", None) == "hf":
            as_parts = [
                {
                    "role": m["role"],
                    "content": [{"type": p["type"], "text": p.get("text", "")} for p in m["content"]],
                }
                for m in messages
            ]
            return tokenizer.chat_spans(as_parts)
        return tokenizer.chat_spans(
            [{"role": m["role"], "content": _flat_text(m["content"])} for m in messages]
        )
    raise VLMError(f"chat_template={chat_template!r} is not one of {CHAT_TEMPLATES}")
