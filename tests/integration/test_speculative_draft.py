"""Draft-model speculation on real models (engine/speculation/draft.py): a draft of the same vocabulary with other
random weights, and the target as its own draft; greedy tokens identical with the draft on and off,
near-full acceptance when the draft is the target, the draft's KV following what was accepted, and
a vocabulary mismatch refused at load naming both models."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from ortserve.config import load_settings
from ortserve.engine import AsyncEngine
from ortserve.engine.speculation.draft import check_vocabulary, common_prefix
from ortserve.errors import ModelError
from ortserve.types import SamplingParams

PROMPTS = ["Write a short story about a lighthouse keeper.",
           "one two three four one two three four one two",
           "List three colours and say why the sky is blue."]


@pytest.fixture(scope="module")
def draft_model(tmp_path_factory: pytest.TempPathFactory, smollm2_tokenizer_dir: Path) -> Path:
    """A second tiny Llama of the SmolLM2 vocabulary with other random weights (and 1 layer)."""
    from ortserve.models.convert import build_onnx, make_tiny_llama

    hf = make_tiny_llama(tmp_path_factory.mktemp("draft-hf") / "hf", smollm2_tokenizer_dir, layers=1, seed=7)
    return build_onnx(hf, tmp_path_factory.mktemp("draft-onnx") / "model", precision="fp32")


def load(model: Path, draft: Path | None, **kw: object) -> AsyncEngine:
    eng = AsyncEngine.load(model, load_settings(max_batch=4, prefix_cache=False, **kw),
                           draft=(draft, draft.name) if draft else None)
    eng.core.start()
    return eng


def run(eng: AsyncEngine, prompt: str, params: SamplingParams):
    return asyncio.run(eng.generate(prompt=prompt, params=params))


@pytest.fixture(scope="module")
def plain(tiny_model: Path):
    eng = load(tiny_model, None, speculative=False)
    yield eng
    eng.core.stop()


@pytest.mark.parametrize("lookup", [False, True], ids=["draft-only", "lookup-first"])
def test_greedy_tokens_are_identical_with_a_random_draft(plain, tiny_model: Path, draft_model: Path,
                                                         lookup: bool) -> None:
    eng = load(tiny_model, draft_model, speculative_lookup=lookup)
    try:
        params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
        for prompt in PROMPTS:
            on, off = run(eng, prompt, params), run(plain, prompt, params)
            assert on.text == off.text, prompt
            stats = on.metrics.speculative
            assert stats is not None and stats["proposed"] >= stats["accepted"]
        core = eng.core
        assert core.spec_draft_proposed > 0  # the draft guessed (and was verified)
        assert core.spec_draft_proposed <= core.spec_proposed
        assert eng.stats().speculative_draft_proposed == core.spec_draft_proposed
        if not lookup:
            assert core.spec_proposed == core.spec_draft_proposed and stats["draft"]["proposed"] > 0
    finally:
        eng.core.stop()


def test_the_target_as_its_own_draft_is_accepted_almost_always(plain, tiny_model: Path) -> None:
    eng = load(tiny_model, tiny_model, speculative_lookup=False, speculative_k=4)
    try:
        params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
        for prompt in PROMPTS:
            res = run(eng, prompt, params)
            assert res.text == run(plain, prompt, params).text
            d = res.metrics.speculative["draft"]
            # the verify step computes the same logits as the draft's decode steps up to float noise
            assert d["acceptance"] >= 0.95 and d["proposed"] >= 30, d
            # k grew to 4: 40 tokens in about 40/5 verify steps (+1 after prefill)
            assert d["steps"] <= 12, d
        # the draft's row holds the last sequence up to what was accepted, no rejected guess
        draft = eng.model.draft
        assert draft is not None and int(draft.runner.lengths[0]) == len(draft.held)
    finally:
        eng.core.stop()


def test_sampling_with_a_draft_gives_a_seeded_answer_of_the_right_length(tiny_model: Path,
                                                                          draft_model: Path) -> None:
    eng = load(tiny_model, tiny_model, speculative_lookup=False)
    try:
        for seed in range(3):
            p = SamplingParams(temperature=0.8, top_p=0.9, seed=seed, max_tokens=12, ignore_eos=True)
            res = run(eng, PROMPTS[0], p)
            assert res.metrics.output_tokens == 12 and res.finish_reason == "length"
        for n in (1, 2, 3, 5):  # max_tokens bounds what a verify step takes
            res = run(eng, PROMPTS[1], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
            assert res.metrics.output_tokens == n
    finally:
        eng.core.stop()


def test_a_draft_of_another_vocabulary_is_refused_naming_both_models(tiny_model: Path, tmp_path: Path) -> None:
    other = tmp_path / "other-draft"
    shutil.copytree(tiny_model, other)
    tok = json.loads((other / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = tok["model"]["vocab"]
    a, b = (next(w for w, i in vocab.items() if i == n) for n in (300, 301))
    vocab[a], vocab[b] = 301, 300  # two tokens swap ids: the same strings, another map
    (other / "tokenizer.json").write_text(json.dumps(tok), encoding="utf-8")
    with pytest.raises(ModelError) as err:
        AsyncEngine.load(tiny_model, load_settings(max_batch=2), model_id="tiny", draft=(other, "other-draft"))
    msg = err.value.message
    assert "other-draft" in msg and "tiny" in msg and "token 300" in msg and repr(b) in msg
    with pytest.raises(ModelError, match="does not exist"):
        AsyncEngine.load(tiny_model, load_settings(max_batch=2), draft=(tmp_path / "nope", "nope"))
    check_vocabulary(tiny_model, "a", tiny_model, "b")  # the same directory: nothing to compare


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3, 4], [1, 2, 5], limit=10) == 2
    assert common_prefix([1, 2, 3], [1, 2, 3, 4], limit=2) == 2
    assert common_prefix([], [1], limit=5) == 0
    assert common_prefix(list(np.arange(5)), list(np.arange(5)), limit=5) == 5


def test_the_server_reports_draft_guesses_per_request_and_in_metrics(tiny_model: Path, draft_model: Path) -> None:
    import httpx
    from servers import ServerThread

    with ServerThread(tiny_model, draft_model=str(tiny_model), speculative_lookup=False) as srv:
        r = httpx.post(f"{srv.url}/v1/chat", json={"messages": [{"role": "user", "content": PROMPTS[0]}],
                                                   "max_tokens": 16, "temperature": 0}, timeout=60)
        assert r.status_code == 200, r.text
        spec = r.json()["metrics"]["speculative"]
        assert spec["draft"]["accepted"] > 0 and spec["lookup"]["proposed"] == 0
        text = httpx.get(f"{srv.url}/metrics").text
        value = {line.split()[0]: float(line.split()[-1]) for line in text.splitlines()
                 if line.startswith("ortserve_speculative_")}
        assert value["ortserve_speculative_draft_accepted_tokens_total"] >= spec["draft"]["accepted"]
        assert value["ortserve_speculative_accepted_tokens_total"] >= value[
            "ortserve_speculative_draft_accepted_tokens_total"]
        ui = httpx.get(f"{srv.url}/ui/stats").json()["speculative"]["draft"]
        assert ui["model"] == tiny_model.name and ui["accepted"] == value[
            "ortserve_speculative_draft_accepted_tokens_total"]
        ps = httpx.get(f"{srv.url}/v1/admin/ps").json()["models"]
        row = next(m for m in ps if m["kind"] == "chat")
        assert row["draft"] == tiny_model.name  # `ortserve ps` shows it, and its weights are counted
        from ortserve.server.memory import weights_bytes

        assert row["memory_bytes"] > 2 * weights_bytes(tiny_model), row  # the target, its KV, the draft


def test_a_bad_draft_model_is_a_clear_error_at_serve(tiny_model: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from ortserve.cli.main import cli

    env = {"ORTSERVE_HOME": str(tmp_path / "home")}
    res = CliRunner().invoke(cli, ["serve", "--model", str(tiny_model), "--draft-model", "no-such-draft",
                                   "--port", "0"], env=env)
    assert res.exit_code == 1 and "draft model 'no-such-draft'" in res.output, res.output
    # the in-process commands read the setting too (ortserve ask / chat, the Python LLM)
    res = CliRunner().invoke(cli, ["ask", "--model", str(tiny_model), "hello"],
                             env={**env, "ORTSERVE_DRAFT_MODEL": "no-such-draft"})
    assert res.exit_code == 1 and "draft model 'no-such-draft'" in res.output, res.output


def test_the_drafts_row_comes_out_of_the_kv_budget(tiny_model: Path, draft_model: Path) -> None:
    eng = AsyncEngine.load(tiny_model, load_settings(max_batch=2, kv_cache_mb=8), draft=(draft_model, "d"))
    row = eng.model.draft_kv_bytes
    draft = eng.model.draft.runner
    assert row == min(eng.context_length + 1, draft.spec.context_length) * draft.bytes_per_token
    assert eng.kv_budget == (8 << 20) - row and draft.byte_limit == row
    assert eng.model.runner.bytes_per_token * 2048 >= 1 << 20  # so one row of the tiny model fills 1 MB
    with pytest.raises(ModelError, match=r"draft model itself would take 1\.0 MB, all of the 1\.0 MB KV budget"):
        AsyncEngine.load(tiny_model, load_settings(max_batch=2, kv_cache_mb=1), draft=(tiny_model, "itself"))
