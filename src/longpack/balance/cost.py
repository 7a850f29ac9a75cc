"""Pack cost model: how long one packed micro-batch takes, from the lengths of the sequences inside it.

A pack holding sequences of runtime lengths ``L_1..L_k`` costs

``cost = per_pack + per_sequence·k + linear·Σ L_i + quadratic·Σ L_i²``

``linear`` covers every weight GEMM, norm and the logits (work per token); ``quadratic`` covers causal
core attention (QKᵀ and PV, work per pair of tokens of the same sequence; THD/varlen attention never
computes pairs across sequences); ``per_sequence`` is the fixed cost of one more sequence (a kernel
launch per segment, ``cu_seqlens`` bookkeeping); ``per_pack`` the fixed cost of a micro-batch. Units are
whatever the coefficients are in: seconds when they come from ``from_flops`` or a fit to seconds.

Pure numpy; no I/O, no torch.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from longpack.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class TransformerFlops:
    """Training FLOPs (forward + backward) of a model, split into the two parts a pack cost needs.

    - ``linear_flops_per_token``: FLOP per token of everything that scales with the token count: every
      weight GEMM counted 6× (forward, dgrad, wgrad; 2 FLOP per MAC) plus the logits, i.e. the Megatron
      ``F_tok`` (docs/reference/planner-model.md#flops) **without** its core-attention term.
    - ``attention_flops_per_token_pair``: FLOP (forward + backward) of core attention for one
      (query, key) pair that causal attention computes (key position <= query position), summed over
      all attention layers. A sequence of length ``L`` has ``L·(L+1)/2`` such pairs. In the planner's
      notation this is ``12·C_core·L_attn`` (``C_core = a·d`` for GQA/MHA), because Megatron charges
      ``6·C_core·L_attn·L²`` per sequence (already causal-halved): ``12·C_core·L_attn·L²/2``.
    """

    linear_flops_per_token: float
    attention_flops_per_token_pair: float

    def flops_per_token(self, seq_length: int) -> float:
        """Megatron's ``F_tok`` for sequences of ``seq_length`` tokens (``s_eff = s``, no packing).

        >>> f = megatron_dense_flops(hidden=8192, layers=80, heads=64, kv_heads=8, ffn=28672, vocab=128256)
        >>> round(f.flops_per_token(8192) / 1e9, 1)  # Llama-3 70B, published: 449.2
        449.2
        """
        return self.linear_flops_per_token + self.attention_flops_per_token_pair / 2 * seq_length


def megatron_dense_flops(
    *,
    hidden: int,
    layers: int,
    heads: int,
    ffn: int,
    vocab: int,
    kv_heads: int | None = None,
    head_dim: int | None = None,
    gated_mlp: bool = True,
) -> TransformerFlops:
    """FLOP split of a dense GQA/MHA decoder by the Megatron formula (docs/reference/planner-model.md#flops).

    ``linear = 6·[L·(h·γ·f + h·(q + 2·kv) + q·h) + h·V]`` with ``q = heads·d``, ``kv = kv_heads·d``,
    ``γ = 3`` for a gated (SwiGLU) MLP and 2 otherwise; ``attention pair = 12·heads·d·L``. Norms, the
    router and recompute are not counted (model FLOPs, as Megatron reports them).

    >>> f = megatron_dense_flops(hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336, vocab=128256)
    >>> round(f.linear_flops_per_token / 1e9, 2), round(f.attention_flops_per_token_pair / 1e6, 3)
    (45.03, 1.573)
    """
    for name, value in (
        ("hidden", hidden),
        ("layers", layers),
        ("heads", heads),
        ("ffn", ffn),
        ("vocab", vocab),
    ):
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    kv = heads if kv_heads is None else kv_heads
    if kv < 1 or heads % kv:
        raise ConfigError(f"kv_heads={kv} must be positive and divide heads={heads}")
    d = hidden // heads if head_dim is None else head_dim
    if d < 1:
        raise ConfigError(f"head_dim must be positive, got {d} (hidden={hidden}, heads={heads})")
    q_width, kv_width = heads * d, kv * d
    gamma = 3 if gated_mlp else 2
    per_layer = hidden * gamma * ffn + hidden * (q_width + 2 * kv_width) + q_width * hidden
    linear = 6.0 * (layers * per_layer + hidden * vocab)
    return TransformerFlops(
        linear_flops_per_token=linear, attention_flops_per_token_pair=12.0 * heads * d * layers
    )


def _pack_sums(lengths: np.ndarray, bin_of_item: np.ndarray, num_packs: int) -> np.ndarray:
    """``[num_packs, 4]`` design matrix: (1, sequences, Σ L, Σ L²) per pack."""
    lf = lengths.astype(np.float64)
    out = np.empty((num_packs, 4), dtype=np.float64)
    out[:, 0] = 1.0
    out[:, 1] = np.bincount(bin_of_item, minlength=num_packs)
    out[:, 2] = np.bincount(bin_of_item, weights=lf, minlength=num_packs)
    out[:, 3] = np.bincount(bin_of_item, weights=lf * lf, minlength=num_packs)
    return out


@dataclass(frozen=True, kw_only=True)
class PackCostModel:
    """``cost = per_pack + per_sequence·k + linear·Σ L + quadratic·Σ L²`` for a pack of ``k`` sequences.

    All coefficients are >= 0 (more tokens never cost less). ``r2`` is set by ``fit`` (coefficient of
    determination on the fitted measurements) and ``None`` otherwise; it does not enter ``cost``.

    >>> m = PackCostModel(linear=1.0, quadratic=0.01)
    >>> m.cost([100, 10, 10], [0, 1, 1]).tolist()  # pack 0: 100 + 100; pack 1: 20 + 2
    [200.0, 22.0]
    """

    linear: float
    quadratic: float
    per_sequence: float = 0.0
    per_pack: float = 0.0
    r2: float | None = None

    def __post_init__(self) -> None:
        for name in ("linear", "quadratic", "per_sequence", "per_pack"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not np.isfinite(value) or value < 0:
                raise ConfigError(
                    f"PackCostModel.{name} must be a finite number >= 0, got {value!r} "
                    "(a negative coefficient would let adding tokens shorten a pack)"
                )

    @property
    def coefficients(self) -> np.ndarray:
        """``[per_pack, per_sequence, linear, quadratic]`` as float64."""
        return np.array([self.per_pack, self.per_sequence, self.linear, self.quadratic], dtype=np.float64)

    def cost(self, lengths: Any, bin_of_item: Any, num_packs: int | None = None) -> np.ndarray:
        """Cost of every pack (float64 ``[num_packs]``; ``num_packs`` defaults to ``max(bin) + 1``).

        >>> PackCostModel(linear=2.0, quadratic=0.0, per_sequence=1.0).cost([3, 4, 5], [1, 1, 0]).tolist()
        [11.0, 16.0]
        """
        lengths_arr = np.asarray(lengths, dtype=np.int64)
        bins = np.asarray(bin_of_item, dtype=np.int64)
        if lengths_arr.shape != bins.shape or lengths_arr.ndim != 1:
            raise ConfigError(
                f"lengths and bin_of_item must be 1-D of the same size, got {lengths_arr.shape} and {bins.shape}"
            )
        if bins.size and int(bins.min()) < 0:
            raise ConfigError(f"bin_of_item has a negative id at index {int(np.argmin(bins))}")
        n = int(bins.max()) + 1 if bins.size else 0
        n = n if num_packs is None else num_packs
        return _pack_sums(lengths_arr, bins, n) @ self.coefficients

    def sequence_cost(self, lengths: Any) -> np.ndarray:
        """Cost each sequence adds to its pack (without ``per_pack``), float64.

        >>> PackCostModel(linear=1.0, quadratic=0.5, per_sequence=3.0).sequence_cost([2, 4]).tolist()
        [7.0, 15.0]
        """
        lf = np.asarray(lengths, dtype=np.float64)
        return self.per_sequence + self.linear * lf + self.quadratic * lf * lf

    def pack_cost(self, lengths: Sequence[int] | np.ndarray) -> float:
        """Cost of one pack holding ``lengths``.

        >>> PackCostModel(linear=1.0, quadratic=0.01, per_pack=5.0).pack_cost([100, 10])
        216.0
        """
        lf = np.asarray(lengths, dtype=np.float64)
        return float(
            self.per_pack
            + self.per_sequence * lf.size
            + self.linear * lf.sum()
            + self.quadratic * (lf * lf).sum()
        )

    @classmethod
    def from_flops(
        cls,
        *,
        linear_flops_per_token: float,
        attention_flops_per_token_pair: float,
        flops_per_second: float,
        attention_flops_per_second: float | None = None,
        per_sequence_seconds: float = 0.0,
        per_pack_seconds: float = 0.0,
    ) -> PackCostModel:
        """Cost in **seconds** of a pack's forward + backward on hardware that sustains the given FLOP/s.

        - ``linear_flops_per_token`` [FLOP/token]: forward+backward FLOPs per token excluding core
          attention (``TransformerFlops.linear_flops_per_token``; from the planner: ``F_tok`` minus its
          ``6·C_core·s_eff·L_attn`` term).
        - ``attention_flops_per_token_pair`` [FLOP/pair]: forward+backward core-attention FLOPs per causal
          (query, key) pair, all layers (``12·C_core·L_attn``; see ``TransformerFlops``).
        - ``flops_per_second`` [FLOP/s]: effective (achieved, not peak) rate of whatever runs one pack:
          ``peak × MFU`` of one GPU, times ``TP·CP`` when the pack is split over a TP×CP group. The
          cost is the time of the **whole model** (all pipeline stages back to back);
          ``simulate_schedule`` divides it over the stages.
        - ``attention_flops_per_second``: a separate rate for core attention (flash-attention kernels
          often run at a different efficiency than GEMMs); defaults to ``flops_per_second``.

        A sequence of length ``L`` has ``L·(L+1)/2`` causal pairs, so ``quadratic = pair/2/rate`` and
        ``pair/2/rate`` is added to ``linear`` as well.

        >>> f = megatron_dense_flops(hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336, vocab=128256)
        >>> m = PackCostModel.from_flops(linear_flops_per_token=f.linear_flops_per_token,
        ...     attention_flops_per_token_pair=f.attention_flops_per_token_pair, flops_per_second=400e12)
        >>> round(m.pack_cost([8192]), 3), round(m.pack_cost([1024] * 8), 3)  # seconds per 8K-token pack
        (1.054, 0.939)
        """
        for name, value in (
            ("linear_flops_per_token", linear_flops_per_token),
            ("attention_flops_per_token_pair", attention_flops_per_token_pair),
            ("per_sequence_seconds", per_sequence_seconds),
            ("per_pack_seconds", per_pack_seconds),
        ):
            if not np.isfinite(value) or value < 0:
                raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")
        attn_rate = flops_per_second if attention_flops_per_second is None else attention_flops_per_second
        for name, value in (
            ("flops_per_second", flops_per_second),
            ("attention_flops_per_second", attn_rate),
        ):
            if not np.isfinite(value) or value <= 0:
                raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")
        half_pair = float(attention_flops_per_token_pair) / 2.0 / float(attn_rate)
        return cls(
            linear=float(linear_flops_per_token) / float(flops_per_second) + half_pair,
            quadratic=half_pair,
            per_sequence=float(per_sequence_seconds),
            per_pack=float(per_pack_seconds),
        )

    @classmethod
    def from_dense_model(
        cls,
        *,
        hidden: int,
        layers: int,
        heads: int,
        ffn: int,
        vocab: int,
        flops_per_second: float,
        kv_heads: int | None = None,
        head_dim: int | None = None,
        gated_mlp: bool = True,
    ) -> PackCostModel:
        """``from_flops`` with the FLOP split of ``megatron_dense_flops`` (for a catalog model and GPU,
        ``longpack.planner.balance_costs.pack_cost_model`` takes the rates from the planner's time model).

        >>> m = PackCostModel.from_dense_model(hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336,
        ...                                    vocab=128256, flops_per_second=400e12)
        >>> round(m.quadratic / m.linear * 1e6, 2)  # one more token of context costs this share of a token
        17.47
        """
        f = megatron_dense_flops(
            hidden=hidden,
            layers=layers,
            heads=heads,
            ffn=ffn,
            vocab=vocab,
            kv_heads=kv_heads,
            head_dim=head_dim,
            gated_mlp=gated_mlp,
        )
        return cls.from_flops(
            linear_flops_per_token=f.linear_flops_per_token,
            attention_flops_per_token_pair=f.attention_flops_per_token_pair,
            flops_per_second=flops_per_second,
        )

    @classmethod
    def fit(
        cls,
        pack_lengths_list: Sequence[Sequence[int] | np.ndarray],
        measured_times: Any,
        *,
        terms: Sequence[str] = ("per_pack", "per_sequence", "linear", "quadratic"),
    ) -> PackCostModel:
        """Least-squares fit (coefficients constrained >= 0) of the model to measured per-pack times.

        ``pack_lengths_list[i]`` are the sequence lengths of pack ``i`` and ``measured_times[i]`` its
        time. ``terms`` picks which coefficients may be non-zero. The constraint is solved exactly by
        trying every subset of terms (at most 16 small solves) and keeping the best feasible one. The
        result carries ``r2 = 1 - SS_res / SS_tot`` on these measurements.

        >>> packs = [[10], [20], [5, 5], [30, 1]]
        >>> true = PackCostModel(linear=2.0, quadratic=0.1, per_pack=1.0)
        >>> m = PackCostModel.fit(packs, [true.pack_cost(p) for p in packs])
        >>> round(m.linear, 6), round(m.quadratic, 6), round(m.per_pack, 6), m.r2
        (2.0, 0.1, 1.0, 1.0)
        """
        names = ("per_pack", "per_sequence", "linear", "quadratic")
        unknown = [t for t in terms if t not in names]
        if unknown or not terms:
            raise ConfigError(f"terms must be a non-empty subset of {names}, got {tuple(terms)}")
        y = np.asarray(measured_times, dtype=np.float64)
        if y.ndim != 1 or len(y) != len(pack_lengths_list):
            raise ConfigError(
                f"measured_times needs one time per pack: got {y.shape} for {len(pack_lengths_list)} packs"
            )
        if not np.isfinite(y).all():
            raise ConfigError(
                f"measured_times has a non-finite value at index {int(np.argmin(np.isfinite(y)))}"
            )
        lengths = np.concatenate(
            [np.asarray(p, dtype=np.int64) for p in pack_lengths_list] or [np.zeros(0, np.int64)]
        )
        bins = np.repeat(np.arange(len(pack_lengths_list)), [len(p) for p in pack_lengths_list])
        x_all = _pack_sums(lengths, bins, len(pack_lengths_list))
        allowed = [names.index(t) for t in terms]
        # Scale columns so the solves are well conditioned (Σ L² is ~1e9 where 1 is 1).
        scale = np.maximum(np.abs(x_all).max(axis=0), 1e-300)
        xs = x_all / scale
        # The times too, so that "better by more than rounding" is relative: times of 1e-7 s have residuals
        # far below any absolute tolerance, and the first feasible subset used to win by default.
        y_scale = float(np.abs(y).max()) if len(y) and np.abs(y).max() > 0 else 1.0
        ys = y / y_scale
        best: tuple[float, np.ndarray] | None = None
        for k in range(len(allowed), 0, -1):
            for subset in itertools.combinations(allowed, k):
                cols = list(subset)
                sol, *_ = np.linalg.lstsq(xs[:, cols], ys, rcond=None)
                if (sol < 0).any():
                    continue
                coef = np.zeros(4)
                coef[cols] = sol
                resid = float(((xs @ coef - ys) ** 2).sum())
                if best is None or resid < best[0] - 1e-12 * max(resid, 1.0):
                    best = (resid, coef)
        coef = best[1] / scale * y_scale if best is not None else np.zeros(4)
        ss_tot = float(((y - y.mean()) ** 2).sum()) if len(y) else 0.0
        resid = float(((x_all @ coef - y) ** 2).sum())
        r2 = 1.0 - resid / ss_tot if ss_tot > 0 else (1.0 if resid == 0 else 0.0)
        model = cls(
            per_pack=float(coef[0]),
            per_sequence=float(coef[1]),
            linear=float(coef[2]),
            quadratic=float(coef[3]),
        )
        return replace(model, r2=float(r2))

    def r2_on(self, pack_lengths_list: Sequence[Sequence[int] | np.ndarray], measured_times: Any) -> float:
        """Coefficient of determination of this model's predictions on other measurements.

        >>> PackCostModel(linear=1.0, quadratic=0.0).r2_on([[1], [2], [3]], [1.0, 2.0, 3.0])
        1.0
        """
        y = np.asarray(measured_times, dtype=np.float64)
        pred = np.array([self.pack_cost(p) for p in pack_lengths_list], dtype=np.float64)
        ss_tot = float(((y - y.mean()) ** 2).sum())
        return 1.0 - float(((pred - y) ** 2).sum()) / ss_tot if ss_tot > 0 else 0.0
