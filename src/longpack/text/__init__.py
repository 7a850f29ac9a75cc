"""Reading and tokenizing SFT data into ``TokenizedSamples``, as Megatron-Bridge's SFT preprocessing does.
No torch, no knowledge of packing.

Public API::

    TextConfig, TokenizeResult, InputError
    resolve_inputs(inputs) -> list[Path];  find_inputs(inputs) -> InputListing (files + skipped paths)
    longpack.text.mix: parse_mix(["a.jsonl=0.7", "b/=0.3"] | "mix.yaml") -> Mix; mix_samples(...)
    longpack.text.preview: preview_sample(ids, mask, tokenizer) -> PreviewSample; render_text / render_html
    load_tokenizer("bytes" | "qwen3" | "path/tokenizer.json" | "hf/model/folder") -> Tokenizer
    as_tokenizer(spec | Tokenizer | tokenizers.Tokenizer | transformers fast tokenizer) -> Tokenizer
    tokenize_inputs(inputs, tokenizer=spec or object, config=TextConfig(), workers=None, progress=False)
        -> TokenizeResult  (worker processes never import the caller's __main__: safe in plain scripts)
    write_demo_dataset(folder, n=12000, seed=0) -> folder;  demo_inputs() -> [file, ...]

Example::

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "chat.jsonl"
    >>> _ = p.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\\n')
    >>> r = tokenize_inputs([str(p)], tokenizer="qwen3", config=TextConfig(), workers=1)
    >>> r.format, len(r.samples), r.tokenizer["eos_id"], int(r.samples.loss_mask.sum())
    ('chat', 1, 151645, 6)
"""

from longpack.text.demo import demo_inputs, write_demo_dataset
from longpack.text.errors import InputError
from longpack.text.inputs import InputListing, find_inputs, resolve_inputs
from longpack.text.pipeline import TokenizeResult, tokenize_inputs
from longpack.text.rows import TextConfig
from longpack.text.tokenizers import Tokenizer, as_tokenizer, load_tokenizer

__all__ = [
    "InputError",
    "InputListing",
    "TextConfig",
    "TokenizeResult",
    "Tokenizer",
    "as_tokenizer",
    "demo_inputs",
    "find_inputs",
    "load_tokenizer",
    "resolve_inputs",
    "tokenize_inputs",
    "write_demo_dataset",
]
