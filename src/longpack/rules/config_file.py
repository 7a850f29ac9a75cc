"""Reading config files and Hydra-style overrides into a nested mapping, with the ``file:line`` of each key.

YAML is read with a safe loader that keeps unknown tags as text (Megatron-Bridge dumps carry
``!!python/name:torch.bfloat16``) and refuses alias expansion beyond a budget: a few hundred bytes of
nested aliases (an "alias bomb") would otherwise expand to billions of nodes when the mapping is
copied, flattened or located.

>>> data = load_yaml_text("model: {cp: &c 2, tp: *c}", where="c.yaml")
>>> data
{'model': {'cp': 2, 'tp': 2}}
>>> bomb = "a: &a [x, x, x, x, x, x, x, x, x]\\n" + "".join(
...     f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\\n" for i in range(8))
>>> load_yaml_text(bomb, where="bomb.yaml")
Traceback (most recent call last):
...
longpack.errors.ConfigError: bomb.yaml:6: YAML aliases expand this document to more than 200000 nodes; write the values out instead of nesting aliases
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from longpack.errors import ConfigError as _ConfigError

#: Nodes a document may expand to through aliases (a full Megatron-Bridge dump has a few thousand).
MAX_EXPANDED_NODES = 200_000


#: A config that cannot be read (bad file, bad override, a value of the wrong type or shape):
#: ``longpack.errors.ConfigError`` (one class per name).
ConfigError = _ConfigError


class _TolerantLoader(yaml.SafeLoader):
    """SafeLoader that turns unknown tags (``!!python/name:torch.bfloat16``) into their text."""


def _construct_unknown(loader: yaml.SafeLoader, tag_suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        return f"<{node.tag} {node.value}>".strip()
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]


_TolerantLoader.add_multi_constructor("!", _construct_unknown)
_TolerantLoader.add_multi_constructor("tag:yaml.org,2002:python/", _construct_unknown)


def _check_expansion(root: yaml.Node, where: str) -> None:
    """Refuse documents whose aliases expand past :data:`MAX_EXPANDED_NODES` or refer to themselves.

    Sizes are memoized per node, so the check is linear in the document even when the expansion is not.
    """
    size: dict[int, int] = {}
    on_path: set[int] = set()

    def children(node: yaml.Node) -> list[yaml.Node]:
        if isinstance(node, yaml.MappingNode):
            return [n for pair in node.value for n in pair]
        if isinstance(node, yaml.SequenceNode):
            return list(node.value)
        return []

    # iterative post-order walk (deep nesting must not hit Python's recursion limit)
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            total = 1 + sum(size[id(c)] for c in children(node))
            if total > MAX_EXPANDED_NODES:
                line = node.start_mark.line + 1
                raise ConfigError(
                    f"{where}:{line}: YAML aliases expand this document to more than {MAX_EXPANDED_NODES} "
                    "nodes; write the values out instead of nesting aliases"
                )
            size[key] = total
            continue
        if key in size:
            continue
        if key in on_path:
            raise ConfigError(
                f"{where}:{node.start_mark.line + 1}: a YAML alias refers to the node that contains it "
                "(a recursive structure); write the values out"
            )
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children(node) if id(c) not in size)


def _compose(text: str, where: str) -> tuple[Any, yaml.Node | None]:
    try:
        loader = _TolerantLoader(text)
        try:
            node = loader.get_single_node()
            if node is not None:
                _check_expansion(node, where)
                _check_duplicate_keys(node, where)
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"{where}:{mark.line + 1}" if mark is not None else where
        raise ConfigError(f"{at}: invalid YAML: {getattr(exc, 'problem', exc)}") from exc
    except RecursionError:  # the YAML parser recurses per nesting level
        raise ConfigError(f"{where}: YAML nested too deeply to read; a config is a few levels deep") from None
    return data, node


def _check_duplicate_keys(root: yaml.Node, where: str) -> None:
    """Refuse a mapping that holds a key twice: YAML (and JSON) readers keep the last value silently, so
    one of the two settings the file shows is not the one that runs.

    >>> load_yaml_text("model:\\n  seq_length: 4096\\n  cp: 2\\n  seq_length: 8192\\n", where="c.yaml")
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: c.yaml:4: key 'model.seq_length' is given twice (lines 2 and 4); a reader keeps the last one silently: remove one of them
    """
    stack: list[tuple[yaml.Node, str]] = [(root, "")]
    seen_nodes: set[int] = set()
    while stack:
        node, prefix = stack.pop()
        if id(node) in seen_nodes:  # an alias: checked where it is defined
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            lines: dict[str, int] = {}
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                    key = str(key_node.value)
                    path = f"{prefix}.{key}" if prefix else key
                    line = key_node.start_mark.line + 1
                    if key in lines:
                        raise ConfigError(
                            f"{where}:{line}: key {path!r} is given twice (lines {lines[key]} and {line}); a "
                            "reader keeps the last one silently: remove one of them"
                        )
                    lines[key] = line
                    stack.append((value_node, path))
                else:
                    stack.append((value_node, prefix))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((child, f"{prefix}[{i}]") for i, child in enumerate(node.value))


class _DuplicateKey(ValueError):
    """A JSON object holds a key twice (``args[0]``: the key)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _json_duplicate(text: str, where: str, key: str) -> None:
    """Raise the duplicate-key error of a JSON config with both lines (JSON is YAML: its nodes have them)."""
    try:
        _compose(text, where)
    except ConfigError:
        raise
    except Exception:
        pass
    raise ConfigError(
        f"{where}: key {key!r} is given twice in one object; a reader keeps the last one silently: remove "
        "one of them"
    )


