"""Where a model's sampling defaults come from: generation_config.json, GGUF metadata, the
manifest; how they layer over the server's; and what a request's unset fields become."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ortserve.config import load_settings
from ortserve.models.sampling import defaults_for, for_source, from_gguf, model_sampling
from ortserve.server.protocol import ChatCompletionRequest
from ortserve.types import SamplingDefaults


def test_generation_config_fields_that_map_exactly(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "top_k": 20, "min_p": 0.0, "max_length": 99,
         "repetition_penalty": 1.1, "typical_p": 7.0}))   # typical_p out of range: ignored, not fatal
    assert for_source(tmp_path) == {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "min_p": 0.0,
                                    "repetition_penalty": 1.1}
    assert model_sampling(tmp_path) == (for_source(tmp_path), "generation_config.json")


def test_gguf_sampling_metadata(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_float32("general.sampling.temp", 0.7)
    w.add_int32("general.sampling.top_k", 30)
    w.add_float32("general.sampling.penalty_repeat", 1.3)   # windowed in llama.cpp: not ours, left out
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert from_gguf(path) == {"temperature": pytest.approx(0.7), "top_k": 30}


def test_manifest_wins_and_layers_over_the_server(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.1}))
    (tmp_path / "ortserve.json").write_text(json.dumps({"sampling": {"temperature": 0.5, "top_k": 5}}))
    d = defaults_for(load_settings(default_top_p=0.8), tmp_path)
    assert d.values == {"temperature": 0.5, "top_p": 0.8, "top_k": 5, "min_p": 0.05, "typical_p": 1.0,
                        "repetition_penalty": 1.0}
    assert d.sources["temperature"] == "model" and d.sources["top_p"] == "server"
    assert d.model_source == "model manifest"
    off = defaults_for(load_settings(model_sampling_defaults=False), tmp_path)
    assert off.values["temperature"] == 0.8 and set(off.sources.values()) == {"server"}


def test_request_fields_left_unset_take_the_defaults() -> None:
    defaults = SamplingDefaults.layered({"temperature": 0.8, "top_k": 40, "min_p": 0.05}, {"top_k": 7}, "x")
    req = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}],
                                                "temperature": 0, "top_p": None})
    p = req.to_sampling_params(16, 64, defaults=defaults)
    assert (p.temperature, p.top_k, p.min_p, p.top_p) == (0, 7, 0.05, 1.0)   # explicit 0 stays greedy
    assert p.greedy
    headers = req.sampling_headers(p, defaults)
    assert headers["X-Ortserve-Sampling-Defaults"] == "top_k=model, min_p=server"
    neutral = req.to_sampling_params(16, 64)    # no defaults (routed requests): SamplingParams' own
    assert (neutral.top_k, neutral.min_p) == (0, 0.0)


def test_cli_flags_left_unset_take_the_defaults() -> None:
    from ortserve.cli.talk import params_from
    from ortserve.errors import InvalidRequest

    def flags(**given: object) -> dict:
        kw = {"max_tokens": 8, "seed": None, "logit_bias": (), "temperature": None, "top_p": None, "top_k": None,
              "min_p": None, "typical_p": None, "repetition_penalty": None}
        return {**kw, **given}

    defaults = SamplingDefaults.layered({"temperature": 0.8, "top_k": 40, "min_p": 0.05}, {})
    p = params_from(flags(temperature=0.0, logit_bias=("17=-100", "3=2.5")), defaults)
    assert (p.temperature, p.top_k, p.min_p, p.logit_bias) == (0.0, 40, 0.05, ((3, 2.5), (17, -100.0)))
    with pytest.raises(InvalidRequest) as e:
        params_from(flags(logit_bias=("17",)), defaults)
    assert e.value.param == "logit_bias"
