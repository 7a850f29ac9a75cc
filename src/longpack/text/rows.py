"""One row -> one stored sample (``input_ids``, unshifted ``loss_mask``), as Megatron-Bridge tokenizes.

Formats:

- ``prompt_completion``: Bridge's explicit prompt-completion path (a): strip ASCII spaces, render the prompt
  template, tokenize prompt and separator+completion separately, append EOS; loss on completion + EOS
  (``completion``) or everything (``full``). No BOS.
- ``chat`` (``messages``: role/content) and ``sharegpt`` (``conversations``: from/value, optional top-level
  ``system``): the tokenizer's chat template; loss on ``assistant`` turns, the ``last_turn`` only, or ``full``.
  EOS comes from the template; nothing is appended.
- ``pretokenized``: ``input_ids`` (+ optional ``loss_mask`` aligned with them, default all ones), taken as is.

Every mode zeroes the loss on the tokenizer's "skipped" tokens (e.g. ``<|im_start|>``). A row that gives
fewer than 2 tokens is malformed (Bridge raises ``ValueError`` for it): ``InputError`` unless
``skip_malformed``, which skips and records it.

Example::

    >>> from longpack.text.tokenizers import load_tokenizer
    >>> ids, mask = row_to_sample({"prompt": "Hi ", "completion": "yo"}, "prompt_completion",
    ...                           TextConfig(), load_tokenizer("bytes"))
    >>> ids, mask
    ([72, 105, 121, 111, 258], [0, 0, 1, 1, 1])
"""

from __future__ import annotations

import json
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from longpack.text.errors import RowError
from longpack.text.tokenizers import Message, Tokenizer

FORMATS = ("auto", "prompt_completion", "chat", "sharegpt", "pretokenized")
SHAREGPT_KEY = "conversations"
_SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "model": "assistant",
    "system": "system",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
}
_CHAT_ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True, kw_only=True)
class TextConfig:
    """How rows become samples. Validated on construction.

    >>> TextConfig(chat_loss="last_turn").chat_loss
    'last_turn'
    >>> TextConfig(format="csv")
    Traceback (most recent call last):
    ...
    ValueError: TextConfig.format='csv' is not one of auto, prompt_completion, chat, sharegpt, pretokenized
    """

    format: str = "auto"
    prompt_key: str = "prompt"
    completion_key: str = "completion"
    prompt_template: str = "{prompt}"
    separator: str = ""
    prompt_completion_loss: str = "completion"
    chat_loss: str = "assistant"
    messages_key: str = "messages"
    skip_malformed: bool = False

    def __post_init__(self) -> None:
        for field, value, allowed in (
            ("format", self.format, FORMATS),
            ("prompt_completion_loss", self.prompt_completion_loss, ("completion", "full")),
            ("chat_loss", self.chat_loss, ("assistant", "last_turn", "full")),
        ):
            if value not in allowed:
                raise ValueError(f"TextConfig.{field}={value!r} is not one of {', '.join(allowed)}")
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(self.prompt_template) if f is not None]
        except ValueError as e:
            raise ValueError(
                f"TextConfig.prompt_template={self.prompt_template!r} is not a format string ({e}); "
                "write placeholders as {prompt} and literal braces as {{ }}"
            ) from e
        if any(f == "" or not f.isidentifier() for f in fields):
            raise ValueError(
                f"TextConfig.prompt_template={self.prompt_template!r}: placeholders must be row keys such as "
                "{prompt}; write literal braces as {{ }}"
            )


def detect_format(rows: Sequence[Mapping[str, Any]], config: TextConfig) -> str:
    """The most common format among the first rows (ties: the earliest). Rows whose keys fit no format are
    ignored unless no row fits. Per row: ``input_ids`` -> pretokenized, messages key -> chat,
    ``conversations`` -> sharegpt, prompt and completion keys -> prompt_completion.

        >>> detect_format([{"messages": []}, {"prompt": "p", "completion": "c"}, {"messages": []}], TextConfig())
        'chat'
        >>> detect_format([{"question": "q"}], TextConfig())
        Traceback (most recent call last):
        ...
        longpack.text.errors.RowError: cannot detect the format from keys ['question']: prompt_completion needs 'prompt' and 'completion' (set the keys), chat needs 'messages', sharegpt needs 'conversations', pretokenized needs 'input_ids'
    """
    found: list[str] = []
    for row in rows:
        if "input_ids" in row:
            found.append("pretokenized")
        elif config.messages_key in row:
            found.append("chat")
        elif SHAREGPT_KEY in row:
            found.append("sharegpt")
        elif config.prompt_key in row and config.completion_key in row:
            found.append("prompt_completion")
    if not found:
        keys = sorted(rows[0]) if rows else []
        raise RowError(
            f"cannot detect the format from keys {keys}: prompt_completion needs "
            f"{config.prompt_key!r} and {config.completion_key!r} (set the keys), chat needs "
            f"{config.messages_key!r}, sharegpt needs {SHAREGPT_KEY!r}, pretokenized needs 'input_ids'"
        )
    return max(dict.fromkeys(found), key=found.count)


