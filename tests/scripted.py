"""A real ONNX model whose weights write a fixed text, for end-to-end tests of output handling that no
small model does reliably (prose before a call, reasoning before an answer).

It is a one-layer Llama whose attention and MLP outputs are zero, so each step's hidden state is the
current token's embedding, with an untied LM head that maps each scripted token's embedding to the
next scripted token: a bigram table. Each token of the chain must have one successor; a token the
grammar forces may repeat, since its successor is never asked for."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any


def scripted_llama(out: Path, tokenizer_dir: Path, chain: list[str], *, added: tuple[str, ...] = (),
                   special: tuple[str, ...] = (), template: str | None = None, starts: tuple[str, ...] = ()) -> Path:
    """The HF model: after the rendered generation prompt it writes ``chain`` (each text one token;
    ``added``, ``special``: tokens added to the tokenizer first, as a family's own vocabulary has
    them, the ``special`` ones as special tokens, which decoders skip). The
    chain's first token follows the prompt's last one, and each of ``starts`` (texts of one token
    each: where other prompts of the template end) leads into the token after it in the chain."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok: Any = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    if added:
        tok.add_tokens(list(added))
    if special:
        tok.add_special_tokens({"additional_special_tokens": list(special)})
    if template is not None:
        tok.chat_template = template

    def one(text: str) -> int:
        pieces = tok.tokenize(text)
        assert len(pieces) == 1, (text, pieces)
        return int(tok.convert_tokens_to_ids(pieces)[0])

    ask = [{"role": "user", "content": "What time is it?"}]
    prompt = tok.encode(tok.apply_chat_template(ask, tokenize=False, add_generation_prompt=True),
                        add_special_tokens=False)
    ids = [one(t) for t in chain]
    pairs = list(itertools.pairwise([prompt[-1], *ids]))
    pairs += [(one(s), ids[chain.index(s) + 1]) for s in starts]
    successors: dict[int, int] = {}
    for cur, nxt in pairs:
        assert successors.setdefault(cur, nxt) == nxt, f"token {cur} would need two successors"
    hidden = 64 * -(-len(successors) // 64)  # one embedding dimension per token that has a successor
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      tie_word_embeddings=False, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        layer = model.model.layers[0]
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
        emb, head = model.model.embed_tokens.weight, model.lm_head.weight
        head.zero_()
        for k, (cur, nxt) in enumerate(successors.items()):
            emb[cur] = 0.0
            emb[cur, k] = 1.0
            head[nxt, k] = 10.0
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out


def build(tmp: Path, tokenizer_dir: Path, chain: list[str], **kw: Any) -> Path:
    """``scripted_llama`` built to an fp32 ONNX GenAI directory under ``tmp``."""
    from ortserve.models.convert import build_onnx

    hf = scripted_llama(tmp / "hf", tokenizer_dir, chain, **kw)
    return build_onnx(hf, tmp / "model", precision="fp32")