def load_yaml_text(text: str, *, where: str) -> Any:
    """Parse one YAML document with the tolerant, alias-limited loader (``where`` names it in errors)."""
    return _compose(text, where)[0]


def _node_lines(node: yaml.Node, prefix: str, out: dict[str, int]) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = str(key_node.value)
            path = f"{prefix}.{key}" if prefix else key
            out[path] = key_node.start_mark.line + 1
            _node_lines(value_node, path, out)


#: The sections of Megatron-Bridge's ``ConfigContainer`` (NVIDIA-NeMo/Megatron-Bridge@067f987df,
#: ``src/megatron/bridge/training/config.py``): a config has at least one of them at its top level.
CONFIG_SECTIONS = (
    "rng",
    "rerun_state_machine",
    "train",
    "model",
    "optimizer",
    "ddp",
    "validation",
    "scheduler",
    "dataset",
    "logger",
    "tokenizer",
    "checkpoint",
    "dist",
    "ft",
    "straggler",
    "nvrx_straggler",
    "profiling",
    "peft",
    "comm_overlap",
    "mixed_precision",
    "tensor_inspect",
    "inprocess_restart",
    "env_vars",
)
#: Suffixes of data files (what ``longpack pack`` reads or writes), never configs.
DATA_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet", ".arrow", ".npy", ".bin", ".idx")


def check_is_config(p: Path, data: Any) -> None:
    """Refuse what is not a training config, so that ``check`` never says "OK: 0 errors" about it: an
    empty file (the null device), a data file (JSON Lines, Parquet, ...), or a mapping none of whose
    top-level keys is a ``ConfigContainer`` section (a JSON Lines row's ``prompt`` / ``completion``).

    >>> check_is_config(Path("d.yaml"), {"prompt": "q", "completion": "a"})
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: d.yaml: not a Megatron-Bridge config: none of its top-level keys (completion, prompt) is a config section (model, train, dataset, ...); give the training config (or only KEY=VALUE overrides)
    """
    name = p.name.lower()
    if any(name.endswith(suffix) for suffix in DATA_SUFFIXES):
        raise ConfigError(
            f"{p}: a data file ({p.suffix}), not a training config; give the Megatron-Bridge config (YAML or "
            "JSON), and the packed data with --packed"
        )
    if data is None or data == {}:
        raise ConfigError(
            f"{p}: empty, no config in it; give the training config, or only KEY=VALUE overrides to check "
            "them without a file"
        )
    if isinstance(data, dict) and not any(str(k) in CONFIG_SECTIONS for k in data):
        keys = ", ".join(sorted(map(str, data))[:6])
        raise ConfigError(
            f"{p}: not a Megatron-Bridge config: none of its top-level keys ({keys}) is a config section "
            "(model, train, dataset, ...); give the training config (or only KEY=VALUE overrides)"
        )