def _get(row: Mapping[str, Any], key: str, kind: type | tuple[type, ...], what: str) -> Any:
    if key not in row:
        raise RowError(f"missing key {key!r} ({what}); the row has keys {sorted(row)}")
    value = row[key]
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise RowError(f"key {key!r} must be a {names}, got {type(value).__name__}")
    return value


class _TemplateFields(dict):  # type: ignore[type-arg]
    def __missing__(self, key: str) -> str:
        raise RowError(
            f"prompt_template needs {{{key}}} but the row has keys {sorted(k for k in self if k != 'prompt')}"
        )


def _content_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI-style parts: keep the text parts
        texts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part, str):
                texts.append(part)
            else:
                raise RowError(f"{where}: only text content parts are supported, got {part!r:.80}")
        return "".join(texts)
    raise RowError(f"{where}: content must be a string, got {type(content).__name__}")


def _turns(row: Mapping[str, Any], key: str, what: str) -> list[Any]:
    value = row.get(key)
    if isinstance(value, str):  # some datasets (often Parquet) store the conversation as a JSON string
        try:
            value = json.loads(value)
        except ValueError as e:
            raise RowError(f"key {key!r} is a string but not a JSON list of turns ({e})") from e
        if isinstance(value, list):
            return value
    return list(_get(row, key, (list, tuple, np.ndarray), what))


def chat_messages(row: Mapping[str, Any], fmt: str, config: TextConfig) -> list[Message]:
    """The row's conversation as ``[{"role", "content"}, ...]`` (ShareGPT roles mapped, system prepended).

    >>> chat_messages({"system": "S", "conversations": [{"from": "human", "value": "Q"}]}, "sharegpt", TextConfig())
    [{'role': 'system', 'content': 'S'}, {'role': 'user', 'content': 'Q'}]
    """
    out: list[Message] = []
    if fmt == "sharegpt":
        turns = _turns(row, SHAREGPT_KEY, "ShareGPT conversation")
        system = row.get("system")
        if system is not None and not isinstance(system, str):
            raise RowError(f"key 'system' must be a string, got {type(system).__name__}")
        if system:
            out.append({"role": "system", "content": system})
        for i, turn in enumerate(turns):
            where = f"{SHAREGPT_KEY}[{i}]"
            if not isinstance(turn, Mapping) or "from" not in turn or "value" not in turn:
                keys = sorted(turn) if isinstance(turn, Mapping) else type(turn).__name__
                raise RowError(f"{where} needs keys 'from' and 'value', has {keys}")
            role = _SHAREGPT_ROLES.get(str(turn["from"]).lower())
            if role is None:
                raise RowError(
                    f"{where}: unknown 'from' {turn['from']!r}; use one of {sorted(_SHAREGPT_ROLES)}"
                )
            out.append({"role": role, "content": _content_text(turn["value"], where)})
    else:
        key = config.messages_key
        turns = _turns(row, key, "chat messages")
        for i, m in enumerate(turns):
            where = f"{key}[{i}]"
            if not isinstance(m, Mapping) or "role" not in m:
                keys = sorted(m) if isinstance(m, Mapping) else type(m).__name__
                raise RowError(f"{where} needs keys 'role' and 'content', has {keys}")
            if m["role"] not in _CHAT_ROLES:
                raise RowError(f"{where}: unknown role {m['role']!r}; use one of {', '.join(_CHAT_ROLES)}")
            msg: dict[str, Any] = {"role": m["role"], "content": _content_text(m.get("content"), where)}
            if isinstance(m.get("reasoning_content"), str):
                msg["reasoning_content"] = m["reasoning_content"]
            if m.get("tool_calls"):  # rendered by HF templates that support them; refused by the built-ins
                msg["tool_calls"] = m["tool_calls"]
            out.append(msg)
    if not out:
        raise RowError("the conversation is empty")
    return out


def _int_list(value: Any, key: str) -> list[int]:
    if not isinstance(value, list | tuple | np.ndarray):
        raise RowError(f"key {key!r} must be a list of integers, got {type(value).__name__}")
    if not all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in value):
        if key == "loss_mask" and all(isinstance(v, bool | np.bool_) for v in value):
            return [int(v) for v in value]
        bad = next(v for v in value if not (isinstance(v, int | np.integer) and not isinstance(v, bool)))
        raise RowError(f"key {key!r} must hold integers, found {bad!r}")
    return [int(v) for v in value]


