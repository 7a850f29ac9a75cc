"""One row -> one stored sample (``input_ids``, unshifted ``loss_mask``), as Megatron-Bridge tokenizes.

Formats:

- ``prompt_completion``: Bridge's explicit prompt-completion path (a): strip ASCII spaces, render the prompt
  template, tokenize prompt and separator+completion separately, append EOS; loss on completion + EOS
  (``completion``) or everything (``full``). No BOS.
- ``chat`` (``messages``: role/content, OpenAI ``tool_calls`` and ``tool`` results) and ``sharegpt``
  (``conversations``: from/value, optional top-level ``system``; LLaMA-Factory's ``function_call`` and
  ``observation`` turns): the tokenizer's chat template, with the row's tool definitions (``tools`` column,
  or ``TextConfig.tools_key``) passed to it; loss on ``assistant`` turns (their tool calls included), the
  ``last_turn`` only, or ``full``. Tool results sit outside assistant turns, so ``assistant`` and
  ``last_turn`` never train on them. EOS comes from the template; nothing is appended.
- ``pretokenized``: ``input_ids`` (+ optional ``loss_mask`` aligned with them, default all ones), taken as is.
- ``text``: one document per row (``text_key``, default ``text``), loss on every token, EOS appended with
  ``append_eod`` (:mod:`longpack.text.documents`): pretraining data.

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
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from longpack import choices
from longpack.errors import ConfigError
from longpack.option import check_choices, option, unescape
from longpack.text.errors import RowError
from longpack.text.tokenizers import Message, Tokenizer, Tools

FORMATS = choices.TEXT_FORMATS
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
    "function_call": "assistant",  # LLaMA-Factory: an assistant turn whose value is the call(s) as JSON
}
_CHAT_ROLES = ("system", "user", "assistant", "tool")
# Role aliases in ``messages`` rows: OpenAI's legacy function results.
_CHAT_ROLE_ALIASES = {"function": "tool"}
# Message keys passed on to chat templates; any other key of a message is ignored (and counted).
MESSAGE_KEYS = ("role", "content", "reasoning_content", "tool_calls", "name", "tool_call_id")


@dataclass(frozen=True, kw_only=True)
class TextConfig:
    """How rows become samples. Validated on construction.

    >>> TextConfig(chat_loss="last_turn").chat_loss
    'last_turn'
    >>> TextConfig(format="csv")
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: text.format must be one of auto, prompt_completion, chat, sharegpt, pretokenized, text, got 'csv'

    ``tools_key`` names the column holding a row's tool definitions (a list of OpenAI-style tool objects, or
    a JSON string of one), passed to the chat template as ``tools``.
    """

    format: str = option(
        choices.AUTO_FORMAT, help="How rows are read (auto: detected per file).", choices=FORMATS
    )
    prompt_key: str = option("prompt", help="Column of the prompt (prompt_completion).")
    completion_key: str = option("completion", help="Column of the completion (prompt_completion).")
    prompt_template: str = option(
        "{prompt}",
        help=r"Prompt format with {prompt} and other row keys; \n, \t, \r and \\ are read as escapes.",
        parse=unescape,
    )
    separator: str = option(
        "", help=r"Text between prompt and completion; \n, \t, \r, \\ escapes.", parse=unescape
    )
    prompt_completion_loss: str = option(
        choices.COMPLETION_LOSS, help="Tokens that train.", choices=choices.PROMPT_COMPLETION_LOSSES
    )
    chat_loss: str = option(
        choices.ASSISTANT_LOSS, help="Assistant turns that train.", choices=choices.CHAT_LOSSES
    )
    messages_key: str = option("messages", help="Column of the messages (chat).")
    tools_key: str = option("tools", help="Column with each row's tool definitions (chat, sharegpt).")
    skip_malformed: bool = option(False, help="Skip and count malformed rows.")
    #: Fewest tokens a sample may have: 2 (a stored sample of S tokens trains on S - 1 positions, so one
    #: token trains on nothing) or 1, which Megatron-Bridge's own prepare step keeps (``--compat``).
    min_tokens: int = 2
    #: ``format="text"``: the column holding a document's text, and whether EOS ends every document (as
    #: Megatron-LM's ``preprocess_data.py --append-eod``).
    text_key: str = option("text", help="Column with each document's text (--format text).")
    append_eod: bool = option(
        True,
        help="--format text: end every document with the tokenizer's EOS (Megatron's --append-eod).",
        negative="--no-append-eod",
    )
    #: ``format="text"``: the token ending documents (its text or id; ``None``: the tokenizer's EOS). What
    #: Megatron-LM's tokenizer calls ``eod``: a Qwen base model's ``eos_token`` is ``<|endoftext|>``, not the
    #: chat models' ``<|im_end|>``.
    eod: str | None = option(
        None,
        help="--format text: the token ending every document (e.g. '<|endoftext|>', or an id); default the "
        "tokenizer's EOS.",
    )

    def __post_init__(self) -> None:
        from longpack.validate import plain_fields

        plain_fields(self)
        check_choices(self, prefix="text.")
        if self.min_tokens not in (1, 2):
            raise ConfigError(f"text.min_tokens={self.min_tokens!r} must be 1 or 2", fields="text.min_tokens")
        if not isinstance(self.append_eod, bool):
            raise ConfigError(
                f"text.append_eod must be True or False, got {self.append_eod!r}", fields="text.append_eod"
            )
        if self.eod is not None and (not isinstance(self.eod, str) or not self.eod):
            raise ConfigError(
                f"text.eod must be a token's text or id (a non-empty string), got {self.eod!r}",
                fields="text.eod",
            )
        for field in ("prompt_key", "completion_key", "messages_key", "tools_key", "text_key"):
            value = getattr(self, field)
            if not isinstance(value, str) or not value:
                raise ConfigError(
                    f"text.{field}={value!r} must be a non-empty column name", fields=f"text.{field}"
                )
        for field in ("prompt_template", "separator"):
            if not isinstance(getattr(self, field), str):
                raise ConfigError(
                    f"text.{field} must be a string, got {type(getattr(self, field)).__name__}",
                    fields=f"text.{field}",
                )
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(self.prompt_template) if f is not None]
        except ValueError as e:
            raise ConfigError(
                f"text.prompt_template={self.prompt_template!r} is not a format string ({e}); "
                "write placeholders as {prompt} and literal braces as {{ }}",
                fields="text.prompt_template",
            ) from e
        if any(f == "" or not f.isidentifier() for f in fields):
            raise ConfigError(
                f"text.prompt_template={self.prompt_template!r}: placeholders must be row keys such as "
                "{prompt}; write literal braces as {{ }}",
                fields="text.prompt_template",
            )

    def template_fields(self) -> tuple[str, ...]:
        """The row keys ``prompt_template`` reads (``prompt`` stands for ``prompt_key``).

        >>> TextConfig(prompt_key="q", prompt_template="[{ctx}] {prompt}").template_fields()
        ('ctx', 'q')
        """
        names = [f for _, f, _, _ in string.Formatter().parse(self.prompt_template) if f]
        return tuple(dict.fromkeys(self.prompt_key if f == "prompt" else f for f in names))

    def used_columns(self, fmt: str) -> tuple[str, ...]:
        """The row columns a format reads with these settings (all other columns are ignored).

        >>> TextConfig().used_columns("sharegpt")
        ('conversations', 'system', 'tools')
        """
        if fmt == choices.PROMPT_COMPLETION_FORMAT:
            return tuple(dict.fromkeys((self.prompt_key, self.completion_key, *self.template_fields())))
        if fmt == choices.CHAT_FORMAT:
            return (self.messages_key, self.tools_key)
        if fmt == choices.SHAREGPT_FORMAT:
            return (SHAREGPT_KEY, "system", self.tools_key)
        if fmt == choices.PRETOKENIZED_FORMAT:
            return ("input_ids", "loss_mask")
        if fmt == choices.TEXT_FORMAT:
            return (self.text_key,)
        return ()


#: The keys of an Alpaca-style row (``input`` may be empty or absent).
ALPACA_KEYS = frozenset({"instruction", "output"})


def detect_format(rows: Sequence[Mapping[str, Any]], config: TextConfig) -> str:
    """The most common format among the first rows (ties: the earliest). Rows whose keys fit no format are
    ignored unless no row fits. Per row: ``input_ids`` -> pretokenized, messages key -> chat,
    ``conversations`` -> sharegpt, prompt and completion keys -> prompt_completion.

        >>> detect_format([{"messages": []}, {"prompt": "p", "completion": "c"}, {"messages": []}], TextConfig())
        'chat'
        >>> detect_format([{"question": "q"}], TextConfig())
        Traceback (most recent call last):
        ...
        longpack.text.errors.RowError: cannot detect the format from keys ['question']: prompt_completion needs 'prompt' and 'completion' (or name your keys with prompt_key and completion_key), chat needs 'messages', sharegpt needs 'conversations', pretokenized needs 'input_ids', text needs 'text'
    """
    found: list[str] = []
    for row in rows:
        if "input_ids" in row:
            found.append(choices.PRETOKENIZED_FORMAT)
        elif config.messages_key in row:
            found.append(choices.CHAT_FORMAT)
        elif SHAREGPT_KEY in row:
            found.append(choices.SHAREGPT_FORMAT)
        elif config.prompt_key in row and config.completion_key in row:
            found.append(choices.PROMPT_COMPLETION_FORMAT)
        elif config.text_key in row:
            found.append(choices.TEXT_FORMAT)
    if not found:
        keys = sorted(rows[0]) if rows else []
        hint = ""
        alpaca = [row for row in rows if set(row) >= ALPACA_KEYS]
        if alpaca:
            with_input = sum("input" in row for row in alpaca)
            template = "{instruction}\\n\\n{input}" if with_input else "{instruction}"
            mixed = (
                ' (some rows have no \'input\' key: give them an empty one, "input": "")'
                if 0 < with_input < len(alpaca)
                else ""
            )
            hint = (
                "; these are Alpaca rows (instruction, input, output): pack them as prompt_completion with "
                f"prompt_key instruction completion_key output prompt_template '{template}'{mixed}"
            )
        raise RowError(
            f"cannot detect the format from keys {keys}: prompt_completion needs "
            f"{config.prompt_key!r} and {config.completion_key!r} (or name your keys with prompt_key and "
            f"completion_key), chat needs {config.messages_key!r}, sharegpt needs {SHAREGPT_KEY!r}, "
            f"pretokenized needs 'input_ids', text needs {config.text_key!r}{hint}",
            fields=("prompt_key", "completion_key", "prompt_template"),
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


def _json_value(value: Any, key: str, what: str) -> Any:
    """A JSON-encoded string column (common in Parquet exports and HF ``Json`` columns) decoded."""
    if isinstance(value, str | bytes):
        try:
            return json.loads(value)
        except (ValueError, RecursionError) as e:
            raise RowError(f"key {key!r} is a string but not JSON {what} ({e})") from e
    return value


def _turns(row: Mapping[str, Any], key: str, what: str) -> list[Any]:
    if isinstance(row.get(key), str | bytes):  # some datasets store the conversation as a JSON string
        value = _json_value(row[key], key, "list of turns")
        if isinstance(value, list):
            return value
        raise RowError(
            f"key {key!r} is a JSON string but holds a {type(value).__name__}, not a list of turns"
        )
    return list(_get(row, key, (list, tuple, np.ndarray), what))


def row_tools(row: Mapping[str, Any], config: TextConfig) -> Tools | None:
    """The row's tool definitions (``config.tools_key``): a list of objects, or ``None`` when absent/empty.

    >>> row_tools({"tools": '[{"type": "function", "function": {"name": "f"}}]'}, TextConfig())
    [{'type': 'function', 'function': {'name': 'f'}}]
    >>> row_tools({"tools": {"name": "f"}}, TextConfig())
    Traceback (most recent call last):
    ...
    longpack.text.errors.RowError: key 'tools' must be a list of tool definitions (or a JSON string of one), got dict; wrap a single tool in a list
    """
    key = config.tools_key
    value = _json_value(row.get(key), key, "list of tool definitions")
    if value is None:
        return None
    if isinstance(value, tuple | np.ndarray):
        value = list(value)
    if not isinstance(value, list):
        raise RowError(
            f"key {key!r} must be a list of tool definitions (or a JSON string of one), got "
            f"{type(value).__name__}; wrap a single tool in a list"
        )
    for i, tool in enumerate(value):
        if not isinstance(tool, Mapping):
            raise RowError(
                f'{key}[{i}] must be a tool definition object (e.g. {{"type": "function", "function": '
                f'{{"name": ...}}}}), got {type(tool).__name__}'
            )
    return [dict(t) for t in value] or None


def _tool_calls(value: Any, where: str) -> list[dict[str, Any]]:
    """Assistant tool calls as ``[{"type": "function", "function": {"name", "arguments"}}, ...]`` or as given."""
    value = _json_value(value, f"{where}.tool_calls", "list of tool calls")
    if isinstance(value, Mapping):
        value = [value]
    if isinstance(value, tuple | np.ndarray):
        value = list(value)
    if not isinstance(value, list):
        raise RowError(f"{where}: tool_calls must be a list of calls, got {type(value).__name__}")
    calls = []
    for j, call in enumerate(value):
        if not isinstance(call, Mapping):
            raise RowError(f"{where}.tool_calls[{j}] must be an object, got {type(call).__name__}")
        fn = call.get("function") or call
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise RowError(
                f'{where}.tool_calls[{j}] needs a function name: {{"function": {{"name": ..., '
                f'"arguments": ...}}}} or {{"name": ..., "arguments": ...}}; got keys {sorted(call)}'
            )
        calls.append(dict(call))
    return calls


def _function_call_turn(value: Any, where: str) -> list[dict[str, Any]]:
    """LLaMA-Factory's ``function_call`` turn value (JSON: one call or a list) as OpenAI tool calls."""
    try:
        parsed = json.loads(value) if isinstance(value, str) else value
    except (ValueError, RecursionError) as e:
        raise RowError(
            f"{where}: a function_call turn's value must be JSON like "
            f'{{"name": "get_weather", "arguments": {{"city": "Paris"}}}} ({e})'
        ) from e
    items = parsed if isinstance(parsed, list) else [parsed]
    calls = []
    for item in items:
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            raise RowError(
                f"{where}: a function_call turn's value must hold objects with a 'name' and 'arguments', "
                f"got {str(item)[:80]!r}"
            )
        calls.append(
            {"type": "function", "function": {"name": item["name"], "arguments": item.get("arguments", {})}}
        )
    return calls


