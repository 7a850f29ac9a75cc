"""Packing at cluster scale: the Ray Data executor of the pack job (``longpack pack --backend ray``).

``ray`` is imported lazily (``pip install 'longpack[ray]'``); ``import longpack.cluster`` works without it.

    >>> from longpack.cluster import RayExecutor
    >>> RayExecutor(address="auto", workers=4).workers
    4
"""

from longpack.cluster.ray_pack import RayBackendError, RayExecutor, TokenizedDataset, peak_rss_bytes

__all__ = ["RayBackendError", "RayExecutor", "TokenizedDataset", "peak_rss_bytes"]
