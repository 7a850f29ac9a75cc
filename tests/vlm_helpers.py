"""Shared helpers of the VLM tests: generated images (never downloaded), conversations, a real processor.

The processor is transformers' ``Qwen2VLImageProcessor()`` with its default settings (constructed offline);
the tokenizer is longpack's built-in ``qwen3`` (it has the Qwen-VL vision tokens).
"""

from __future__ import annotations

import io
from functools import cache
from typing import Any

import numpy as np


def make_image(width: int, height: int, seed: int = 0) -> Any:
    """A deterministic RGB ``PIL.Image`` of noise (a generated image, not a download)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def png_bytes(width: int, height: int, seed: int = 0) -> bytes:
    buffer = io.BytesIO()
    make_image(width, height, seed).save(buffer, format="PNG")
    return buffer.getvalue()


def conversation(rng: np.random.Generator, n_images: int, *, turns: int = 1) -> list[dict[str, Any]]:
    """A chat with ``n_images`` ``<image>`` placeholders spread over the user turns, words from ``rng``."""
    words = ["red", "cube", "the", "sky", "photo", "shows", "a", "cat", "on", "blue", "mat", "why", "what"]
    placed = 0
    out = []
    for t in range(turns):
        k = n_images - placed if t == turns - 1 else int(rng.integers(0, n_images - placed + 1))
        question = " ".join(rng.choice(words, int(rng.integers(2, 8))))
        out.append({"role": "user", "content": "<image> " * k + question + "?"})
        placed += k
        answer = " ".join(rng.choice(words, int(rng.integers(1, 12))))
        out.append({"role": "assistant", "content": answer.capitalize() + "."})
    return out


@cache
def image_processor() -> Any:
    from transformers import Qwen2VLImageProcessor

    return Qwen2VLImageProcessor()


@cache
def preparer(**config: Any) -> Any:
    """A ``QwenVLPreparer`` on the real processor (cached: transformers takes seconds to import)."""
    from longpack.vlm import QwenVLPreparer, VLMConfig

    return QwenVLPreparer("qwen3", image_processor(), config=VLMConfig(**config))


def random_samples(n: int, seed: int, *, max_images: int = 3, max_side: int = 200) -> list[dict[str, Any]]:
    """``n`` image+text samples with keys ``s00000...``, images of random sizes."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        k = int(rng.integers(0, max_images + 1))
        images = [
            make_image(
                int(rng.integers(20, max_side)), int(rng.integers(20, max_side)), seed * 1000 + i * 10 + j
            )
            for j in range(k)
        ]
        out.append(
            {
                "__key__": f"s{i:05d}",
                "messages": conversation(rng, k, turns=int(rng.integers(1, 3))),
                "images": images,
            }
        )
    return out


def video_bytes(frames: int, fps: int, width: int, height: int, *, container: str = "mp4") -> bytes:
    """A video generated with PyAV (mpeg4 in ``container``) whose frame ``i`` is a flat grey of level
    ``10 * i % 250``; ``frames=0`` with ``container="avi"`` gives a readable header and no frame."""
    import av

    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container) as out:
        stream = out.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        if frames == 0:
            out.start_encoding()
        for i in range(frames):
            image = np.full((height, width, 3), 10 * i % 250, dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buffer.getvalue()


# Gemma 3's special tokens at its ids' order (pad 0, eos 1, bos 2 as in the released tokenizer); the byte
# alphabet follows. A real `tokenizers` byte-level BPE without merges: Gemma's own vocabulary is a download.
GEMMA3_SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>",
                         "<start_of_image>", "<end_of_image>", "<image_soft_token>")  # fmt: skip


@cache
def gemma3_tokenizer(*, pad_last: bool = False) -> Any:
    """A transformers fast tokenizer with Gemma 3's special tokens and chat template, built offline
    (``pad_last``: ``<pad>`` and ``<unk>`` swapped, so the pad id is 3, not the released tokenizer's 0)."""
    from pathlib import Path

    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    specials = list(GEMMA3_SPECIAL_TOKENS)
    if pad_last:
        specials[0], specials[3] = specials[3], specials[0]
    vocab = {t: i for i, t in enumerate(specials)}
    for c in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[c] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    template = Path(__file__).parent / "data" / "chat_templates" / "gemma3.jinja"
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        chat_template=template.read_text(),
        extra_special_tokens={
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
    )


def gemma3_processor(*, do_pan_and_scan: bool = False, side: int = 28, pad_last: bool = False) -> Any:
    """transformers' ``Gemma3Processor`` over :func:`gemma3_tokenizer` and a ``Gemma3ImageProcessor``
    (``side`` px squares: the pixel count does not change a token count; 256 tokens per image)."""
    import transformers

    tok = gemma3_tokenizer(pad_last=pad_last)
    image_processor = transformers.Gemma3ImageProcessor(
        size={"height": side, "width": side}, do_pan_and_scan=do_pan_and_scan,
        pan_and_scan_min_crop_size=256, pan_and_scan_max_num_crops=4, pan_and_scan_min_ratio_to_activate=1.2,
    )  # fmt: skip
    return transformers.Gemma3Processor(
        image_processor=image_processor, tokenizer=tok, chat_template=tok.chat_template, image_seq_length=256
    )


# Nemotron Nano V2 VL's image tokens at Bridge's ids (collate_fn.py: <img> 131073, </img> 131074; the provider's
# image_token_index 131072) and its turn markers; a byte-level BPE without merges (the real vocabulary is a
# download). The norm values are test values: the preparer reads the checkpoint's own config.json.
NEMOTRON_VL_SPECIALS = {"<unk>": 0, "<s>": 1, "</s>": 2, "<SPECIAL_10>": 10, "<SPECIAL_11>": 11, "<SPECIAL_12>": 12,
                        "<pad>": 13, "<image>": 131072, "<img>": 131073, "</img>": 131074}  # fmt: skip


@cache
def nemotron_vl_tokenizer() -> Any:
    from pathlib import Path

    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = dict(NEMOTRON_VL_SPECIALS)
    for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet())):
        vocab[c] = 100 + i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(NEMOTRON_VL_SPECIALS))
    template = Path(__file__).parent / "data" / "chat_templates" / "nemotron_vl.jinja"
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
        chat_template=template.read_text(),
    )  # fmt: skip


def nemotron_vl_checkpoint(folder: Any, **config: Any) -> Any:
    """A local Nemotron-VL checkpoint folder without weights: the tokenizer (with its chat template) and a
    ``config.json`` with the tiling and normalization keys the preparer reads (``config`` overrides)."""
    import json
    from pathlib import Path

    folder = Path(folder)
    nemotron_vl_tokenizer().save_pretrained(folder)
    values = {"model_type": "NemotronH_Nano_VL_V2", "force_image_size": 512, "patch_size": 16,
              "downsample_ratio": 0.5, "use_thumbnail": True, "norm_mean": [0.48, 0.46, 0.41],
              "norm_std": [0.27, 0.26, 0.28], **config}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(values))
    return folder