def read_config_file(path: str | Path) -> tuple[dict[str, Any], dict[str, str]]:
    """Read a YAML or JSON config: ``(mapping, {dotted key: "file:line"})``.

    Raises :class:`ConfigError` naming the file (and line, for YAML syntax errors and alias bombs); a file
    that is not a config (empty, data, no config section) too (:func:`check_is_config`).
    """
    p = Path(path)
    if any(p.name.lower().endswith(suffix) for suffix in DATA_SUFFIXES):
        check_is_config(p, None)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config {p}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        line = p.read_bytes()[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{p}:{line}: not UTF-8 text (byte {exc.start}); save the config as UTF-8"
        ) from None
    lines: dict[str, int] = {}
    if p.suffix.lower() == ".json":
        try:
            data = json.loads(text, object_pairs_hook=_unique_keys)
        except _DuplicateKey as exc:
            _json_duplicate(text, str(p), exc.args[0])
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{p}:{exc.lineno}: invalid JSON: {exc.msg}") from exc
        except RecursionError:
            raise ConfigError(f"{p}: JSON nested too deeply to read; a config is a few levels deep") from None
    else:
        data, node = _compose(text, str(p))
        if node is not None:
            _node_lines(node, "", lines)
    if data is not None and not isinstance(data, dict):
        raise ConfigError(
            f"{p}: the top level must be a mapping of sections (model:, train:, ...), got {type(data).__name__}"
        )
    check_is_config(p, data)
    assert isinstance(data, dict)
    return data, {k: f"{p.name}:{n}" for k, n in lines.items()}


def apply_overrides(
    data: Mapping[str, Any], overrides: Iterable[str], sources: dict[str, str] | None = None
) -> dict[str, Any]:
    """Apply Hydra-style overrides to a nested mapping (returns a new mapping).

    ``key=value``, ``+key=value`` and ``++key=value`` set (values parse as YAML: ``8`` is an int, ``true``
    a bool, ``null`` None, ``[attn,mlp]`` a list; a value in quotes is a string, unquoted as Hydra does);
    ``~key`` deletes.

    >>> apply_overrides({"model": {"cp": 1}}, ["model.cp=4", "+train.mbs=2", "~model.cp", "a.b=[1, 2]"])
    {'model': {}, 'train': {'mbs': 2}, 'a': {'b': [1, 2]}}
    >>> apply_overrides({}, ["model.seq_length"])
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: override 'model.seq_length': expected key=value (or ~key to delete)
    """
    result: dict[str, Any] = json.loads(json.dumps(data, default=str))  # deep copy, plain types
    for raw in overrides:
        text = raw.strip()
        if text.startswith("~"):
            path = text[1:].split("=", 1)[0].strip()
            _check_override_key(raw, path)
            _delete(result, path.split("."))
            if sources is not None:
                sources.pop(path, None)
            continue
        if "=" not in text:
            raise ConfigError(f"override {raw!r}: expected key=value (or ~key to delete)")
        key, value_text = text.split("=", 1)
        key = key.lstrip("+").strip()
        if not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {raw!r}: empty key part in {key!r}")
        _check_override_key(raw, key)
        try:
            quoted = _hydra_unquote(value_text.strip())
            if quoted is not None:
                value: Any = quoted
            else:
                value = load_yaml_text(value_text, where="value") if value_text.strip() else ""
        except ConfigError as exc:
            raise ConfigError(f"override {raw!r}: value is not a YAML scalar or list: {exc}") from exc
        node = result
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[parts[-1]] = value
        if sources is not None:
            sources[key] = f"override {raw!r}"
    return result


