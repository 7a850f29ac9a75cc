"""VLM samples: image/video messages -> Qwen-VL processor -> expanded tokens, labels and pixel tensors.

No knowledge of packing; ``longpack.runtime.in_batch.build_visual_thd_batch`` packs prepared sequences and
``longpack.online.vlm`` packs them online in Energon. Needs the ``vlm`` extra (transformers, Pillow) for
preparation; the size rule (:mod:`longpack.vlm.vision`) and the rope index are pure Python/numpy.

Public API::

    VisionConfig, VLMConfig, VLMStats, PreparedSequence, SampleLength, SampleError, SampleRejected, VLMError
    QwenVLPreparer(tokenizer="qwen3", image_processor=None, config=VLMConfig()).prepare(sample)
        -> PreparedSequence;  .length(sample) -> SampleLength (no pixel decoded);  .measure(sample): length
        with the limits applied
    longpack.vlm.families.vlm_family(name): the family registry;  longpack.vlm.video: PyAV frames
    smart_resize, image_grid_thw, visual_token_count, image_size, decode_image
    mrope_position_ids(input_ids, image_grid_thw, ..., image_token_id, video_token_id, merge_size)
    normalize_conversation(sample), render_pieces(messages)

Example (sizes only; no processor needed)::

    >>> visual_token_count(1920, 1080, VisionConfig())
    1222
"""

from longpack.vlm.chat import normalize_conversation, render_pieces
from longpack.vlm.errors import REJECT_REASONS, SampleError, SampleRejected, VLMError
from longpack.vlm.prepare import (
    PreparedSequence,
    QwenVLPreparer,
    SampleLength,
    VLMConfig,
    VLMStats,
    prepared_nbytes,
)
from longpack.vlm.rope import mrope_position_ids
from longpack.vlm.vision import (
    VisionConfig,
    decode_image,
    image_grid_thw,
    image_size,
    smart_resize,
    visual_token_count,
)

__all__ = [
    "REJECT_REASONS",
    "PreparedSequence",
    "QwenVLPreparer",
    "SampleError",
    "SampleLength",
    "SampleRejected",
    "VLMConfig",
    "VLMError",
    "VLMStats",
    "VisionConfig",
    "decode_image",
    "image_grid_thw",
    "image_size",
    "mrope_position_ids",
    "normalize_conversation",
    "prepared_nbytes",
    "render_pieces",
    "smart_resize",
    "visual_token_count",
]
