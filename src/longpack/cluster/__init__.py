"""Packing at cluster scale: the Ray Data backend of ``longpack pack`` (``--backend ray``).

``ray`` is imported lazily (``pip install 'longpack[ray]'``); ``import longpack.cluster`` works without it.

    >>> from longpack.cluster import RayPacker
    >>> RayPacker(address="auto", workers=4).workers
    4
"""

from longpack.cluster.ray_pack import RayBackendError, RayPacker, TokenizedDataset, peak_rss_bytes

__all__ = ["RayBackendError", "RayPacker", "TokenizedDataset", "peak_rss_bytes"]