_SHAREGPT_TURN_KEYS = frozenset({"from", "value"})
_MESSAGE_KEY_SET = frozenset({*MESSAGE_KEYS, "function_call"})


def chat_messages(
    row: Mapping[str, Any], fmt: str, config: TextConfig, ignored: dict[str, int] | None = None
) -> list[Message]:
    """The row's conversation as ``[{"role", "content", ...}, ...]``: ShareGPT roles mapped (LLaMA-Factory's
    ``function_call`` -> an assistant message with ``tool_calls``, ``observation`` -> ``tool``), the top-level
    ``system`` prepended, text content parts joined; ``reasoning_content``, ``tool_calls``, ``name`` and
    ``tool_call_id`` kept for the chat template.

    >>> chat_messages({"system": "S", "conversations": [{"from": "human", "value": "Q"}]}, "sharegpt", TextConfig())
    [{'role': 'system', 'content': 'S'}, {'role': 'user', 'content': 'Q'}]
    >>> chat_messages({"conversations": [{"from": "function_call", "value": '{"name": "f", "arguments": {}}'}]},
    ...               "sharegpt", TextConfig())
    [{'role': 'assistant', 'content': '', 'tool_calls': [{'type': 'function', 'function': {'name': 'f', 'arguments': {}}}]}]

    ``ignored`` (if given) counts, per turn key the conversation's turns carry but nothing reads (e.g.
    ``conversations[].weight``), the rows that have it: ``{"conversations[].weight": 1}``.
    """
    out: list[Message] = []
    if fmt == choices.SHAREGPT_FORMAT:
        turns = _turns(row, SHAREGPT_KEY, "ShareGPT conversation")
        system = row.get("system")
        if system is not None and not isinstance(system, str):
            raise RowError(f"key 'system' must be a string, got {type(system).__name__}")
        if system:
            out.append({"role": "system", "content": system})
        if ignored is not None:
            _count_turn_keys(turns, _SHAREGPT_TURN_KEYS, SHAREGPT_KEY, ignored)
        for i, turn in enumerate(turns):
            where = f"{SHAREGPT_KEY}[{i}]"
            if not isinstance(turn, Mapping) or "from" not in turn or "value" not in turn:
                keys = sorted(turn) if isinstance(turn, Mapping) else type(turn).__name__
                raise RowError(f"{where} needs keys 'from' and 'value', has {keys}")
            speaker = str(turn["from"]).lower()
            role = _SHAREGPT_ROLES.get(speaker)
            if role is None:
                raise RowError(
                    f"{where}: unknown 'from' {turn['from']!r}; use one of {sorted(_SHAREGPT_ROLES)}"
                )
            if speaker == "function_call":
                out.append(
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": _function_call_turn(turn["value"], where),
                    }
                )
            else:
                out.append({"role": role, "content": _content_text(turn["value"], where)})
    else:
        key = config.messages_key
        turns = _turns(row, key, "chat messages")
        if ignored is not None:
            _count_turn_keys(turns, _MESSAGE_KEY_SET, key, ignored)
        for i, m in enumerate(turns):
            where = f"{key}[{i}]"
            if not isinstance(m, Mapping) or "role" not in m:
                keys = sorted(m) if isinstance(m, Mapping) else type(m).__name__
                raise RowError(f"{where} needs keys 'role' and 'content', has {keys}")
            role = _CHAT_ROLE_ALIASES.get(m["role"], m["role"])
            if role not in _CHAT_ROLES:
                raise RowError(
                    f"{where}: unknown role {m['role']!r}; use one of {', '.join(_CHAT_ROLES)} "
                    "(or map it in the data)"
                )
            msg: dict[str, Any] = {"role": role, "content": _content_text(m.get("content"), where)}
            if isinstance(m.get("reasoning_content"), str):
                msg["reasoning_content"] = m["reasoning_content"]
            calls = m.get("tool_calls")
            if calls is None and isinstance(m.get("function_call"), Mapping):  # OpenAI's legacy form
                calls = [{"type": "function", "function": m["function_call"]}]
            if calls is not None and (isinstance(calls, str) or len(calls)):
                if role != "assistant":
                    raise RowError(f"{where}: only assistant messages carry tool_calls, this one is {role!r}")
                msg["tool_calls"] = _tool_calls(calls, where)
            for extra in ("name", "tool_call_id"):
                if isinstance(m.get(extra), str):
                    msg[extra] = m[extra]
            out.append(msg)
    if not out:
        raise RowError("the conversation is empty")
    return out


