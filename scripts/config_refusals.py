"""What PackConfig and SweepConfig accept and refuse over a grid of settings (error type, message and fields,
or the resolved settings), as JSON, to diff two versions of the job configs:

    PYTHONPATH=<old>/src python scripts/config_refusals.py > before.json
    PYTHONPATH=src python scripts/config_refusals.py > after.json && diff before.json after.json
"""

import itertools
import json
import os
import tempfile
from pathlib import Path

from longpack import PackConfig, SweepConfig
from longpack.jobs import LocalExecutor

os.chdir(tempfile.mkdtemp())
for name in ("a.jsonl", "b.jsonl"):
    Path(name).write_text('{"prompt": "q", "completion": "a"}\n')


class MyLocal(LocalExecutor):
    pass


class Plain:  # an executor object without supports
    name = "plain"


backends = {
    "local": "local",
    "ray": "ray",
    "bogus": "bogus",
    "LocalExecutor": LocalExecutor(),
    "MyLocal": MyLocal(),
    "Plain": Plain(),
}
sources = {
    "inputs": {"inputs": ["a.jsonl"], "tokenizer": "bytes"},
    "mix": {"mix": ["a.jsonl=0.5", "b.jsonl=0.5"], "tokenizer": "bytes"},
    "demo": {"demo": True},
    "none": {},
    "mix+inputs": {"mix": ["a.jsonl=1"], "inputs": ["b.jsonl"], "tokenizer": "bytes"},
}
extras = [
    {},
    {"output_format": "npy"},
    {"output_format": "indexed"},
    {"overlength": "fragment"},
    {"keep_store": "ks"},
    {"output_format": "npy", "rows_per_shard": 10},
    {"output_format": "npy", "ids_dtype": "int32"},
    {"output_format": "indexed", "pad_cu_seqlens": True},
    {"output_format": "indexed", "val_fraction": 0.1},
    {"compat": "megatron-bridge"},
    {"compat": "megatron-bridge", "overlength": "truncate"},
    {"memory_budget": "1G"},
    {"pad_cu_seqlens": True},
    {"seq_length": None},
    {"seq_length": 8, "pack_size": 4},
    {"workers": 2},
    {"ray_address": "auto"},
    {"max_drop_fraction": 2.0},
    {"output_format": "indexed", "overlength": "fragment"},
    {"algorithm": "balanced"},
    {"val_fraction": 0.1, "val_inputs": ["b.jsonl"]},
    {"tp": 2, "cp": 2, "sp": True},
]
out = {}
for (bn, b), (sn, src), ex in itertools.product(backends.items(), sources.items(), extras):
    kw = {"out": "o", "seq_length": 64, **src, **ex, "backend": b}
    key = f"pack {bn} {sn} {json.dumps(ex, sort_keys=True)}"
    try:
        c = PackConfig(**kw)
        out[key] = ["ok", repr(c.settings), c.pad_seq_to_mult_source, c.handoff_options]
    except Exception as e:
        out[key] = [type(e).__name__, str(e), list(getattr(e, "fields", ()) or ())]
for ex in [
    {},
    {"demo": True},
    {"demo": True, "pack_lengths": "512,256"},
    {"demo": True, "model": "llama3_1_8b"},
    {"demo": True, "layout": "tp2"},
    {"demo": True, "gpus": 8, "tp": 2, "cp": 2, "sp": True},
    {"inputs": ["a.jsonl"]},
    {"store": "nope", "inputs": ["a.jsonl"]},
    {"demo": True, "pack_lengths": [10**9]},
    {"demo": True, "cp_modes": True},
]:
    key = f"sweep {json.dumps(ex, sort_keys=True)}"
    try:
        c = SweepConfig(**ex)
        out[key] = ["ok", repr(c.settings), repr(c.planner)]
    except Exception as e:
        out[key] = [type(e).__name__, str(e), list(getattr(e, "fields", ()) or ())]
print(json.dumps(out, indent=1, sort_keys=True, default=str))
