"""Energon online packing of VLM samples (Qwen2/2.5/3-VL and Gemma3-VL): task encoders whose buffers hold
measured or prepared sequences.

Needs ``megatron-energon`` and the ``vlm`` extra. It follows Megatron-Bridge's native Energon packing for
Qwen-VL (``models/qwen_vl/data/energon.py``, ``QwenVLTaskEncoder(enable_energon_packing=True)``) on the same
Energon hooks (see docs/guide/online-sim.md and Energon's ``TaskEncoder`` packing hooks):

- ``preencode_sample`` (``@stateless``, failure tolerance 100) measures the sample from its image headers
  (:meth:`longpack.vlm.QwenVLPreparer.measure`: exact tokens after expansion, limits applied, no pixel
  decoded), so the packing buffer holds ``packing_buffer_size`` candidates per worker as encoded image bytes
  and token counts (**deferred decoding**); ``postencode_sample`` decodes and prepares the members of a pack
  about to be emitted. :class:`EagerQwenVLPackingEncoder` prepares in ``encode_sample`` instead, as Bridge
  does, and its buffer holds prepared pixel tensors (same packs and batches). A sample refused by a limit or
  by a problem of its own (too many images, too many visual tokens, longer than ``seq_length`` after
  expansion and alignment, an image that does not decode, an aspect ratio above 200, an empty image,
  ``<image>`` placeholders that do not match its images, no readable conversation: the reasons of
  ``longpack.vlm.REJECT_REASONS``) becomes a *refused* member: it holds no tensors, joins the first group of
  its buffer and is reported in that batch's ``skipped`` records ``{"key", "reason", "message"}``. So every
  sample is accounted for exactly once (packed or reported), the report is as deterministic as the packs (it
  survives save/restore), and Energon's failure handler (which logs a traceback and drops the sample
  uncounted) is left to real errors. A buffer whose every sample is refused gives a batch of one padding
  sequence (loss mask 0, ``sample_keys == []``) that carries the records;
- ``select_samples_to_pack`` partitions one buffer by aligned length (``ceil(L / m) * m``) with capacity
  ``seq_length``; the default ``first_fit_decreasing`` gives Bridge's groups and member order
  (``longpack.binpack.megatron.first_fit_decreasing``); other ``longpack.binpack.ALGORITHMS`` keep buffer
  order inside a pack. Every sample is in exactly one group (Energon drops samples left out);
- ``pack_selected_samples`` (``@stateless``) wraps the group; ``batch`` (``@stateless``, one pack per
  micro-batch: native packing requires ``micro_batch_size=1``) builds the THD row with
  :func:`longpack.runtime.in_batch.build_visual_thd_batch` (Bridge's ``build_qwen_vl_packed_batch`` keys,
  plus ``mrope_position_ids``, ``padding_mask`` when asked, ``sample_keys``, ``skipped``).

:class:`VisualInBatchEncoder` is the other Energon path of Bridge's (its generic HF-encoder task encoder,
``HFTaskEncoder(enable_in_batch_packing=True)``): no packing buffer, ``micro_batch_size > 1``, each
micro-batch packed into one THD row in ``batch``.

**Families.** The preparer decides the family: a :class:`longpack.vlm.QwenVLPreparer` (``vlm_family(name)
.preparer(...)`` for ``qwen2_vl``, ``qwen2_5_vl``, ``qwen3_vl``) gives the keys above with ``image_grid_thw``
and 3-D ``mrope_position_ids``; a :class:`longpack.vlm.families.Gemma3Preparer` (a transformers
``Gemma3Processor``) gives the keys of Bridge's ``gemma3_vl_collate_fn(enable_in_batch_packing=True)``: 1-D
``position_ids`` restarting at each sequence, ``visual_inputs["pixel_values"]`` one bfloat16 image per
``[3, side, side]`` entry, no grids and no ``mrope_position_ids``. Gemma3-VL has no aspect-ratio limit
(images are resized to a square) and no video input (a sample with a video member is refused,
``unsupported_video``, and listed in its pack's ``skipped`` records; so is a Qwen3-VL video given as a frame
list, which has no frame rate for Qwen3-VL's timestamps).
Nemotron-VL is refused when the encoder is built: its packs must be budgeted on the length after the LLaVA
model expands each ``<image>``, not on the collated tokens these encoders count (prepare its samples with
``NemotronVLPreparer`` and pack them with ``build_nemotron_vl_thd_batch``).

Samples come from a ``CrudeWebdataset`` (``energon prepare --sample-type CrudeWebdataset``): each sample has a
``json`` member with the conversation (``messages`` or ``conversations``, ``<image>`` placeholders) and image
members ``img0.png``, ``img1.jpg``, ... (any ``img<N>.<ext>``, in ``N`` order) and video members ``vid0.mp4``,
... (any ``vid<N>.<ext>`` a PyAV build reads, filling ``<video>`` placeholders in ``N`` order: Energon's
multi-image / video samples). The encoder sets ``decoder = None`` so media arrive as encoded bytes and longpack
decodes them (a broken image or video names its sample key and the decoder's reason, instead of failing inside
Energon's decoder). A video is measured from its container header (frame count, rate and size: frames sampled
and grids as transformers' ``Qwen2VLVideoProcessor``, :mod:`longpack.vlm.video`) and its sampled frames are
decoded with PyAV only when its pack is emitted; a video that cannot be read is ``undecodable``, one with no
frame to sample ``empty_video``, one whose tokens do not fit the pack ``too_long`` (or ``visual_tokens``).
Megatron-Bridge's own video members are read too: ``jpgs`` (a pickled list of encoded frames: one video),
``mp4s`` / ``videos`` (a pickled list of such lists), frames pre-extracted at the wanted rate; as Bridge's
``QwenVLTaskEncoder`` does, the first ``VideoConfig.max_num_frames`` (60) are kept and none is resampled.

Save and restore the loader with :func:`longpack.online.energon.save_loader_state` /
``restore_loader_state`` and pass this encoder: its :meth:`QwenVLPackingEncoder.packing_config` (seq_length,
alignment, selection, tokenizer and vision settings) is stored with the state and compared on restore.

Example::

    encoder = QwenVLPackingEncoder(QwenVLPreparer("qwen3"), seq_length=4096, pad_to_multiple_of=8)
    ds = get_train_dataset(path, worker_config=wc, batch_size=1, packing_buffer_size=16, task_encoder=encoder,
                           shuffle_buffer_size=100, max_samples_per_sequence=None)
    for batch in get_savable_loader(ds):
        batch["input_ids"], batch["cu_seqlens_q"], batch["visual_inputs"]["pixel_values"], batch["skipped"]
"""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import pickle
import re
from typing import Any