def _count_turn_keys(turns: Sequence[Any], known: frozenset[str], key: str, ignored: dict[str, int]) -> None:
    extra: set[str] = set()
    for turn in turns:
        if isinstance(turn, Mapping):
            extra.update(k for k, v in turn.items() if k not in known and v is not None)
    for k in extra:
        name = f"{key}[].{k}"
        ignored[name] = ignored.get(name, 0) + 1


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
    row: Any, fmt: str, config: TextConfig, tok: Tokenizer, ignored: dict[str, int] | None = None
) -> tuple[list[int], list[int] | bytearray]:
    """``row_to_sample`` with the mask as a list or a bytearray of 0/1, whichever is cheaper;
    ``ignored`` collects the turn keys nothing reads (see :func:`chat_messages`).

    Text that is not Unicode (a lone surrogate: a ``\\ud800`` escape, or its raw bytes, which
    ``json.loads`` lets through) makes the row malformed, whichever tokenizer meets it first:

    >>> from longpack.text.tokenizers import load_tokenizer
    >>> sample_from_row({"prompt": "a" + chr(0xD800), "completion": "b"},
    ...                 "prompt_completion", TextConfig(), load_tokenizer("bytes"))
    Traceback (most recent call last):
    ...
    longpack.text.errors.RowError: key 'prompt' holds U+D800, a lone UTF-16 surrogate (not a character: no tokenizer can encode it); fix the text (a surrogate pair, or the character itself)
    """
    try:
        return _sample_from_row(row, fmt, config, tok, ignored)
    except (UnicodeError, TypeError):  # tokenizers differ: UnicodeEncodeError (Python), TypeError (Rust)
        where = _lone_surrogate(row)
        if where is None:
            raise
        key, char = where
        raise RowError(
            f"key {key!r} holds U+{ord(char):04X}, a lone UTF-16 surrogate (not a character: no tokenizer "
            "can encode it); fix the text (a surrogate pair, or the character itself)"
        ) from None


