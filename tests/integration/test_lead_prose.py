r"""Prose before a tool call under ``tool_choice: auto`` ("Let me check." then the call), end to end.

No real small model reliably writes prose and then a call, so the test material is a real ONNX model
whose weights write a fixed text: a one-layer Llama with the SmolLM2 tokenizer whose attention and
MLP outputs are zero, so each step's hidden state is the current token's embedding, and whose
untied LM head maps each scripted token's embedding to the next scripted token (a bigram table).
Greedy, it writes "Let me check." and then Hermes' ``<tool_call>\n``; the grammar forces the call
that follows. Served on 127.0.0.1 and read with the real openai and anthropic clients: Chat
Completions, Responses and Messages each return the prose and the call, streamed and not.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import anthropic
import pytest
from openai import OpenAI
from servers import ServerThread

PROSE = ["Let", " me", " check", "."]
OPENER = ["<", "tool", "_", "call", ">", "\n"]
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time now",
                                         "parameters": {"type": "object", "properties": {}}}}
ASK = [{"role": "user", "content": "What time is it?"}]


def scripted_llama(out: Path, tokenizer_dir: Path) -> Path:
    """The HF model described above: after the prompt's last token it writes PROSE + OPENER."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    ids = [tok.convert_tokens_to_ids(tok.tokenize(t))[0] for t in PROSE + OPENER]
    assert all(len(tok.tokenize(t)) == 1 for t in PROSE + OPENER)
    prompt = tok.encode(tok.apply_chat_template(ASK, tokenize=False, add_generation_prompt=True),
                        add_special_tokens=False)
    chain = [prompt[-1], *ids]  # the generation prompt ends with "\n", which OPENER also ends with
    assert len(set(chain[:-1])) == len(chain) - 1  # each token of the chain has one successor
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
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
        for k, (cur, nxt) in enumerate(itertools.pairwise(chain)):
            emb[cur] = 0.0
            emb[cur, k] = 1.0
            head[nxt, k] = 10.0
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, smollm2_tokenizer_dir: Path) -> Iterator[ServerThread]:
    from ortserve.models.convert import build_onnx

    hf = scripted_llama(tmp_path_factory.mktemp("scripted-hf") / "hf", smollm2_tokenizer_dir)
    model = build_onnx(hf, tmp_path_factory.mktemp("scripted-onnx") / "model", precision="fp32")
    with ServerThread(model, model_id="scripted") as s:
        yield s


def test_the_scripted_model_writes_its_text(srv: ServerThread) -> None:
    """Without tools, its first ten tokens are the script."""
    client = OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=120)
    r = client.chat.completions.create(model="scripted", messages=ASK, max_tokens=10, temperature=0)  # type: ignore[arg-type]
    assert r.choices[0].message.content == "Let me check.<tool_call>\n"


@pytest.mark.parametrize("stream", [False, True])
def test_chat_completions_return_the_prose_and_the_call(srv: ServerThread, stream: bool) -> None:
    client = OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=120)
    kw = {"model": "scripted", "messages": ASK, "tools": [TIME], "max_tokens": 80, "temperature": 0}
    if not stream:
        r = client.chat.completions.create(**kw)  # type: ignore[call-overload]
        choice = r.choices[0]
        content, calls, finish = choice.message.content, choice.message.tool_calls, choice.finish_reason
        got = [(c.function.name, c.function.arguments) for c in calls or []]
    else:
        parts, args, names, finish = [], {}, {}, None
        for chunk in client.chat.completions.create(stream=True, **kw):  # type: ignore[call-overload]
            d = chunk.choices[0].delta
            parts.append(d.content or "")
            for c in d.tool_calls or []:
                names[c.index] = names.get(c.index) or (c.function.name if c.function else None)
                args[c.index] = args.get(c.index, "") + ((c.function.arguments or "") if c.function else "")
            finish = chunk.choices[0].finish_reason or finish
        content, got = "".join(parts), [(names[i], args[i]) for i in sorted(args)]
    assert content == "Let me check."
    assert got == [("get_time", "{}")] and finish == "tool_calls"  # the model's repeat of the call is dropped


def test_tool_choice_required_has_no_room_for_prose(srv: ServerThread) -> None:
    client = OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=120)
    r = client.chat.completions.create(model="scripted", messages=ASK, tools=[TIME],  # type: ignore[arg-type]
                                       tool_choice="required", max_tokens=80, temperature=0)
    msg = r.choices[0].message
    assert not msg.content and [c.function.name for c in msg.tool_calls or []] == ["get_time"]


def test_responses_output_a_message_then_the_call(srv: ServerThread) -> None:
    client = OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=120)
    tool = {"type": "function", "name": "get_time", "description": "The time now",
            "parameters": {"type": "object", "properties": {}}}
    r = client.responses.create(model="scripted", input="What time is it?", tools=[tool],  # type: ignore[list-item]
                                max_output_tokens=80, temperature=0)
    assert [o.type for o in r.output] == ["message", "function_call"]
    assert r.output_text == "Let me check."
    assert r.output[1].name == "get_time" and json.loads(r.output[1].arguments) == {}  # type: ignore[union-attr]
    with client.responses.stream(model="scripted", input="What time is it?", tools=[tool],  # type: ignore[list-item]
                                 max_output_tokens=80, temperature=0) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert "".join(deltas) == "Let me check." and [o.type for o in final.output] == ["message", "function_call"]


@pytest.mark.parametrize("stream", [False, True])
def test_messages_return_a_text_block_then_tool_use(srv: ServerThread, stream: bool) -> None:
    claude = anthropic.Anthropic(base_url=srv.url, api_key="none", max_retries=0, timeout=120)
    kw = {"model": "scripted", "max_tokens": 80, "messages": ASK,  # its logits make sampling greedy
          "tools": [{"name": "get_time", "description": "The time now", "input_schema": {"type": "object"}}]}
    if stream:
        with claude.messages.stream(**kw) as s:  # type: ignore[arg-type]
            m = s.get_final_message()
    else:
        m = claude.messages.create(**kw)  # type: ignore[arg-type]
    assert [b.type for b in m.content] == ["text", "tool_use"] and m.stop_reason == "tool_use"
    assert m.content[0].text == "Let me check." and m.content[1].name == "get_time"  # type: ignore[union-attr]
