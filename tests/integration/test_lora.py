"""LoRA adapters (issue 35) on the tiny random Llama: PEFT adapters made with peft (random,
nonzero A and B on every attention and MLP projection), imported into the store, served by the
real engine; the reference is the merged-weights model (W + scale * B @ A) exported separately
through ortserve's own builder path."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from tests.integration.lora_material import TARGETS

from ortserve.engine import AsyncEngine
from ortserve.engine.runner import ModelSpec, Runner
from ortserve.models.adapters import AdapterError, import_adapter, load_adapter, read_peft
from ortserve.types import SamplingParams

PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def answers(engine: AsyncEngine, *batches: list[tuple[str, str]]) -> list[list[tuple[list[int], str]]]:
    """Greedy answers of each batch of (adapter, prompt) jobs, a batch submitted at once (mixed)."""
    async def one(jobs: list[tuple[str, str]]) -> list[tuple[list[int], str]]:
        handles = [engine.submit(prompt=p, params=GREEDY, adapter=a) for a, p in jobs]
        out = []
        for h in handles:
            ids, text = [], []
            async for ev in h:
                ids += ev.token_ids
                text.append(ev.text)
            out.append((ids, "".join(text)))
        return out

    async def go() -> list[list[tuple[list[int], str]]]:
        await engine.start()
        try:
            return [await one(b) for b in batches]
        finally:
            await engine.stop()

    return asyncio.run(go())


@pytest.mark.parametrize("mode", ["mask", "gather"])
def test_adapter_logits_equal_the_merged_model(lora: SimpleNamespace, tiny_model: Path, mode: str) -> None:
    spec = ModelSpec.read(tiny_model)
    runner = Runner(spec, slots=4, lora=True, lora_mode=mode)
    runner.set_adapters(lora.adapters)
    merged = Runner(ModelSpec.read(lora.merged), slots=4)
    base = Runner(spec, slots=4)
    ids = [1, 504, 3032, 282, 4649, 314]
    runner.use_adapter(1, "other")  # a mixed batch: row 1 runs another adapter beside row 0
    runner.prefill(1, ids)
    runner.use_adapter(0, "my-adapter")
    got, want, plain = runner.prefill(0, ids), merged.prefill(0, ids), base.prefill(0, ids)
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= 1e-4 * scale
    assert np.abs(plain - want).max() > 1e-2 * scale  # the adapter changes the model
    for _ in range(8):  # decode steps: the KV written with the adapter stays exact
        tok = np.array([int(want.argmax())])
        assert int(got.argmax()) == tok[0]
        got, want = runner.decode(np.array([tok[0], 7]))[0], merged.decode(tok)[0]
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def test_greedy_tokens_equal_the_merged_model(lora: SimpleNamespace, tiny_model: Path) -> None:
    engine = AsyncEngine.load(tiny_model, adapters=lora.adapters)
    reference = AsyncEngine.load(lora.merged)
    assert answers(engine, [("my-adapter", p) for p in PROMPTS]) == answers(reference, [("", p) for p in PROMPTS])


def test_speculation_with_an_adapter_gives_the_merged_models_tokens(lora: SimpleNamespace, tiny_model: Path) -> None:
    """A lone adapter row that speculates (its verify step feeds several tokens through the LoRA
    terms) gives the merged model's tokens computed one at a time. Three boosted tokens make the
    random model write a pattern that prompt lookup guesses (as in test_speculative_engine.py)."""
    from ortserve.config import load_settings

    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True,
                            logit_bias={"504": 100.0, "3032": 100.0, "282": 100.0})
    engine = AsyncEngine.load(tiny_model, adapters=lora.adapters)
    reference = AsyncEngine.load(lora.merged, load_settings(speculative=False))

    async def go(eng: AsyncEngine, adapter: str) -> tuple[str, int]:
        await eng.start()
        try:
            out = await eng.generate(prompt=PROMPTS[0], params=params, adapter=adapter)
            return out.text, eng.stats().speculative_proposed
        finally:
            await eng.stop()

    (text, proposed), (want, _) = asyncio.run(go(engine, "my-adapter")), asyncio.run(go(reference, ""))
    assert proposed > 0 and text == want


def test_a_mixed_batch_gives_each_row_its_own_answer(lora: SimpleNamespace, tiny_model: Path) -> None:
    engine = AsyncEngine.load(tiny_model, adapters=lora.adapters)
    jobs = [(a, p) for p in PROMPTS for a in ("", "my-adapter", "other")]
    together, *alone = answers(engine, jobs, *[[job] for job in jobs])
    alone = [a[0] for a in alone]
    assert together == alone
    for i in range(0, len(jobs), 3):  # three different models: three different answers
        assert len({tuple(ids) for ids, _ in together[i:i + 3]}) == 3


def test_the_prefix_cache_never_matches_across_adapters(lora: SimpleNamespace, tiny_model: Path) -> None:
    engine = AsyncEngine.load(tiny_model, adapters=lora.adapters)
    prompt = "A long shared system prompt that an agent resends on every turn, " * 4

    async def go() -> list[int]:
        await engine.start()
        try:
            cached = []
            for adapter in ("my-adapter", "other", "my-adapter"):
                out = await engine.generate(prompt=prompt, params=GREEDY, adapter=adapter)
                cached.append(out.metrics.cached_tokens)
            return cached
        finally:
            await engine.stop()

    first, other, again = asyncio.run(go())
    assert first == 0 and other == 0  # another adapter's KV is never reused
    assert again > 0                  # the same adapter's is


def write_peft(src: Path, dst: Path, *, config: dict | None = None, tensors=None) -> Path:  # type: ignore[no-untyped-def]
    from safetensors.numpy import load_file, save_file

    shutil.copytree(src, dst)
    cfg = json.loads((src / "adapter_config.json").read_text()) | (config or {})
    (dst / "adapter_config.json").write_text(json.dumps(cfg))
    if tensors is not None:
        save_file(tensors(load_file(str(src / "adapter_model.safetensors"))), str(dst / "adapter_model.safetensors"))
    return dst


def test_mismatched_adapters_fail_at_import_naming_the_mismatch(lora: SimpleNamespace, tmp_path: Path) -> None:
    def narrower(t: dict) -> dict:  # trained on a base with hidden size 32, not 64
        return {k: (v[:, :32] if "q_proj.lora_A" in k else v) for k, v in t.items()}

    def embed(t: dict) -> dict:
        k = next(k for k in t if "self_attn.q_proj" in k)
        return t | {k.replace("self_attn.q_proj", "self_attn.rotary"): t[k]}

    def deep(t: dict) -> dict:  # a layer the 2-layer base does not have
        return t | {k.replace("layers.0.", "layers.7."): v for k, v in t.items() if "layers.0." in k}

    cases = [(write_peft(lora.one, tmp_path / "hidden", tensors=narrower), "shape mismatch at layers.0.q_proj"),
             (write_peft(lora.one, tmp_path / "rank", config={"r": 16}), "rank mismatch"),
             (write_peft(lora.one, tmp_path / "target", tensors=embed), "rotary"),
             (write_peft(lora.one, tmp_path / "deep", tensors=deep), "layers.7"),
             (write_peft(lora.one, tmp_path / "dora", config={"use_dora": True}), "DoRA")]
    for path, needle in cases:
        with pytest.raises(AdapterError, match=needle.replace(".", r"\.")):
            import_adapter(lora.store, path, "tiny", name=path.name)
    assert {v.model for v in lora.store.variants() if v.kind == "adapter"} == {"my-adapter", "other"}
    _, weights = read_peft(lora.one, scale=0.5)  # --scale multiplies the adapter's own alpha/r
    _, full = read_peft(lora.one)
    assert np.allclose(2 * weights["layers.1.down_proj"][1], full["layers.1.down_proj"][1])


def test_import_adapter_cli_and_store_manifest(lora: SimpleNamespace, tmp_path: Path) -> None:
    env = {**os.environ, "ORTSERVE_HOME": str(lora.home)}
    cmd = [sys.executable, "-m", "ortserve.cli.main", "models", "import-adapter", str(lora.two), "--base", "tiny",
           "--id", "cli-adapter", "--scale", "0.5", "--json"]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    v = json.loads(res.stdout)
    assert v["kind"] == "adapter" and v["base"] == "tiny:fp32-cpu" and v["notes"]["rank"] == 8
    assert set(v["notes"]["target_modules"]) == set(TARGETS)
    assert lora.store.verify(lora.store.get("cli-adapter")) == {"corrupt": [], "missing": [], "extra": []}
    shown = subprocess.run(cmd[:4] + ["show", "cli-adapter"], env=env, capture_output=True, text=True, timeout=120,
                           check=False)
    assert "cli-adapter (LoRA adapter of tiny:fp32-cpu): rank 8, scale 0.5" in shown.stdout, shown.stderr
    bad = subprocess.run(cmd[:5] + [str(lora.one), "--base", "no-such-model"], env=env, capture_output=True,
                         text=True, timeout=120, check=False)
    assert bad.returncode != 0 and "no-such-model" in bad.stderr + bad.stdout
    lora.store.remove("cli-adapter")


def test_openai_client_picks_the_adapter_by_model_name(lora: SimpleNamespace, tiny_model: Path) -> None:
    import httpx
    import openai
    from tests.servers import ServerThread

    msg = [{"role": "user", "content": "Say hi"}]
    merged = AsyncEngine.load(lora.merged)

    async def want() -> str:
        await merged.start()
        try:
            return (await merged.generate(messages=msg, params=SamplingParams(temperature=0.0, max_tokens=8))).text
        finally:
            await merged.stop()

    with ServerThread(tiny_model, home=lora.home) as srv:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none")

        def ask(model: str) -> openai.types.chat.ChatCompletion:
            return client.chat.completions.create(model=model, messages=msg, max_tokens=8, temperature=0)

        base, by_base, by_id, other = ask("tiny"), ask("tiny:my-adapter"), ask("my-adapter"), ask("tiny:other")
        assert by_base.model == by_id.model == "my-adapter" and other.model == "other"
        assert by_base.choices[0].message.content == by_id.choices[0].message.content == asyncio.run(want())
        assert len({base.choices[0].message.content, by_id.choices[0].message.content,
                    other.choices[0].message.content}) == 3
        listed = {m.id: m for m in client.models.list().data}
        assert listed["my-adapter"].parent == "tiny:fp32-cpu" and listed["my-adapter"].kind == "adapter"
        ps = httpx.get(f"{srv.url}/v1/admin/ps", timeout=10).json()["models"]
        assert sorted(ps[0]["adapters"]) == ["my-adapter", "other"]
        shown = subprocess.run([sys.executable, "-m", "ortserve.cli.main", "ps", "--url", srv.url],
                               capture_output=True, text=True, timeout=60, check=False)
        assert "ADAPTERS" in shown.stdout and "my-adapter (in 5 min), other (in 5 min)" in shown.stdout, shown.stderr
        with pytest.raises(openai.NotFoundError) as err:
            ask("tiny:no-such-adapter")
        assert err.value.body["param"] == "model"
        import_adapter(lora.store, lora.two, "tiny", name="late")  # imported while the base serves
        assert ask("tiny:late").choices[0].message.content == other.choices[0].message.content
        assert "late" in httpx.get(f"{srv.url}/v1/admin/ps", timeout=10).json()["models"][0]["adapters"]
    lora.store.remove("late")


def test_an_adapter_for_a_base_loaded_without_lora_is_a_clear_400(lora: SimpleNamespace) -> None:
    import httpx
    from tests.servers import ServerThread

    lora.store.install("merged", "fp32-cpu", lambda _tmp: {"precision": "fp32", "device": "cpu",
                                                           "link": str(lora.merged)})
    with ServerThread(lora.merged, model_id="merged", home=lora.home) as srv:  # no adapters: no LoRA edit
        import_adapter(lora.store, lora.one, "merged", name="too-late")
        r = httpx.post(f"{srv.url}/v1/chat/completions", timeout=60, json={
            "model": "merged:too-late", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        assert r.status_code == 400 and r.json()["error"]["param"] == "model"
        assert "loaded without LoRA support" in r.json()["error"]["message"]
    lora.store.remove("too-late")


def test_a_llama_cpp_lora_gguf_imports_to_the_same_adapter(lora: SimpleNamespace, tiny_hf_dir: Path) -> None:
    """convert_lora_to_gguf.py (llama.cpp's sdist) on the PEFT adapter: the same weights once
    imported (its q/k rows un-permuted back to the base graph's order), so the same model."""
    from tests.llamacpp import llama_cpp_src

    src = llama_cpp_src()
    out = lora.root / "my-adapter.gguf"
    res = subprocess.run([sys.executable, str(src / "convert_lora_to_gguf.py"), "--base", str(tiny_hf_dir),
                          "--outtype", "f32", "--outfile", str(out), str(lora.one)], capture_output=True, text=True,
                         timeout=300, check=False, env={**os.environ, "PYTHONPATH": str(src / "gguf-py")})
    assert res.returncode == 0, res.stderr[-2000:]
    v = import_adapter(lora.store, out, "tiny", name="from-gguf")
    got, want = load_adapter(v).weights, lora.adapters[0].weights
    assert sorted(got) == sorted(want) and len(want) == 14
    for key in want:
        assert np.allclose(got[key][0], want[key][0]) and np.allclose(got[key][1], want[key][1], atol=1e-7), key
    lora.store.remove("from-gguf")
    with pytest.raises(AdapterError, match="not a LoRA adapter GGUF"):
        import_adapter(lora.store, next((src / "models").glob("ggml-vocab-llama-bpe.gguf")), "tiny", name="vocab")
