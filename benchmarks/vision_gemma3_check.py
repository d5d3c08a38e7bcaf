"""Why Gemma 3 is not ortserve's second vision family yet (docs/vision.md, "Gemma 3"): a random-weight
Gemma 3 from a config (no download), exported with mobius-onnx, its first-token logits against
transformers with the processor's ``token_type_ids`` (Gemma 3 as trained: each image's tokens attend
to each other both ways) and without (causal only).

    .venv/bin/python benchmarks/vision_gemma3_check.py [--scalar 256]

``--scalar`` sets ``query_pre_attn_scalar`` (default: the head size, 16, as real Gemma 3 4B/12B have
it equal to theirs); another value shows mobius-onnx's decoder ignoring it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def main() -> None:
    import onnxruntime as ort
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    ap = argparse.ArgumentParser()
    ap.add_argument("--scalar", type=int, default=16)
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = Gemma3Config(
        text_config={"vocab_size": 262208, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "sliding_window": 512,
                     "query_pre_attn_scalar": args.scalar, "max_position_embeddings": 4096},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": 56, "patch_size": 14},
        mm_tokens_per_image=4, boi_token_index=255999, eoi_token_index=256000, image_token_index=262144)
    model = Gemma3ForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.08)
    with tempfile.TemporaryDirectory() as tmp:
        hf, out = Path(tmp) / "hf", Path(tmp) / "onnx"
        model.save_pretrained(str(hf))
        # transformers 5 writes the tower as vision_tower.*; mobius-onnx 0.1 reads the Hub's vision_tower.vision_model.*
        sd = load_file(str(hf / "model.safetensors"))
        save_file({("vision_tower.vision_model." + k[len("vision_tower."):] if k.startswith("vision_tower.") else k):
                   v.contiguous() for k, v in sd.items()}, str(hf / "model.safetensors"), metadata={"format": "pt"})
        subprocess.run([sys.executable, "-m", "mobius", "build", "--config", str(hf), "--runtime", "ort-genai",
                        "--ep", "cpu", str(out)], check=True, capture_output=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        vis, emb, dec = (ort.InferenceSession(str(out / p / "model.onnx")) for p in ("vision_encoder", "embedding",
                                                                                    "decoder"))
        ids = torch.tensor([[2, 105, 2364, 107, 255999] + [262144] * 4
                            + [256000, 236743, 1003, 506, 2471, 106, 107, 105, 4368, 107]])
        pv = torch.randn(1, 3, 56, 56)
        with torch.no_grad():
            both_ways = model(input_ids=ids, pixel_values=pv, token_type_ids=(ids == 262144).long()).logits[0, -1]
            causal = model(input_ids=ids, pixel_values=pv).logits[0, -1]
        feats = vis.run(None, {vis.get_inputs()[0].name: pv.numpy()})[0]
        feeds = {"inputs_embeds": emb.run(None, {"input_ids": ids.numpy(), "image_features": feats})[0],
                 "attention_mask": np.ones(ids.shape, np.int64)}
        for i in dec.get_inputs():
            if i.name.startswith("past_key_values"):
                feeds[i.name] = np.zeros((1, int(i.shape[1]), 0, int(i.shape[3])), np.float32)
        print("decoder inputs:", [i.name for i in dec.get_inputs() if not i.name.startswith("past")])
        ours = dec.run(["logits"], feeds)[0][0, -1]
        print(f"onnx vs transformers, causal (no token_type_ids): {np.abs(ours - causal.numpy()).max():.3g}")
        print(f"onnx vs transformers as Gemma 3 runs (token_type_ids): {np.abs(ours - both_ways.numpy()).max():.3g}")
        print(f"transformers with vs without token_type_ids: {(both_ways - causal).abs().max():.3g}")


if __name__ == "__main__":
    main()