def _check_override_key(raw: str, key: str) -> None:
    """Refuse a key with Hydra's config-group syntax (``model/size=big``, ``x@pkg=y``): it selects another
    config file, which no rule can read, so the value would go unused without a word.

    >>> _check_override_key("model/seq_length=8192", "model/seq_length")
    Traceback (most recent call last):
    ...
    longpack.errors.ConfigError: override 'model/seq_length=8192': '/' in a key selects a Hydra config group (another config file), which longpack does not read, so the value would go unused; separate keys with '.': model.seq_length
    """
    for char in "/@":
        if char in key:
            name = (
                "'/' in a key selects a Hydra config group" if char == "/" else "'@' in a key names a package"
            )
            raise ConfigError(
                f"override {raw!r}: {name} (another config file), which longpack does not read, so the value "
                f"would go unused; separate keys with '.': {key.replace('/', '.').split('@')[0]}",
                fields="overrides",
            )


def _hydra_unquote(text: str) -> str | None:
    r"""The string a Hydra quoted value (``"..."`` or ``'...'``) stands for, or ``None`` if ``text`` is not one.

    Inside the quotes, a run of backslashes before a quote is halved (an odd one escapes the quote); other
    backslashes are literal, as in Hydra's override grammar.

    >>> _hydra_unquote('"/a b/c,d"'), _hydra_unquote(r'"say \"hi\""'), _hydra_unquote(r'"C:\dir\\"')
    ('/a b/c,d', 'say "hi"', 'C:\\dir\\')
    >>> _hydra_unquote("8") is None
    True
    """
    if len(text) < 2 or text[0] not in "'\"" or text[-1] != text[0]:
        return None
    quote, body, out, i = text[0], text[1:-1], [], 0
    while i < len(body):
        if body[i] != "\\":
            if body[i] == quote:
                return None  # an unescaped quote inside: not one quoted string
            out.append(body[i])
            i += 1
            continue
        j = i
        while j < len(body) and body[j] == "\\":
            j += 1
        run = j - i
        if j < len(body) and body[j] == quote:
            if run % 2 == 0:
                return None
            out.append("\\" * (run // 2) + quote)
            j += 1
        elif j == len(body):
            if run % 2:
                return None  # would escape the closing quote
            out.append("\\" * (run // 2))
        else:
            out.append("\\" * run)
        i = j
    return "".join(out)


def _delete(node: dict[str, Any], parts: list[str]) -> None:
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            return
        node = child
    node.pop(parts[-1], None)


def flatten(
    data: Mapping[str, Any], leaves: frozenset[str] = frozenset(), prefix: str = ""
) -> dict[str, Any]:
    """Dotted keys of a nested mapping; keys in ``leaves`` keep their mapping value whole, and an empty
    mapping is a key of its own.

    >>> flatten({"a": {"b": 1, "c": {}}, "d": {"e": 2}}, leaves=frozenset({"d"}))
    {'a.b': 1, 'a.c': {}, 'd': {'e': 2}}
    """
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and path not in leaves:
            nested = flatten(value, leaves, path)
            if nested:
                out.update(nested)
            else:
                out[path] = value
        else:
            out[path] = value
    return out


__all__ = [
    "CONFIG_SECTIONS",
    "MAX_EXPANDED_NODES",
    "ConfigError",
    "apply_overrides",
    "check_is_config",
    "flatten",
    "load_yaml_text",
    "read_config_file",
]
