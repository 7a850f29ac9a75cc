"""Prepared VLM sequences with the real processor: tokens, labels, loss mask, pixels, lengths, limits.

Oracles: transformers' ``Qwen2VLImageProcessor()`` on the same images, the Qwen2-VL Instruct chat template
(rendered with jinja2), and the definition of Megatron-Bridge's prepared row (``prepare_qwen_vl_sequence``:
labels = ids shifted left with -100 at the end and on unsupervised positions, loss mask = assistant mask
shifted left, position ids = arange).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from longpack.errors import ConfigError
from longpack.vlm import (
    QwenVLPreparer,
    SampleRejected,
    VisionConfig,
    VLMConfig,
    VLMError,
    normalize_conversation,
    prepared_nbytes,
    render_pieces,
)
from vlm_helpers import image_processor, make_image, png_bytes, preparer, random_samples

pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

# The chat template of Qwen2-VL-2B-Instruct (its tokenizer_config.json): what render_pieces must produce.
QWEN2_VL_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: "
    "{% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
IMAGE_PAD = 151655


def template_text(messages) -> str:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    return (
        ImmutableSandboxedEnvironment()
        .from_string(QWEN2_VL_TEMPLATE)
        .render(messages=messages, add_generation_prompt=False)
    )


def test_rendering_equals_the_qwen2_vl_template() -> None:
    for sample in random_samples(30, seed=1):
        messages = normalize_conversation(sample)
        assert "".join(text for text, _ in render_pieces(messages)) == template_text(messages)
    with_system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "<image>hi"}]
    messages = normalize_conversation({"messages": with_system}, images=["x"])
    assert "".join(t for t, _ in render_pieces(messages)) == template_text(messages)


def test_prepared_row_matches_processor_and_bridge_definition() -> None:
    prep = preparer()
    tok = prep.tokenizer
    for sample in random_samples(25, seed=2):
        seq = prep.prepare(sample)
        row, visual = seq.row, seq.visual_values
        ids = row["input_ids"]
        n = ids.numel()
        assert {k: (v.dtype, tuple(v.shape)) for k, v in row.items()} == {
            "input_ids": (torch.int64, (n,)),
            "attention_mask": (torch.int64, (n,)),
            "position_ids": (torch.int64, (n,)),
            "labels": (torch.int64, (n,)),
            "loss_mask": (torch.float32, (n,)),
        }
        assert row["attention_mask"].eq(1).all() and row["position_ids"].equal(torch.arange(n))
        images = sample["images"]
        if images:
            expected = image_processor()(images=images, return_tensors="pt")
            assert torch.equal(visual["pixel_values"], expected["pixel_values"])
            assert torch.equal(visual["image_grid_thw"], expected["image_grid_thw"])
            assert int((ids == IMAGE_PAD).sum()) == int(expected["image_grid_thw"].prod(-1).sum()) // 4
            assert seq.visual_tokens == int((ids == IMAGE_PAD).sum())
        else:
            assert visual == {} and seq.visual_tokens == 0
        # Labels: the next token where the shifted loss mask is 1, else -100; never a vision pad.
        labels, loss = row["labels"], row["loss_mask"]
        nxt = torch.cat([ids[1:], torch.tensor([-100])])
        assert torch.equal(labels, torch.where(loss == 1, nxt, torch.full_like(nxt, -100)))
        assert set(loss.unique().tolist()) <= {0.0, 1.0}
        # Supervised text: every assistant answer with its <|im_end|> and the newline after it.
        answers = [m["content"] for m in sample["messages"] if m["role"] == "assistant"]
        assert tok.decode(labels[labels != -100].tolist()) == "".join(a + "<|im_end|>\n" for a in answers)
        assert seq.nbytes == prepared_nbytes(
            n, visual.get("image_grid_thw", torch.zeros(0, 3)).tolist(), prep.vision
        )


def test_length_without_decoding_equals_the_prepared_length(tmp_path) -> None:
    """``length()`` reads only image sizes (headers of PNG files, or given sizes): equal to ``prepare()``."""
    prep = preparer()
    for i, sample in enumerate(random_samples(25, seed=3, max_images=4, max_side=400)):
        files = []
        for j, image in enumerate(sample["images"]):
            path = tmp_path / f"{i}_{j}.png"
            image.save(path)
            files.append(str(path))
        on_disk = {**sample, "images": files}
        prepared = prep.prepare(on_disk)
        by_header = prep.length(on_disk)
        by_size = prep.length(sample, image_sizes=[im.size for im in sample["images"]])
        assert by_header == by_size
        assert by_header.tokens == prepared.sequence_length
        assert by_header.visual_tokens == prepared.visual_tokens
        assert by_header.prepared_nbytes == prepared.nbytes


def test_parts_placeholders_and_sharegpt_give_the_same_row() -> None:
    prep = preparer()
    image = make_image(64, 48, 5)
    forms = [
        {"messages": [{"role": "user", "content": "<image> Describe."}, {"role": "assistant", "content": "Noise."}],
         "images": [image]},
        {"conversations": [{"from": "human", "value": "<image>Describe."}, {"from": "gpt", "value": "Noise."}],
         "images": [image]},
        {"messages": [{"role": "user", "content": [{"type": "image", "image": image},
                                                   {"type": "text", "text": "Describe."}]},
                      {"role": "assistant", "content": [{"type": "text", "text": "Noise."}]}]},
        {"messages": [{"role": "user", "content": [{"type": "image", "image": png_bytes(64, 48, 5)},
                                                   {"type": "text", "text": "Describe."}]},
                      {"role": "assistant", "content": "Noise."}]},
    ]  # fmt: skip
    rows = [prep.prepare(s).row for s in forms]
    for row in rows[1:]:
        assert all(torch.equal(row[k], rows[0][k]) for k in row)


def test_limits_skip_with_counts_and_reasons(tmp_path) -> None:
    prep = QwenVLPreparer(
        "qwen3",
        image_processor(),
        config=VLMConfig(max_images=2, max_visual_tokens=100, max_length=64, pad_to_multiple_of=8),
    )
    small = make_image(56, 56)  # 4 visual tokens
    big = make_image(300, 300)  # 121 visual tokens
    data = png_bytes(300, 300)
    (tmp_path / "cut.png").write_bytes(data[: len(data) // 2])  # header intact, pixels cut
    (tmp_path / "garbage.png").write_bytes(b"\x89PNG not really")
    chat = [{"role": "user", "content": "<image>Q"}, {"role": "assistant", "content": "A"}]
    cases = [
        ({"messages": [{"role": "user", "content": "<image><image><image>Q"}, chat[1]], "images": [small] * 3},
         "too_many_images", "3 images > max_images=2"),
        ({"messages": chat, "images": [big]}, "visual_tokens", "121 visual tokens > max_visual_tokens=100"),
        # Refused from the header alone: its pixels are never decoded (they could not be).
        ({"messages": chat, "images": [str(tmp_path / "cut.png")]}, "visual_tokens", "121 visual tokens"),
        ({"messages": chat, "images": [str(tmp_path / "garbage.png")]}, "undecodable", "garbage.png cannot be read"),
        ({"messages": chat, "images": [str(tmp_path / "missing.png")]}, "undecodable", "missing.png cannot be read"),
        ({"messages": [chat[0], {"role": "assistant", "content": "word " * 40}], "images": [small]},
         "too_long", r"tokens after expanding 4 visual tokens \(aligned to 8: \d+\) > max_length=64"),
    ]  # fmt: skip
    for i, (sample, reason, message) in enumerate(cases):
        with pytest.raises(SampleRejected, match=rf"sample k{i}: .*{message}") as info:
            prep.prepare(sample, key=f"k{i}")
        assert info.value.reason == reason
    assert prep.try_prepare({"messages": chat, "images": [small]}, key="ok") is not None
    assert prep.try_prepare({"messages": chat, "images": [big]}, key="big") is None
    stats = prep.stats.as_dict()
    assert {k: v for k, v in stats["rejected"].items() if v} == {
        "visual_tokens": 3,
        "too_many_images": 1,
        "too_long": 1,
        "undecodable": 2,
    }
    assert stats["prepared"] == 1 and stats["skipped"] == 7 and len(stats["examples"]) == 7


def test_truncated_image_fails_to_decode_with_its_file(tmp_path) -> None:
    data = png_bytes(60, 60)
    path = tmp_path / "half.png"
    path.write_bytes(data[: len(data) // 2])
    chat = [{"role": "user", "content": "<image>Q"}, {"role": "assistant", "content": "A"}]
    with pytest.raises(
        SampleRejected, match=r"sample s9: image .*half.png cannot be decoded \(OSError"
    ) as info:
        preparer().prepare({"__key__": "s9", "messages": chat, "images": [str(path)]})
    assert info.value.reason == "undecodable"


def test_structural_errors_are_named() -> None:
    prep = preparer()
    chat = [{"role": "user", "content": "<image>Q"}, {"role": "assistant", "content": "A"}]
    with pytest.raises(
        VLMError, match="more image placeholders / image parts without a source than the 0 images"
    ):
        prep.prepare({"messages": chat})
    with pytest.raises(VLMError, match="2 images given but the conversation places 1"):
        prep.prepare({"messages": chat, "images": [make_image(30, 30)] * 2})
    with pytest.raises(VLMError, match="unknown role 'robot'"):
        prep.prepare({"messages": [{"role": "robot", "content": "x"}]})
    with pytest.raises(VLMError, match=r"video cannot be read .*encoded bytes or a file path, not a ndarray"):
        prep.prepare(
            {"messages": [{"role": "user", "content": "<video>"}], "videos": [np.zeros((2, 28, 28, 3))]}
        )
    with pytest.raises(VLMError, match=r"has no <\|image_pad\|>, <\|video_pad\|> token"):
        QwenVLPreparer("bytes", image_processor())
    with pytest.raises(ConfigError, match="chat_template='llama'"):
        VLMConfig(chat_template="llama")
    with pytest.raises(VLMError, match="the image processor made grids"):
        QwenVLPreparer(
            "qwen3", image_processor(), config=VLMConfig(vision=VisionConfig(patch_size=16))
        ).prepare({"messages": chat, "images": [make_image(100, 100)]})
