"""Config keys the rules quote, and helpers several rule families share."""

from __future__ import annotations

from longpack.rules.config import TrainingSetup
from longpack.rules.registry import Severity, Violation
from longpack.topology import HYBRIDEP_CHUNK as HYBRIDEP_CHUNK  # one definition, in topology
from longpack.topology import pad_seq_to_mult_terms

E, W, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO

K_TP = "model.tensor_model_parallel_size"
K_CP = "model.context_parallel_size"
K_PP = "model.pipeline_model_parallel_size"
K_VPP = "model.virtual_pipeline_model_parallel_size"
K_EP = "model.expert_model_parallel_size"
K_ETP = "model.expert_tensor_parallel_size"
K_SP = "model.sequence_parallel"
K_SEQ = "model.seq_length"
K_DSEQ = "dataset.seq_length"
K_MBS = "train.micro_batch_size"
K_GBS = "train.global_batch_size"
K_OFF = "dataset.enable_offline_packing"
K_IBP = "dataset.enable_in_batch_packing"
K_SPECS = "dataset.offline_packing_specs"
K_PSS = "dataset.offline_packing_specs.packed_sequence_size"
K_PSM = "dataset.offline_packing_specs.pad_seq_to_mult"
K_PCU = "dataset.offline_packing_specs.pad_cu_seqlens"
K_PTML = "dataset.dataset_kwargs.pad_to_max_length"
K_PTL = "model.calculate_per_token_loss"
K_AIC = "ddp.average_in_collective"
K_CGI = "model.cuda_graph_impl"
K_CGS = "model.cuda_graph_scope"
K_MTP = "model.mtp_num_layers"
K_BUF = "dataset.packing_buffer_size"
K_LAYOUT = "model.pipeline_model_parallel_layout"


def V(message: str, fix: str, *keys: str) -> Violation:
    return Violation(message=message, fix=fix, keys=keys)


def fixed_width(s: TrainingSetup) -> bool:
    return s.dataset.fixed_width


def pad_cu(s: TrainingSetup) -> bool:
    specs = s.dataset.offline_packing_specs
    return specs is not None and specs.pad_cu_seqlens


def packed_size(s: TrainingSetup) -> int | None:
    specs = s.dataset.offline_packing_specs
    return None if specs is None else specs.packed_sequence_size


def multiple_text(s: TrainingSetup) -> str:
    """The required multiple with how it follows from TP/CP/SP, for messages."""
    cps = {s.cp} | ({s.eval_context_parallel_size} if s.eval_context_parallel_size else set())
    parts = [pad_seq_to_mult_terms(tp=s.tp, cp=cp, sp=s.sp) for cp in sorted(cps)]
    return f"{s.required_pad_seq_to_mult} (= {' and '.join(parts)} for TP={s.tp} CP={'/'.join(map(str, sorted(cps)))} SP={s.sp})"


def fixed_effective(s: TrainingSetup) -> bool:
    """Fixed-width rows: asked for, or forced by Bridge (PP > 1 or EP > 1 on configs with the attribute)."""
    forced = s.dataset.kind.has_pad_to_max_length_attr and (s.pp > 1 or s.ep > 1)
    return fixed_width(s) or forced