def row_to_sample(row: Any, fmt: str, config: TextConfig, tok: Tokenizer) -> tuple[list[int], list[int]]:
    """``(input_ids, loss_mask)`` of one row as lists; ``RowError`` when the row is malformed."""
    ids, mask = sample_from_row(row, fmt, config, tok)
    return ids, list(mask)


def sample_from_row(
    row: Any, fmt: str, config: TextConfig, tok: Tokenizer
) -> tuple[list[int], list[int] | bytearray]:
    """``row_to_sample`` with the mask as a list or a bytearray of 0/1 (chat), whichever is cheaper."""
    if not isinstance(row, Mapping):
        raise RowError(f"a row must be a JSON object, got {type(row).__name__}")
    if fmt == "prompt_completion":
        prompt = _get(row, config.prompt_key, str, "prompt").strip(" ")
        completion = _get(row, config.completion_key, str, "completion").strip(" ")
        if config.prompt_template == "{prompt}":
            prompt_text = prompt
        else:
            fields = _TemplateFields({k: v for k, v in row.items() if isinstance(k, str)})
            fields["prompt"] = fields[config.prompt_key] = prompt
            prompt_text = config.prompt_template.format_map(fields)
        sep = config.separator
        if sep.startswith(" ") and not tok.space_sensitive:
            sep = sep[1:]  # Bridge drops one leading space for tokenizers that are not space-sensitive
        context = tok.encode(prompt_text) if prompt_text else []
        answer_text = sep + completion
        answer = tok.encode(answer_text) if answer_text else []
        ids = [*context, *answer, tok.eos_id]
        if config.prompt_completion_loss == "full":
            mask = [1] * len(ids)
        else:
            mask = [0] * len(context) + [1] * (len(answer) + 1)
    elif fmt in ("chat", "sharegpt"):
        messages = chat_messages(row, fmt, config)
        if config.chat_loss != "full" and not any(m["role"] == "assistant" for m in messages):
            raise RowError(
                f"the conversation has no assistant message, so chat_loss={config.chat_loss!r} trains on nothing"
            )
        ids, spans = tok.chat_spans(messages)
        n = len(ids)
        if n < 2:
            raise RowError(f"the sample has {n} token(s); a stored sample needs at least 2")
        skipped = tok.skipped_id_set
        if config.chat_loss == "full":
            full = np.ones(n, dtype=np.uint8)
            if skipped:
                full[np.isin(np.array(ids), tok.skipped_ids)] = 0
            return ids, bytearray(full.tobytes())
        if config.chat_loss == "last_turn" and spans:
            last = max(t for _, _, t in spans)
            spans = [s for s in spans if s[2] == last]
        chat_mask = bytearray(n)
        for i, j, _ in spans:
            chat_mask[i:j] = b"\x01" * (j - i)
            if skipped and not skipped.isdisjoint(ids[i:j]):
                for k in range(i, j):
                    if ids[k] in skipped:
                        chat_mask[k] = 0
        return ids, chat_mask
    elif fmt == "pretokenized":
        if "input_ids" not in row:
            raise RowError(f"missing key 'input_ids' (pretokenized tokens); the row has keys {sorted(row)}")
        ids = _int_list(row["input_ids"], "input_ids")
        if "loss_mask" in row and row["loss_mask"] is not None:
            mask = _int_list(row["loss_mask"], "loss_mask")
            if len(mask) != len(ids):
                raise RowError(
                    f"loss_mask has {len(mask)} entries but input_ids has {len(ids)}; they must align"
                )
            if any(v not in (0, 1) for v in mask):
                raise RowError(f"loss_mask must hold 0/1, found {next(v for v in mask if v not in (0, 1))}")
        else:
            mask = [1] * len(ids)
        if ids and (min(ids) < 0 or max(ids) >= tok.vocab_size):
            bad = next(v for v in ids if v < 0 or v >= tok.vocab_size)
            raise RowError(f"input_ids holds {bad}, outside the tokenizer's vocabulary [0, {tok.vocab_size})")
        if len(ids) < 2:
            raise RowError(f"the sample has {len(ids)} token(s); a stored sample needs at least 2")
        return ids, mask
    else:
        raise ValueError(f"unknown format {fmt!r}")
    if len(ids) < 2:
        raise RowError(f"the sample has {len(ids)} token(s); a stored sample needs at least 2")
    skipped = tok.skipped_id_set
    if skipped and not skipped.isdisjoint(ids):
        mask = [0 if i in skipped else m for i, m in zip(ids, mask, strict=True)]
    return ids, mask
