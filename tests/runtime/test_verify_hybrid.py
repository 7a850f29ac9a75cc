"""``longpack verify`` for Qwen3-Next: Gated DeltaNet packed per cu_seqlens, MoE router statistics without
padding, MTP rolled per sequence; each injected fault fails naming the row; the certificate names the parts."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.runtime.verify_helpers import QWEN3, pack
from typer.testing import CliRunner

from longpack.cli.app import app
from longpack.errors import ConfigError
from longpack.jobs.verify import VerifyConfig, load_hf_config

QWEN3_NEXT = "qwen3_next_80b_a3b"


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("verify-hybrid")
    return {
        "aligned": pack(tmp, "aligned", tp=2, cp=2, sp=True),  # per-sample padding inside the rows
        "plain": pack(tmp, "plain"),  # no padding
        # rows of 63 tokens: the collate ends some rows with a padding segment that cu_seqlens lists as a sequence
        "odd": pack(tmp, "odd", pack_size=63, seq_length=63),
    }


def run(folder, **options):
    defaults = {"model": QWEN3_NEXT, "max_rows": 2, "cp": (), "pp": (), "time_budget": None}
    return VerifyConfig(packed=folder, **{**defaults, **options}).run()


def test_qwen3_next_from_the_catalog_passes_and_the_certificate_names_the_parts(packs, tmp_path):
    cert = tmp_path / "cert.json"
    result = run(packs["aligned"], certificate=cert)
    assert result.ok, result.failures
    written = json.loads(cert.read_text())
    coverage = written["coverage"]
    assert coverage["family"] == "qwen3_next"
    assert coverage["layer_types"] == ["full_attention", "linear_attention"]
    assert "cu_seqlens" in coverage["layer_type_runs"]["linear_attention"]
    assert coverage["parts"]["moe_router"]["covered"] and coverage["parts"]["mtp"]["depth_checked"] == 1
    assert any("Mamba" in line for line in coverage["not_covered"])
    worst = written["worst"]
    assert worst["loss_rel_diff"] <= 1e-12 and worst["grad_rel_diff"] <= 1e-12
    assert worst["cross_sample_gradient"] == 0.0 and worst["mtp_cross_sample_gradient"] == 0.0
    assert worst["router_rel_diff"] <= 1e-12 and worst["mtp_loss_rel_diff"] <= 1e-12
    assert any(r.router_padding_tokens > 0 for r in result.rows)  # the rows do carry padding
    assert {"moe", "mtp"} <= set(written["checks"])
    assert "MoE router statistics" in result.verdict and "MTP" in result.verdict


def test_router_statistics_leave_out_a_trailing_padding_segment(packs):
    from longpack.packed.folder import PackedFolder
    from longpack.runtime.collate import PackedCollator
    from longpack.runtime.dataset import PackedDataset

    folder = PackedFolder.open(packs["odd"])
    collate = PackedCollator.for_data(folder, split="training")
    dataset = PackedDataset(folder, split="training", prefetch=0)
    trailing = []
    for index in range(len(dataset)):
        batch = collate([dataset[index]])
        cu = batch["cu_seqlens_q"][0]
        trailing.append(bool(batch["padding_mask"][0][int(cu[-2]) : int(cu[-1])].all()))
    assert any(trailing)
    index = trailing.index(True)
    # the rows checked first are every file's first and last row: check the one with the segment explicitly
    from longpack.jobs.verify import load_hf_config
    from longpack.runtime.verify import RowVerifier
    from longpack.runtime.verify_model import build_model

    verifier = RowVerifier(build_model(load_hf_config(QWEN3_NEXT)), collate=collate)
    report = verifier.verify(dataset[index], {"split": "training", "file": "f", "row": index}, index)
    assert report.ok, report.failures
    assert report.router_padding_tokens > 0
    dataset.close()


@pytest.mark.parametrize(
    ("fault", "pack_name", "checks"),
    [
        ("linear-state-leak", "plain", {"loss", "gradients", "isolation"}),
        ("conv-state-leak", "plain", {"loss", "gradients", "isolation"}),
        ("route-padding", "aligned", {"moe"}),
        ("mtp-global-roll", "plain", {"mtp"}),
    ],
)
def test_each_hybrid_fault_fails_naming_the_row(packs, fault, pack_name, checks):
    result = run(packs[pack_name], fault=fault, max_rows=1)
    assert not result.ok and result.verdict.startswith("FAIL")
    assert checks <= {f["check"] for f in result.failures}, result.failures
    first = result.failures[0]
    assert first["split"] == "training" and first["file"].startswith("training_") and first["row"] is not None
    assert f"row {first['row']}" in result.verdict
    if fault == "mtp-global-roll":  # no padding: the roll hands the last token the next sample's first one
        assert "rolled across a sample boundary" in first["detail"] and first["sample"] is not None


def test_qwen3_moe_router_statistics_pass_and_routing_padding_fails(packs):
    result = run(packs["aligned"], model="qwen3_30b_a3b", max_rows=1)
    assert result.ok, result.failures
    parts = result.certificate["coverage"]["parts"]
    assert parts["moe_router"]["covered"] and not parts["mtp"]["covered"]
    bad = run(packs["aligned"], model="qwen3_30b_a3b", max_rows=1, fault="route-padding")
    assert not bad.ok and bad.failures[0]["check"] == "moe" and "tokens counted" in bad.failures[0]["detail"]


def test_route_padding_on_rows_without_padding_says_it_had_nothing_to_route(packs):
    result = run(packs["plain"], model="qwen3_30b_a3b", max_rows=1, fault="route-padding")
    assert any("nothing to route" in note for note in result.notes)


@pytest.mark.parametrize("fault", ["linear-state-leak", "route-padding", "mtp-global-roll"])
def test_a_hybrid_fault_on_a_model_without_the_part_is_refused(packs, fault):
    with pytest.raises(ConfigError, match="inject it with"):
        run(packs["plain"], model=str(QWEN3), fault=fault)


def test_other_ssm_families_are_refused_by_name(packs, tmp_path):
    config = tmp_path / "falcon_h1.json"
    config.write_text(json.dumps({"model_type": "falcon_h1", "vocab_size": 151936}))
    with pytest.raises(ConfigError, match="Mamba"):
        run(packs["plain"], model=str(config))


#: A Nemotron-H-shaped config (Mamba-2, MoE, attention; the layer pattern and widths of NVIDIA's Nemotron-H /
#: Nano configs as far as verify keeps them) with the test data's qwen3 vocabulary.
NEMOTRON_H = QWEN3.parent / "nemotron_h_shaped.json"


@pytest.fixture(scope="module")
def nemotron_h():
    return str(NEMOTRON_H)


def test_nemotron_h_mamba2_passes_and_its_state_leaks_fail(packs, nemotron_h):
    result = run(packs["aligned"], model=nemotron_h)
    assert result.ok, result.failures
    coverage = result.certificate["coverage"]
    assert coverage["family"] == "nemotron_h" and "linear_attention" in coverage["layer_types"]
    assert coverage["layer_type_runs"]["linear_attention"].startswith("Mamba-2")
    assert result.certificate["worst"]["cross_sample_gradient"] == 0.0
    for fault in ("linear-state-leak", "conv-state-leak"):
        bad = run(packs["plain"], model=nemotron_h, fault=fault, max_rows=1)
        assert not bad.ok and {"loss", "isolation"} <= {f["check"] for f in bad.failures}
        assert bad.failures[0]["row"] is not None and bad.failures[0]["sample"] is not None


def test_cli_runs_the_catalog_model(packs):
    args = ["verify", str(packs["plain"]), "--model", QWEN3_NEXT, "--max-rows", "1", "--dist-rows", "0"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    assert "PASS" in out.output and "qwen3_next" in out.output
    bad = CliRunner().invoke(app, [*args, "--inject-fault", "linear-state-leak"])
    assert bad.exit_code == 1 and "FAIL" in bad.output and "row" in bad.output


def test_catalog_config_keeps_the_hybrid_fields():
    from longpack.runtime.verify_model import tiny_config

    config = load_hf_config(QWEN3_NEXT)
    assert config["model_type"] == "qwen3_next" and config["full_attention_interval"] == 4
    assert (config["linear_num_key_heads"], config["linear_num_value_heads"]) == (16, 32)
    assert config["num_experts"] == 512 and config["mtp_num_hidden_layers"] == 1
    # the published config.json shrinks to the same tiny model as the catalog entry
    published = tiny_config(load_hf_config(str(QWEN3.parent / "qwen3_next_80b_a3b.json")))
    tiny = tiny_config(config)
    for key in ("layer_types", "linear_conv_kernel_dim", "num_experts", "num_experts_per_tok", "vocab_size"):
        assert published[key] == tiny[key], key
    assert published["mtp_num_hidden_layers"] == tiny["mtp_num_hidden_layers"] == 1
    assert tiny["partial_rotary_factor"] == 0.25  # the catalog's; transformers' default for the file


# -- the packed Gated DeltaNet against an independent oracle ------------------------------------------------


def _modeling():
    from longpack.runtime.verify_linear import register_linear_kernels

    register_linear_kernels("qwen3_next")
    import transformers.models.qwen3_next.modeling_qwen3_next as modeling

    return modeling


@settings(max_examples=15, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=5),
    gaps=st.lists(st.integers(0, 3), min_size=5, max_size=5),
    seed=st.integers(0, 2**16),
)
def test_packed_delta_rule_and_conv_equal_each_sequence_alone(lengths, gaps, seed):
    """The wrapped chunked rule (chunk 8) on a packed row with padding gaps = transformers' token-by-token
    recurrence run on each sequence alone from a zero state; the conv = a zero-history conv per sequence."""
    from longpack.runtime.attention import token_layout
    from longpack.runtime.verify_model import Float64Mode, attention_plan

    modeling = _modeling()
    gen = torch.Generator().manual_seed(seed)
    cu, padded, start = [0], [0], 0
    for n, gap in zip(lengths, gaps, strict=False):
        start += n + gap
        cu.append(cu[-1] + n)
        padded.append(start)
    width = padded[-1]
    plan = attention_plan(token_layout(cu, width, cu_seqlens_padded=padded))
    heads_k, heads_v, dim = 2, 4, 4

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    q, k, v = rand(1, width, heads_k, dim), rand(1, width, heads_k, dim), rand(1, width, heads_v, dim)
    g, beta = (
        -torch.rand(1, width, heads_v, generator=gen, dtype=torch.float64),
        torch.rand(1, width, heads_v, generator=gen, dtype=torch.float64),
    )
    with Float64Mode():  # transformers computes these in float32 otherwise
        packed, _ = modeling.torch_chunk_gated_delta_rule(
            q, k, v, g=g, beta=beta, chunk_size=8, use_qk_l2norm_in_kernel=True, thd_plan=plan
        )
    x, weight = rand(1, 6, width), rand(6, 4)
    conv = modeling.causal_conv1d_fn(x, weight, None, activation="silu", thd_plan=plan)
    for i, n in enumerate(lengths):
        a = padded[i]
        with Float64Mode():
            alone, _ = modeling.torch_recurrent_gated_delta_rule(
                *(t[:, a : a + n] for t in (q, k, v)),
                g=g[:, a : a + n],
                beta=beta[:, a : a + n],
                use_qk_l2norm_in_kernel=True,
            )
        torch.testing.assert_close(packed[:, a : a + n], alone, rtol=1e-10, atol=1e-12)
        window = torch.nn.functional.conv1d(x[:, :, a : a + n], weight.unsqueeze(1), padding=3, groups=6)
        torch.testing.assert_close(conv[:, :, a : a + n], torch.nn.functional.silu(window[:, :, :n]))
        gap_end = padded[i + 1]
        assert not packed[:, a + n : gap_end].any() and not conv[:, :, a + n : gap_end].any()


def test_transformers_own_fallback_cannot_keep_packed_sequences_apart():
    """Why the wrapper exists: without FLA, transformers' torch fallback refuses ``cu_seqlens``, and a row
    packed through position ids alone runs as one sequence (the state of sequence 0 reaches sequence 1)."""
    modeling = _modeling()
    original = modeling.torch_chunk_gated_delta_rule.__wrapped__
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 12, 2, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    g, beta = -torch.rand(1, 12, 2, dtype=torch.float64), torch.rand(1, 12, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="packed sequences"):
        original(q, k, v, g=g, beta=beta, cu_seqlens=torch.tensor([0, 6, 12]))
    whole, _ = original(q, k, v, g=g, beta=beta)
    second, _ = original(*(t[:, 6:] for t in (q, k, v)), g=g[:, 6:], beta=beta[:, 6:])
    assert not torch.allclose(whole[:, 6:], second)


@pytest.mark.distributed
@pytest.mark.slow
def test_qwen3_next_cp_2_head_split_and_pp_2_pass(tmp_path):
    folder = pack(tmp_path, "cp2", cp=2, pad_to_max_length=True)
    result = run(folder, max_rows=1, dist_rows=1, cp=(2,), pp=(2,))
    assert result.ok, result.failures
    assert {(d.kind, d.size) for d in result.distributed} == {("cp", 2), ("pp", 2)}
    assert result.certificate["coverage"]["parts"]["linear_attention_cp"].startswith("head split")
    for d in result.distributed:
        assert d.loss_max_rel_diff <= 1e-12 and d.grad_max_rel_diff <= 1e-12
    # a stack without GDN CP: every rank runs its zigzag shard as the sequence
    bad = run(folder, max_rows=1, dist_rows=1, cp=(2,), pp=(), fault="linear-cp-local")
    assert not bad.ok and bad.failures[0]["check"] == "cp" and bad.failures[0]["rank"].startswith("cp rank")
    assert bad.failures[0]["row"] is not None and "row" in bad.verdict


@pytest.mark.distributed
@pytest.mark.slow
def test_nemotron_h_cp_2_and_pp_2_pass(tmp_path, nemotron_h):
    folder = pack(tmp_path, "cp2", cp=2, pad_to_max_length=True)
    result = run(folder, model=nemotron_h, max_rows=1, dist_rows=1, cp=(2,), pp=(2,))
    assert result.ok, result.failures
    assert {(d.kind, d.size) for d in result.distributed} == {("cp", 2), ("pp", 2)}
    for d in result.distributed:
        assert d.loss_max_rel_diff <= 1e-12 and d.grad_max_rel_diff <= 1e-12


@settings(max_examples=10, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 30), min_size=1, max_size=4),
    gaps=st.lists(st.integers(0, 3), min_size=4, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_packed_ssd_scan_equals_the_recurrence_on_each_sequence(lengths, gaps, seed):
    """Nemotron-H's chunked SSD scan, wrapped (chunk 8), on a packed row with padding gaps = the Mamba-2
    recurrence ``h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t``, ``y_t = C_t h_t + D x_t`` written out here, run on
    each sequence alone from a zero state."""
    from longpack.runtime.attention import token_layout
    from longpack.runtime.verify_linear import register_linear_kernels
    from longpack.runtime.verify_model import Float64Mode, attention_plan

    register_linear_kernels("nemotron_h")
    import transformers.models.nemotron_h.modeling_nemotron_h as modeling

    gen = torch.Generator().manual_seed(seed)
    cu, padded, start = [0], [0], 0
    for n, gap in zip(lengths, gaps, strict=False):
        start += n + gap
        cu.append(cu[-1] + n)
        padded.append(start)
    width = padded[-1]
    plan = attention_plan(token_layout(cu, width, cu_seqlens_padded=padded))
    heads, dim, groups, state = 4, 3, 2, 5

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    x, dt = rand(1, width, heads, dim), rand(1, width, heads)
    b, c = rand(1, width, groups, state), rand(1, width, groups, state)
    a, d, bias = -torch.rand(heads, generator=gen, dtype=torch.float64), rand(heads), rand(heads)
    with Float64Mode():
        packed = modeling.mamba2_chunk_scan(
            x, dt, a, b, c, 8, D=d, dt_bias=bias, dt_softplus=True, z=None, thd_plan=plan
        )
    step = torch.nn.functional.softplus(dt + bias)
    bh, ch = (t.repeat_interleave(heads // groups, dim=2) for t in (b, c))
    for i, n in enumerate(lengths):
        h = torch.zeros(heads, dim, state, dtype=torch.float64)
        for t in range(padded[i], padded[i] + n):
            decay = torch.exp(step[0, t] * a)[:, None, None]
            h = decay * h + (step[0, t][:, None] * x[0, t])[:, :, None] * bh[0, t][:, None, :]
            want = (h * ch[0, t][:, None, :]).sum(-1) + d[:, None] * x[0, t]
            torch.testing.assert_close(packed[0, t], want, rtol=1e-9, atol=1e-11)
        assert not packed[0, padded[i] + n : padded[i + 1]].any()