import numpy as np
from megatron.energon import Cooker, DefaultTaskEncoder, Sample, basic_sample_keys, stateless
from megatron.energon.errors import FatalSampleError
from megatron.energon.worker import WorkerConfig

from longpack import binpack, choices
from longpack.binpack.megatron import first_fit_decreasing
from longpack.errors import OnlineError
from longpack.online.packer import select_packs
from longpack.runtime.in_batch import build_visual_thd_batch
from longpack.topology import align_up
from longpack.vlm.errors import SampleRejected, VLMError
from longpack.vlm.families import Gemma3Preparer
from longpack.vlm.prepare import PreparedSequence, QwenVLPreparer

_IMAGE_FIELD = re.compile(r"^img(\d+)\.\w+$")
_VIDEO_FIELD = re.compile(r"^vid(\d+)\.\w+$")
# Megatron-Bridge's video members (``data/energon/task_encoder_utils.py`` ``videohandler``): a pickled list of
# encoded frames (``jpgs``: one video) or of such lists (``mp4s``, ``videos``: one per video).
_FRAME_LIST_FIELDS = ("jpgs", "mp4s", "videos")


class _PlainUnpickler(pickle.Unpickler):
    """Unpickles lists, tuples and bytes only: a frame list names no class, so any lookup is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def _frame_lists(data: Any, *, one_video: bool) -> list[list[bytes]]:
    """The videos of a Bridge video member, each a list of encoded frames."""
    try:
        value = _PlainUnpickler(io.BytesIO(bytes(data))).load()
    except Exception as exc:  # a member that is not a plain pickle is the sample's problem, not Energon's
        raise ValueError(f"{type(exc).__name__}: {exc}") from None
    videos = [value] if one_video else value
    if not isinstance(videos, list | tuple) or not all(
        isinstance(v, list | tuple) and all(isinstance(f, bytes | bytearray) for f in v) for v in videos
    ):
        raise ValueError("expected lists of bytes")
    return [list(v) for v in videos]


FAILURE_TOLERANCE = 100  # Bridge's bound on consecutive failures of encode_sample


@dataclasses.dataclass(kw_only=True, slots=True)
class VLMChatSample(Sample):
    """A cooked sample: the conversation (parsed JSON) and its images and videos as encoded bytes, in order."""

    conversation: dict[str, Any]
    images: list[bytes]
    videos: list[Any] = dataclasses.field(default_factory=list)  # encoded files or lists of encoded frames
    problem: str | None = None  # why the crude sample could not be read (reported as ``malformed``)


@stateless
def cook_vlm_sample(raw: dict[str, Any]) -> VLMChatSample:
    """Crude WebDataset sample (``json`` + ``img<N>.<ext>`` / ``vid<N>.<ext>`` / Bridge's ``jpgs``, ``mp4s``,
    ``videos`` members) -> :class:`VLMChatSample`. A sample without a readable ``json`` member, or with a video
    member that is not a plain pickled frame list, is cooked with ``problem`` set (the encoder reports it as
    ``malformed``) instead of failing inside Energon, which would log a traceback and drop it uncounted."""
    found = sorted((int(m.group(1)), k) for k in raw if (m := _IMAGE_FIELD.match(k)))
    images = [raw[k] for _, k in found]
    found_videos = sorted((int(m.group(1)), k) for k in raw if (m := _VIDEO_FIELD.match(k)))
    videos: list[Any] = [raw[k] for _, k in found_videos]
    problem = None
    for name in _FRAME_LIST_FIELDS:  # Bridge's pre-extracted frames (its ``videohandler``)
        if name in raw and problem is None:
            try:
                videos += _frame_lists(raw[name], one_video=name == "jpgs")
            except ValueError as exc:
                problem = f"the {name!r} member is not a pickled list of encoded frames ({exc})"
    conversation: Any = {}
    if "json" not in raw:
        problem = f"no 'json' member (has {sorted(k for k in raw if k[0] != '_')})"
    else:
        data = raw["json"]
        try:
            conversation = json.loads(data) if isinstance(data, bytes | str) else data
        except (ValueError, UnicodeDecodeError) as exc:
            problem = f"the 'json' member is not JSON ({exc})"
        if problem is None and not isinstance(conversation, dict):
            problem = f"the 'json' member must be an object, got {type(conversation).__name__}"
    if problem is not None:
        conversation = {}
    return VLMChatSample(
        **basic_sample_keys(raw), conversation=conversation, images=images, videos=videos, problem=problem
    )


@dataclasses.dataclass(kw_only=True, slots=True)
class VLMTaskSample(Sample):
    """A sample in the packing buffer. Deferred (:class:`QwenVLPackingEncoder`): its conversation, its images
    as encoded bytes and its exact ``length`` (tokens after expansion, from the image headers);
    ``prepared`` is filled once it is selected. Eager (:class:`EagerQwenVLPackingEncoder`): the prepared
    sequence (token rows and pixel tensors). A refused sample has ``rejected = {"key", "reason", "message"}``
    and nothing else."""

    prepared: PreparedSequence | None
    rejected: dict[str, str] | None
    length: int = 0
    conversation: dict[str, Any] | None = None
    images: list[bytes] | None = None
    videos: list[Any] | None = None


@dataclasses.dataclass(kw_only=True, slots=True)
class VLMPackedSample(Sample):
    """One selected group, in row order."""

    samples: list[VLMTaskSample]


class _VLMPackingEncoder(DefaultTaskEncoder):
    """What both VLM packing encoders share: settings, selection, pack and batch (see the module
    docstring and :class:`QwenVLPackingEncoder` for the arguments)."""

    decoder = None  # raw bytes: longpack decodes images itself and reports the ones that fail
    cookers = (Cooker(cook_vlm_sample),)

    def __init__(
        self,
        preparer: QwenVLPreparer | Gemma3Preparer,
        *,
        seq_length: int,
        pad_to_multiple_of: int = 1,
        pad_to_max_length: bool = False,
        emit_padding_mask: bool | None = None,
        algorithm: str = choices.FIRST_FIT_DECREASING,
        seed: int = 0,
    ) -> None:
        super().__init__()
        for name, value in (("seq_length", seq_length), ("pad_to_multiple_of", pad_to_multiple_of)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise OnlineError(f"{name} must be a positive integer, got {value!r}", fields=name)
        if seq_length % pad_to_multiple_of:
            raise OnlineError(
                f"seq_length={seq_length} is not a multiple of pad_to_multiple_of={pad_to_multiple_of} (Bridge "
                "requires seq_length % the CP/SP multiple == 0)",
                fields="seq_length",
            )
        if algorithm not in binpack.ALGORITHMS:
            raise OnlineError(
                f"algorithm={algorithm!r} is not one of {binpack.ALGORITHMS}", fields="algorithm"
            )
        preparer = _packing_preparer(preparer)
        # A copy whose length limit is the pack width (the caller's preparer keeps its own settings).
        self.preparer = copy.copy(preparer)
        self.preparer.config = dataclasses.replace(
            preparer.config, max_length=seq_length, pad_to_multiple_of=pad_to_multiple_of
        )
        self.preparer.stats = type(preparer.stats)()
        self.seq_length = seq_length
        self.pad_to_multiple_of = pad_to_multiple_of
        self.pad_to_max_length = pad_to_max_length
        self.emit_padding_mask = (
            (pad_to_multiple_of > 1 or pad_to_max_length) if emit_padding_mask is None else emit_padding_mask
        )
        self.algorithm = algorithm
        self.seed = seed
        # Qwen-VL rows carry 3-D positions (``mrope_position_ids``); Gemma3-VL rows have 1-D positions only.
        self.mrope = self.preparer.position_dims == 3

    def packing_config(self) -> dict[str, Any]:
        """The settings that decide which samples form a pack and what a pack holds."""
        return {
            "seq_length": self.seq_length,
            "pad_to_multiple_of": self.pad_to_multiple_of,
            "pad_to_max_length": self.pad_to_max_length,
            "emit_padding_mask": self.emit_padding_mask,
            "algorithm": self.algorithm,
            "seed": self.seed,
            "preparer": self.preparer.identity(),
        }

    # ------------------------------------------------------------------ Energon hooks
    def _refused(self, sample: Sample, exc: SampleRejected) -> VLMTaskSample:
        record = {"key": exc.key, "reason": exc.reason, "message": str(exc)}
        return VLMTaskSample.derive_from(sample, prepared=None, rejected=record)

    def select_samples_to_pack(self, samples: list[VLMTaskSample]) -> list[list[VLMTaskSample]]:
        """Partition one candidate buffer into groups of aligned length at most ``seq_length``; refused
        members join the first group (they hold no tokens)."""
        accepted = [s for s in samples if s.rejected is None]
        refused = [s for s in samples if s.rejected is not None]
        lengths = [align_up(s.length, self.pad_to_multiple_of) for s in accepted]
        if any(n > self.seq_length for n in lengths):
            raise OnlineError(
                f"a buffered sample is longer than seq_length={self.seq_length} (aligned {max(lengths)})"
            )
        groups: list[list[VLMTaskSample]] = []
        if accepted and self.algorithm == choices.FIRST_FIT_DECREASING:
            groups = first_fit_decreasing(accepted, self.seq_length, item_lengths=lengths)
        elif accepted:
            picks = select_packs(
                np.asarray(lengths, dtype=np.int64),
                self.seq_length,
                algorithm=self.algorithm,
                seed=self._seed(),
            )
            groups = [[accepted[j] for j in g.tolist()] for g in picks]
        if refused:
            if groups:
                groups[0] = [*groups[0], *refused]
            else:
                groups = [refused]  # a buffer of refused samples only: its batch is skipped, see batch()
        return groups

    def _seed(self) -> int:
        config = WorkerConfig.active_worker_config
        worker_seed = config.worker_seed() if config is not None else 0
        index = int(self.current_sample_index) if config is not None else 0
        return int(
            np.random.SeedSequence([self.seed, worker_seed, index]).generate_state(1, dtype=np.uint32)[0]
        )

    @stateless
    def pack_selected_samples(self, samples: list[VLMTaskSample]) -> VLMPackedSample:
        """Wrap one selected group (Energon assigns its restore key)."""
        if not samples:
            raise OnlineError("cannot pack an empty group")
        return VLMPackedSample(
            __key__=",".join(s.__key__ for s in samples),
            __restore_key__=(),
            __subflavors__={},
            samples=samples,
        )

    @stateless
    def batch(self, samples: list[VLMPackedSample]) -> dict[str, Any]:
        """One THD row from one pack (native packing: ``micro_batch_size=1``)."""
        if len(samples) != 1 or not isinstance(samples[0], VLMPackedSample):
            raise OnlineError(
                f"native VLM packing needs micro_batch_size=1 (one pack per micro-batch), got {len(samples)}"
            )
        members = [_prepared(s) for s in samples[0].samples if s.rejected is None]
        skipped = [s.rejected for s in samples[0].samples if s.rejected is not None]
        if not members:
            # A whole buffer of refused samples: a batch of one padding sequence that trains nothing
            # (loss mask 0, no pixels) carries their records, so no refusal is lost from the report.
            pad_id = int(getattr(self.preparer, "pad_token_id", 0))
            out = build_visual_thd_batch(
                [_padding_sequence(max(2, self.pad_to_multiple_of), mrope=self.mrope, pad_token_id=pad_id)],
                sequence_length=self.seq_length,
                pad_to_multiple_of=self.pad_to_multiple_of,
                pad_to_max_length=self.pad_to_max_length,
                emit_padding_mask=self.emit_padding_mask,
            )
            out["sample_keys"] = []
            out["skipped"] = skipped
            return out
        total = sum(align_up(p.sequence_length, self.pad_to_multiple_of) for p in members)
        if total > self.seq_length:
            raise OnlineError(f"packed group length {total} exceeds seq_length={self.seq_length}")
        out = build_visual_thd_batch(
            members,
            sequence_length=self.seq_length,
            pad_to_multiple_of=self.pad_to_multiple_of,
            pad_to_max_length=self.pad_to_max_length,
            emit_padding_mask=self.emit_padding_mask,
        )
        out["sample_keys"] = [p.key for p in members]
        out["skipped"] = skipped
        return out


class QwenVLPackingEncoder(_VLMPackingEncoder):
    """Energon task encoder for native (online) packing of VLM samples with **deferred decoding**: the
    packing buffer holds each candidate's encoded image bytes and its exact token count (from the image
    headers, the preparer's ``measure``); pixels are decoded and processed only for the
    members of a pack about to be emitted (Energon's ``preencode_sample`` / ``postencode_sample`` hooks).
    Packs, batches and refusal records are those of :class:`EagerQwenVLPackingEncoder`; only a problem
    that shows when decoding (an image whose header reads but whose pixels do not) is refused when its pack
    is emitted, as a member of that pack.

    ``seq_length``: pack width in tokens (Bridge's ``seq_length``); ``pad_to_multiple_of``: per-sequence
    alignment for CP/SP (``lcm(2*CP, CP*TP)``); ``pad_to_max_length``: fixed-width packs (Bridge forces it with
    PP > 1 or EP > 1); ``emit_padding_mask``: add the gap mask for MoE router statistics (default: when
    ``pad_to_multiple_of > 1`` or fixed width). The preparer's ``max_length`` is set to ``seq_length``.
    ``preparer``: a :class:`longpack.vlm.QwenVLPreparer` or :class:`longpack.vlm.families.Gemma3Preparer`
    (the family follows from it, see the module docstring); a family without a preparer is refused."""

    @stateless(failure_tolerance=FAILURE_TOLERANCE)
    def preencode_sample(self, sample: VLMChatSample) -> VLMTaskSample:
        """Measure one sample from its image headers (no pixel decoded); a refusal becomes a refused member."""
        conversation = _media(sample.conversation, sample.images, sample.videos)
        try:
            if sample.problem is not None:
                raise SampleRejected(sample.__key__, "malformed", sample.problem)
            length = self.preparer.measure(conversation, key=sample.__key__)
        except SampleRejected as exc:  # every problem of one sample (limits, images, placeholders, structure)
            return self._refused(sample, exc)
        except VLMError as exc:  # a setting that fails every sample: stop, do not drop samples one by one
            raise _fatal(sample, exc) from exc
        return VLMTaskSample.derive_from(
            sample,
            prepared=None,
            rejected=None,
            length=length.tokens,
            conversation=dict(sample.conversation),
            images=list(sample.images),
            videos=list(sample.videos),
        )

    @stateless(failure_tolerance=FAILURE_TOLERANCE)
    def postencode_sample(self, sample: VLMTaskSample) -> VLMTaskSample:
        """Decode and prepare a selected sample (its pack is about to be emitted)."""
        if sample.rejected is not None:
            return sample
        conversation = _media(sample.conversation or {}, sample.images or [], sample.videos or [])
        try:
            prepared = self.preparer.prepare(conversation, key=sample.__key__)
        except SampleRejected as exc:
            return self._refused(sample, exc)
        except VLMError as exc:
            raise _fatal(sample, exc) from exc
        if prepared.sequence_length != sample.length:
            raise FatalSampleError(
                f"sample {sample.__key__}: prepared {prepared.sequence_length} tokens but measured {sample.length} "
                "from the image headers; the image processor does not follow the configured resize rule"
            )
        return VLMTaskSample.derive_from(sample, prepared=prepared, rejected=None, length=sample.length)


class EagerQwenVLPackingEncoder(_VLMPackingEncoder):
    """:class:`QwenVLPackingEncoder` without deferred decoding (Megatron-Bridge's native Energon packing
    does this): ``encode_sample`` prepares every sample when it enters the buffer, so the buffer holds
    prepared pixel tensors of ``packing_buffer_size`` candidates per worker. Same packs and batches."""

    @stateless(failure_tolerance=FAILURE_TOLERANCE)
    def encode_sample(self, sample: VLMChatSample) -> VLMTaskSample:
        """Prepare one sample (its pixel tensors wait in the packing buffer); a refusal becomes a refused
        member with its reason."""
        conversation = _media(sample.conversation, sample.images, sample.videos)
        try:
            if sample.problem is not None:
                raise SampleRejected(sample.__key__, "malformed", sample.problem)
            prepared = self.preparer.prepare(conversation, key=sample.__key__)
        except SampleRejected as exc:  # every problem of one sample (limits, images, placeholders, structure)
            return self._refused(sample, exc)
        except VLMError as exc:  # a setting that fails every sample: stop, do not drop samples one by one
            raise _fatal(sample, exc) from exc
        return VLMTaskSample.derive_from(
            sample, prepared=prepared, rejected=None, length=prepared.sequence_length
        )


#: The keys of Bridge's ``HFEnergonBatch`` after ``HFTaskEncoder.encode_batch`` (``data/energon/hf_task_encoder.py``).
HF_ENCODER_BATCH_KEYS = (
    "input_ids",
    "labels",
    "loss_mask",
    "position_ids",
    "visual_inputs",
    "attention_mask",
    "padding_mask",
    "cu_seqlens_q",
    "cu_seqlens_kv",
    "cu_seqlens_q_padded",
    "cu_seqlens_kv_padded",
    "max_seqlen_q",
    "max_seqlen_kv",
    "total_tokens",
)


class VisualInBatchEncoder(EagerQwenVLPackingEncoder):
    """Energon task encoder for collate-time ("in-batch") packing at ``micro_batch_size > 1``: each
    micro-batch Energon forms becomes one THD row, as Megatron-Bridge's generic HF-encoder task encoder does
    (``data/energon/hf_task_encoder.py`` ``HFTaskEncoder(enable_in_batch_packing=True)``, Bridge @a4c24ae23;
    the ``HFEnergonTaskEncoderConfig`` of ``EnergonDatasetConfig``, whose Energon packing buffer Bridge
    refuses). ``encode_sample`` prepares each sample (refused ones become members with a record, as in
    :class:`EagerQwenVLPackingEncoder`; one longer than ``seq_length`` after expansion is ``too_long``, where
    Bridge's collate raises for the whole micro-batch), ``batch`` packs the micro-batch's members in order with
    :func:`longpack.runtime.in_batch.build_visual_thd_batch` (the keys of the family's Bridge collate:
    ``gemma3_vl_collate_fn`` for a :class:`~longpack.vlm.families.Gemma3Preparer`, ``qwen2_5_collate_fn`` for a
    :class:`~longpack.vlm.QwenVLPreparer`, each with ``enable_in_batch_packing=True``), plus ``sample_keys``
    and ``skipped``; every key of Bridge's ``HFEnergonBatch`` is present (``None`` where the collate has none,
    e.g. ``cu_seqlens_q_padded`` without alignment). ``padding_mask`` only with ``emit_padding_mask=True`` (for
    MoE router statistics; Bridge's Gemma3 collate has none). The row is as wide as its members (``micro_batch_size * seq_length`` at most), or exactly
    ``seq_length`` with ``pad_to_max_length`` (then the aligned members must fit it). Do not give Energon a
    ``packing_buffer_size`` with it (refused when Energon asks for a pack): use :class:`QwenVLPackingEncoder`.

    Example::

        encoder = VisualInBatchEncoder(Gemma3Family().preparer(processor=processor), seq_length=4096,
                                       pad_to_multiple_of=8)
        ds = get_train_dataset(path, worker_config=wc, batch_size=4, task_encoder=encoder,
                               shuffle_buffer_size=100, max_samples_per_sequence=None)
        for batch in get_savable_loader(ds):   # one THD row of (up to) 4 samples
            batch["cu_seqlens_q"], batch["visual_inputs"]["pixel_values"], batch["skipped"]
    """

    def __init__(
        self,
        preparer: QwenVLPreparer | Gemma3Preparer,
        *,
        seq_length: int,
        pad_to_multiple_of: int = 1,
        pad_to_max_length: bool = False,
        emit_padding_mask: bool = False,
    ) -> None:
        super().__init__(
            preparer,
            seq_length=seq_length,
            pad_to_multiple_of=pad_to_multiple_of,
            pad_to_max_length=pad_to_max_length,
            emit_padding_mask=emit_padding_mask,
        )

    def select_samples_to_pack(self, samples: list[VLMTaskSample]) -> list[list[VLMTaskSample]]:
        # FatalSampleError: Energon's handler would log any other error and go on without packing
        raise FatalSampleError(
            "VisualInBatchEncoder packs each micro-batch in batch() (micro_batch_size > 1, no Energon packing "
            "buffer): remove packing_buffer_size, or use QwenVLPackingEncoder for Energon packing "
            "(packing_buffer_size, micro_batch_size=1)"
        )

    @stateless
    def batch(self, samples: list[VLMTaskSample]) -> dict[str, Any]:  # type: ignore[override]
        """One THD row from one micro-batch of encoded samples, in micro-batch order."""
        if any(isinstance(s, VLMPackedSample) for s in samples):
            raise OnlineError(
                "VisualInBatchEncoder got Energon packs: remove packing_buffer_size (it packs micro-batches)",
                fields="packing_buffer_size",
            )
        group = VLMPackedSample(__key__="", __restore_key__=(), __subflavors__={}, samples=list(samples))
        members = [s for s in samples if s.rejected is None]
        if members and not self.pad_to_max_length:
            # each member fits seq_length (the preparer's limit), the row holds them all
            out = build_visual_thd_batch(
                [_prepared(s) for s in members],
                sequence_length=self.seq_length,
                pad_to_multiple_of=self.pad_to_multiple_of,
                emit_padding_mask=self.emit_padding_mask,
            )
            out["sample_keys"] = [_prepared(s).key for s in members]
            out["skipped"] = [s.rejected for s in samples if s.rejected is not None]
        else:
            # every member refused (a padding row carries the records), or a fixed-width row (members must fit)
            out = _VLMPackingEncoder.batch(self, [group])
        for key in HF_ENCODER_BATCH_KEYS:  # HFEnergonBatch's fields: None where the family's collate has none
            out.setdefault(key, None)
        return out


def _packing_preparer(preparer: Any) -> QwenVLPreparer | Gemma3Preparer:
    """The preparer of a family the Energon encoders pack (Qwen2/2.5/3-VL, Gemma3-VL); a family (object or
    registry name) instead of its preparer, or one whose samples longpack does not prepare, is refused with
    the reason."""
    from longpack.vlm.families import vlm_family

    if isinstance(preparer, QwenVLPreparer | Gemma3Preparer):
        return preparer
    family = vlm_family(preparer) if isinstance(preparer, str) else preparer
    if hasattr(family, "can_prepare") and hasattr(family, "visual_tokens"):  # a registry family
        if not family.can_prepare:
            try:
                family.preparer()
            except VLMError as exc:
                raise OnlineError(
                    f"the Energon packing encoders cannot pack {family.name} samples: they need prepared "
                    f"samples (tokens, labels, pixels) and {exc}",
                    fields="preparer",
                ) from None
        raise OnlineError(
            f"pass the {family.name} family's preparer (vlm_family({family.name!r}).preparer(...)), not the "
            "family",
            fields="preparer",
        )
    raise OnlineError(
        "preparer must be a VLM family's preparer (longpack.vlm.QwenVLPreparer or "
        f"longpack.vlm.families.Gemma3Preparer), got {type(preparer).__name__}",
        fields="preparer",
    )


def _media(conversation: dict[str, Any], images: list[bytes], videos: list[Any]) -> dict[str, Any]:
    """The conversation with the sample's encoded images and videos filling its placeholders."""
    out = dict(conversation)
    out["images"] = list(images)
    if videos:
        out["videos"] = list(videos)
    return out


def _fatal(sample: Sample, exc: Exception) -> FatalSampleError:
    """A setting that fails every sample, as an error Energon does not swallow (its handler would log a
    traceback and drop the samples one by one until its failure tolerance runs out)."""
    message = str(exc)
    if not message.startswith(f"sample {sample.__key__}"):
        message = f"sample {sample.__key__}: {message}"
    return FatalSampleError(message)


def _padding_sequence(length: int, *, mrope: bool, pad_token_id: int = 0) -> PreparedSequence:
    """A sequence that trains nothing: the family's pad id, labels -100, loss mask 0, no visual values (3-D
    positions when the family's rows have them)."""
    import torch

    positions = torch.arange(length, dtype=torch.int64)

    return PreparedSequence(
        key="",
        row={
            "input_ids": torch.full((length,), pad_token_id, dtype=torch.int64),
            "attention_mask": torch.ones(length, dtype=torch.int64),
            "position_ids": torch.arange(length, dtype=torch.int64),
            "labels": torch.full((length,), -100, dtype=torch.int64),
            "loss_mask": torch.zeros(length, dtype=torch.float32),
        },
        visual_values={},
        mrope_position_ids=positions.expand(3, length).clone() if mrope else None,
        visual_tokens=0,
        pad_token_id=pad_token_id,
    )


def _prepared(sample: VLMTaskSample) -> PreparedSequence:
    assert sample.prepared is not None
    return sample.prepared
