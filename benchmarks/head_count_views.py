"""Korthikanti et al. 2022's held-out rows priced with a transformers OPT in place of the
Megatron GPT: what a model whose attention views by a fixed head count
(``view(bsz, -1, self.num_heads, head_dim)``) is predicted to take at Megatron's shapes.

Each row is priced by ``benchmarks/published.py``'s own pricing twice: with its GPT
(``benchmarks/published_gpt.py``) and with an ``OPTConfig`` directory of the row's shape (two
layers traced, the layer copied), whose TP variants pass the eager probe as ``plan`` runs it
(the head count set to its local value on each rank, ``runtime/local_attributes.py``).

    python benchmarks/head_count_views.py [ROW_ID ...]   # default: every row of the file
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import published  # noqa: E402

from planner import api  # noqa: E402
from planner.cost.eager_probe import EagerShardProbe  # noqa: E402
from planner.modelfile import load_model_file  # noqa: E402

ROWS = ROOT / "benchmarks" / "heldout" / "korthikanti2022.json"


def opt_config(folder: Path, s) -> Path:
    """A two-layer OPT of the row's shape (tied head, pre-norm, ReLU, biases) as a config dir."""
    config = {
        "model_type": "opt", "architectures": ["OPTForCausalLM"], "vocab_size": s.vocab,
        "hidden_size": s.hidden, "num_hidden_layers": published.TRACED_LAYERS,
        "ffn_dim": s.ffn, "num_attention_heads": s.heads, "max_position_embeddings": s.seq,
        "word_embed_proj_dim": s.hidden, "do_layer_norm_before": True, "dropout": 0.0,
        "attention_dropout": 0.0, "activation_function": "relu", "enable_bias": True,
        "use_cache": False, "pad_token_id": 1, "bos_token_id": 2, "eos_token_id": 2,
    }  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def price_with(s, kind: str, folder: Path):
    """The row's StepCost with ``kind`` ("gpt": the file's own model, "opt": OPT)."""
    model_args, variants_for = published.model_args, api.variants_for
    published._VARIANTS.clear()
    try:
        if kind == "opt":
            config = opt_config(folder, s)
            probe = EagerShardProbe(load_model_file(config, {"seq_len": s.seq}), s.dtype)
            published.model_args = lambda _s: (config, {"seq_len": s.seq})
            api.variants_for = lambda g, c, v="auto", m=None, _p=None: variants_for(
                g, c, v, m, probe
            )
        return published.price(s)
    finally:
        published.model_args, api.variants_for = model_args, variants_for


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("rows", nargs="*", help="row ids (default: all)")
    ids = parser.parse_args().rows
    rows = [r for r in json.loads(ROWS.read_text())["rows"] if not ids or r["id"] in ids]
    with tempfile.TemporaryDirectory() as tmp:
        for row in rows:
            s = published.parse_row(row)
            out = {"id": row["id"], "measured_s": row["iter_s"]}
            for kind in ("gpt", "opt"):
                cost = price_with(s, kind, Path(tmp) / row["id"])
                out[kind] = {
                    "step_s": round(cost.step_time_s, 2),
                    "error": round(cost.step_time_s / row["iter_s"] - 1, 4),
                    "peak_gib": round(cost.peak_memory_bytes / 2**30, 1),
                    "fits": cost.feasible,
                }
            print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