_SURROGATE = re.compile("[\ud800-\udfff]")
_MAX_WALK_DEPTH = 200  # rows nest at most 100 deep (the readers refuse deeper JSON)


def _lone_surrogate(value: Any, key: str = "row", depth: int = 0) -> tuple[str, str] | None:
    """``(key, character)`` of the first lone surrogate in a row's strings (keys too), or ``None``."""
    if isinstance(value, str):
        found = _SURROGATE.search(value)
        return None if found is None else (key, found.group())
    if depth > _MAX_WALK_DEPTH:
        return None
    if isinstance(value, Mapping):
        for k, v in value.items():
            name = str(k) if depth == 0 else f"{key}.{k}"
            hit = _lone_surrogate(k, name, depth + 1) or _lone_surrogate(v, name, depth + 1)
            if hit is not None:
                return hit
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            hit = _lone_surrogate(v, f"{key}[{i}]", depth + 1)
            if hit is not None:
                return hit
    return None


def _sample_from_row(
    row: Any, fmt: str, config: TextConfig, tok: Tokenizer, ignored: dict[str, int] | None = None
) -> tuple[list[int], list[int] | bytearray]:
    if not isinstance(row, Mapping):
        raise RowError(f"a row must be a JSON object, got {type(row).__name__}")
    if fmt == choices.PROMPT_COMPLETION_FORMAT:
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
        ids = context + answer
        ids.append(tok.eos_id)
        # The mask as bytes (0/1): built and copied by C loops, not a Python int per token.
        mask: list[int] | bytearray
        if config.prompt_completion_loss == choices.FULL_LOSS:
            mask = bytearray(b"\x01") * len(ids)
        else:
            mask = bytearray(len(context)) + b"\x01" * (len(answer) + 1)
    elif fmt in (choices.CHAT_FORMAT, choices.SHAREGPT_FORMAT):
        messages = chat_messages(row, fmt, config, ignored)
        if config.chat_loss != choices.FULL_LOSS and not any(m["role"] == "assistant" for m in messages):
            raise RowError(
                f"the conversation has no assistant message, so chat_loss={config.chat_loss!r} trains on nothing"
            )
        ids, spans = tok.chat_spans(messages, tools=row_tools(row, config))
        n = len(ids)
        if n < config.min_tokens:
            raise RowError(f"the sample has {n} token(s); a stored sample needs at least {config.min_tokens}")
        skipped = tok.skipped_id_set
        if config.chat_loss == choices.FULL_LOSS:
            full = np.ones(n, dtype=np.uint8)
            if skipped:
                full[np.isin(np.array(ids), tok.skipped_ids)] = 0
            return ids, bytearray(full.tobytes())
        if config.chat_loss == choices.LAST_TURN_LOSS and spans:
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
    elif fmt == choices.TEXT_FORMAT:
        from longpack.text.documents import document_sample

        return document_sample(row, config, tok)
    elif fmt == choices.PRETOKENIZED_FORMAT:
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
        if len(ids) < config.min_tokens:
            raise RowError(
                f"the sample has {len(ids)} token(s); a stored sample needs at least {config.min_tokens}"
            )
        return ids, mask
    else:
        raise ValueError(f"unknown format {fmt!r}")
    if len(ids) < config.min_tokens:
        raise RowError(
            f"the sample has {len(ids)} token(s); a stored sample needs at least {config.min_tokens}"
        )
    skipped = tok.skipped_id_set
    if skipped and not skipped.isdisjoint(ids):
        mask = bytearray(0 if i in skipped else m for i, m in zip(ids, mask, strict=True))
    return ids, mask
