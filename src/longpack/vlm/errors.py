"""Errors of the VLM layer: an image that cannot be used, a sample a limit refuses.

Both are :class:`longpack.errors.InputError` (exit code 2 in the CLI). :class:`SampleRejected` carries a
machine-readable ``reason`` so streaming callers (the Energon encoder, the in-batch collator) can count
skipped samples per reason instead of hiding them:

    >>> e = SampleRejected("s7", "visual_tokens", "1296 visual tokens > max_visual_tokens=1024")
    >>> e.reason, str(e)
    ('visual_tokens', 'sample s7: 1296 visual tokens > max_visual_tokens=1024')
"""

from __future__ import annotations

from longpack.errors import InputError

# Why a sample is skipped, as counted by ``VLMStats`` (one key per limit).
REJECT_REASONS: tuple[str, ...] = ("visual_tokens", "too_many_images", "too_long", "undecodable")


class VLMError(InputError):
    """A VLM sample cannot be prepared: bad message structure, a missing image, a processor mismatch."""


class SampleRejected(VLMError):
    """A sample a limit refuses (``reason`` in :data:`REJECT_REASONS`); callers skip and count it."""

    def __init__(self, key: str, reason: str, detail: str) -> None:
        if reason not in REJECT_REASONS:
            raise ValueError(f"reason={reason!r} is not one of {REJECT_REASONS}")
        super().__init__(f"sample {key}: {detail}")
        self.key = key
        self.reason = reason
        self.detail = detail

    def __reduce__(self) -> tuple[type[SampleRejected], tuple[str, str, str]]:
        return (type(self), (self.key, self.reason, self.detail))
