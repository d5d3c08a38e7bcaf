"""Which FIM tokens a vocabulary has (engine/fim.py), per family, and llama-server's /infill prompt order."""

from __future__ import annotations

from ortserve.engine.fim import find_fim, infill_ids


def lookup(tokens: list[str]):  # type: ignore[no-untyped-def]
    ids = {t: 1000 + i for i, t in enumerate(tokens)}
    return ids.get


def test_each_familys_fim_tokens_are_found_by_their_text() -> None:
    qwen = find_fim(lookup(["<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                            "<|repo_name|>", "<|file_sep|>"]))
    assert qwen is not None and qwen.shape == "qwen2.5-coder"
    assert (qwen.prefix, qwen.suffix, qwen.middle, qwen.repo, qwen.file_sep) == (1001, 1003, 1002, 1005, 1006)
    llama = find_fim(lookup(["<s>", "\u2581<PRE>", "\u2581<SUF>", "\u2581<MID>", "\u2581<EOT>"]))
    assert llama is not None and llama.shape == "codellama" and (llama.prefix, llama.suffix, llama.middle) == (
        1001, 1002, 1003) and llama.repo is None and llama.file_sep is None
    star = find_fim(lookup(["<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>", "<repo_name>", "<file_sep>"]))
    assert star is not None and star.shape == "starcoder" and (star.repo, star.file_sep) == (1004, 1005)
    deepseek = find_fim(lookup(["<\uff5cfim\u2581hole\uff5c>", "<\uff5cfim\u2581begin\uff5c>", "<\uff5cfim\u2581end\uff5c>"]))
    assert deepseek is not None and (deepseek.prefix, deepseek.suffix, deepseek.middle) == (1001, 1000, 1002)


def test_declared_gguf_ids_win_and_a_partial_set_is_no_fim() -> None:
    declared = find_fim(lookup(["<fim_prefix>", "<fim_middle>", "<fim_suffix>"]), {"pre": 7, "suf": 8, "mid": 9, "sep": 3})
    assert declared is not None and (declared.shape, declared.prefix, declared.file_sep, declared.repo) == (
        "gguf", 7, 3, None)
    assert find_fim(lookup(["<fim_prefix>", "<fim_suffix>"])) is None  # no middle: not a FIM vocabulary
    assert find_fim(lookup(["<|im_start|>", "<|im_end|>"])) is None


def test_the_infill_prompt_is_llama_servers_order() -> None:
    fim = find_fim(lookup(["<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|repo_name|>", "<|file_sep|>"]))
    assert fim is not None

    def enc(text: str) -> list[int]:
        return [ord(c) for c in text]

    ids = infill_ids(fim, enc, "ab", "cd", prompt="P", extra=[("u.py", "x")], bos=[1])
    assert ids == [1003, *enc("myproject\n"), 1004, *enc("u.py\n"), *enc("x"), 1004, *enc("filename\n"),
                   1, 1000, *enc("ab"), *enc("P"), 1002, *enc("cd"), 1001]
    assert infill_ids(fim, enc, "ab", "cd", repo_header=False) == [1000, *enc("ab"), 1002, *enc("cd"), 1001]
    no_files = find_fim(lookup(["\u2581<PRE>", "\u2581<SUF>", "\u2581<MID>"]))
    assert no_files is not None
    assert infill_ids(no_files, enc, "a", "b", extra=[("f", "t")]) == [
        *enc("\n\n--- snippet ---\n\n"), *enc("t"), 1000, *enc("a"), 1001, *enc("b"), 1002]


def test_a_ggufs_fim_keys_are_kept_in_the_tokenizer_config(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    import gguf

    from ortserve.models.gguf_vocab import keep_fim_ids
    from ortserve.models.validate import gguf_metadata

    path = tmp_path / "fim.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in {"pre": 151659, "suf": 151661, "mid": 151660, "sep": 151664}.items():
        w.add_uint32(f"tokenizer.ggml.fim_{key}_token_id", value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out = tmp_path / "model"
    out.mkdir()
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}), encoding="utf-8")
    assert keep_fim_ids(gguf_metadata(path), out) == {"pre": 151659, "suf": 151661, "mid": 151660, "sep": 151664}
    cfg = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert cfg["eos_token"] == "<|endoftext|>"
    fim = find_fim(lambda _t: None, cfg["fim_token_ids"])
    assert fim is not None and (fim.prefix, fim.suffix, fim.middle, fim.file_sep) == (151659, 151661, 151660, 151664)
