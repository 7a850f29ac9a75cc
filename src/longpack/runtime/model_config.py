"""What ``longpack verify`` accepts of a model config (a Hugging Face ``config.json`` as a dict), checked
before any model is built: a config transformers would build into something that proves nothing (zero
layers; a NaN ``rms_norm_eps`` gives NaN losses, and NaN = NaN is never a difference found) or fail on with
an internal error (an unknown RoPE type, sizes that are not numbers, heads that do not divide) is refused
with a :class:`~longpack.errors.ConfigError` naming the key, its value and the fix. No torch here.

>>> check_model_config({"model_type": "llama", "vocab_size": 100, "hidden_size": 64,
...                     "num_hidden_layers": 0, "num_attention_heads": 4}, "config.json")
Traceback (most recent call last):
...
longpack.errors.ConfigError: --model config.json: num_hidden_layers is 0; it must be a whole number >= 1: fix the config.json, or pass the model's own config
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from longpack.errors import ConfigError

__all__ = ["ROPE_TYPES", "check_model_config"]

#: Sizes that must be whole numbers >= 1 where a config has them (``head_dim`` may also be null).
SIZES = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "max_position_embeddings",
)
#: Sizes a vision-language config must give (top level or ``text_config``).
REQUIRED = ("hidden_size",)
#: Positive finite reals where a config has them.
POSITIVE_REALS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "rope_theta")
#: RoPE types besides transformers' ``ROPE_INIT_FUNCTIONS`` (read from the installed transformers):
#: the plain rotary embedding and Qwen-VL's mRoPE (which transformers reads as ``default``).
ROPE_TYPES = ("default", "mrope")


def _rope_types() -> set[str]:
    known = set(ROPE_TYPES)
    try:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    except ImportError:  # verify needs transformers anyway; it says so when it builds the model
        return known | {"linear", "dynamic", "yarn", "longrope", "llama3"}
    return known | set(ROPE_INIT_FUNCTIONS)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_model_config(config: Mapping[str, Any], source: str) -> None:
    """Refuse ``config`` (from ``source``, named in the message) if verify cannot prove anything with it.
    A vision-language config is checked on its ``text_config`` (the decoder) and top level together."""

    def bad(key: str, value: Any, must: str) -> ConfigError:
        return ConfigError(
            f"--model {source}: {key} is {value!r}; it must be {must}: fix the config.json, or pass the "
            "model's own config",
            fields="model",
        )

    text = config.get("text_config")
    if text is not None and not isinstance(text, Mapping):
        raise bad("text_config", type(text).__name__, "an object (the text decoder's config)")
    layers = [dict(config)] + ([dict(text)] if isinstance(text, Mapping) else [])
    merged: dict[str, Any] = {}
    for part in layers:  # the text decoder's own keys win over the top level's
        merged.update({k: v for k, v in part.items() if v is not None or k not in merged})
    for part, where in zip(layers, ("", "text_config."), strict=False):
        for key in SIZES:
            value = part.get(key)
            if value is None and key in ("head_dim",):
                continue
            if key in part and (not _whole(value) or value < 1):
                raise bad(where + key, value, "a whole number >= 1")
        for key in POSITIVE_REALS:
            if key in part:
                value = part[key]
                ok = isinstance(value, int | float) and not isinstance(value, bool)
                if not ok or not math.isfinite(value) or value <= 0:
                    raise bad(where + key, value, "a finite number above 0")
        for key in ("rope_scaling", "rope_parameters"):
            rope = part.get(key)
            if rope is None:
                continue
            if not isinstance(rope, Mapping):
                raise bad(where + key, rope, "an object such as {'rope_type': 'llama3', 'factor': 8.0}")
            kind = rope.get("rope_type", rope.get("type", "default"))
            known = _rope_types()
            if kind not in known:
                raise bad(f"{where}{key}.rope_type", kind, "one of " + ", ".join(sorted(known)))
            for real in ("factor", "rope_theta", "low_freq_factor", "high_freq_factor"):
                if real in rope:
                    value = rope[real]
                    ok = isinstance(value, int | float) and not isinstance(value, bool)
                    if not ok or not math.isfinite(value) or value <= 0:
                        raise bad(f"{where}{key}.{real}", value, "a finite number above 0")
    # A text config may leave sizes to transformers' defaults (the tiny model replaces them anyway); a
    # vision-language config's decoder width sizes the vision merger, so it must be given.
    vlm = isinstance(text, Mapping) or "vision_config" in config
    for key in REQUIRED if vlm else ():
        if merged.get(key) is None:
            raise bad(key, None, "given in its top level or text_config (the vision merger's output width)")
    heads: Any = merged.get("num_attention_heads")
    kv: Any = merged.get("num_key_value_heads")
    if _whole(heads) and _whole(kv) and heads % kv:
        raise bad("num_key_value_heads", kv, f"a divisor of num_attention_heads ({heads})")
    hidden = merged.get("hidden_size")
    if _whole(heads) and _whole(hidden) and merged.get("head_dim") is None and hidden % heads:
        raise bad(
            "hidden_size",
            merged["hidden_size"],
            f"a multiple of num_attention_heads ({heads}) without head_dim",
        )
