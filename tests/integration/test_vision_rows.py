"""Image rows in the continuous batch (issue 42; docs/vision.md "Batched rows"), on the random
Qwen2.5-VL of the session (``tiny_vl``): the batched engine fed inputs_embeds and Qwen's 3-row
mRoPE positions (engine/embeds_runner.py, vision/rows.py) gives og's generator's greedy tokens;
image and text requests decode in the same steps and each gives what it gives alone; the prefix
cache keys on the image as well as the tokens, and the feature cache on the image's bytes."""

from __future__ import annotations

import asyncio
import io
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from ortserve.models.store import Variant
from ortserve.types import SamplingParams

pytest.importorskip("mobius")
GREEDY = SamplingParams(temperature=0.0, max_tokens=10)


def png(width: int = 84, height: int = 56, seed: int = 0) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def image_turn(text: str, data: bytes) -> tuple[list[dict[str, Any]], list[Any]]:
    from ortserve.vision.images import ImageInput
    from ortserve.vision.runner import MARKER

    return [{"role": "user", "content": MARKER + text}], [ImageInput(data, "image")]


def text_turn(text: str) -> tuple[list[dict[str, Any]], list[Any]]:
    return [{"role": "user", "content": text}], []


def load(v: Variant, chunk: int = 512) -> Any:
    from ortserve.server.vision_engine import VisionEngine

    settings = SimpleNamespace(max_batch=8, kv_cache_mb=64, prefill_chunk=chunk, prefix_cache=True, huge_pages=False)
    return VisionEngine(v.model, v.model_dir, settings, ThreadPoolExecutor(1))


def capture(core: Any) -> dict[str, Any]:
    """The engine's sequences by request id, as they are queued: their output ids are the tokens
    (a TokenEvent carries the ids of the text it releases, not every token)."""
    seqs: dict[str, Any] = {}
    add = core.add
    core.add = lambda seq: (seqs.__setitem__(seq.id, seq), add(seq))[1]
    return seqs


async def tokens(handle: Any, seqs: dict[str, Any]) -> list[int]:
    async for ev in handle:
        assert ev.error is None, ev.error
    return list(seqs[handle.id].output_ids)


async def alone(ve: Any, turn: tuple[list[dict[str, Any]], list[Any]]) -> list[int]:
    from ortserve.vision.images import ImageLimits

    seqs = capture(ve.engine.core)
    return await tokens(await ve.submit(*turn, GREEDY, ImageLimits()), seqs)


@pytest.fixture(scope="module")
def vl(tiny_vl: tuple[Path, Path, Variant]) -> Variant:
    return tiny_vl[2]


def test_batched_image_rows_give_ogs_greedy_tokens(vl: Variant) -> None:
    """One image request, then a next turn whose prompt holds the first answer: its KV comes from
    the prefix cache (the answer's too) and its tokens are still og's."""
    from ortserve.vision.images import ImageLimits, decode
    from ortserve.vision.rows import BASE
    from ortserve.vision.runner import Sampling, VisionModel

    messages, images = image_turn("What is in the image?", png(seed=4))
    og = VisionModel(vl.model_dir)   # og's generator: the path before the batched rows
    named, n_in = og.inputs(load_codec(vl).render_chat(messages), [decode(images[0], ImageLimits())], ["image"])
    greedy = Sampling(max_tokens=GREEDY.max_tokens, temperature=0.0)
    want = [s.token for s in og.run(named, n_in, greedy) if s.token is not None]

    async def run() -> tuple[list[int], list[int], list[int], int]:
        ve = load(vl)
        seqs = capture(ve.engine.core)
        try:
            got = await alone(ve, (messages, images))
            ids = ve.prompt_ids(messages, images, ImageLimits())
            follow = ids + got + ve.codec.encode("<|im_end|>\n<|im_start|>user\nAnd then?<|im_end|>\n"
                                                 "<|im_start|>assistant\n", add_special_tokens=False)
            reused = ve.engine.core.reused_tokens
            nxt = await tokens(ve.engine.submit(prompt_ids=follow, params=GREEDY), seqs)
            assert ve.engine.core.reused_tokens - reused >= len(ids) + len(got) - 1   # the answer's KV too
            return got, follow, nxt, ve.engine.core.runner.steps
        finally:
            await ve.engine.stop()

    got, follow, nxt, steps = asyncio.run(run())
    assert len(want) == GREEDY.max_tokens and got == want
    assert steps >= 1   # it ran on the engine's runner, not og's generator
    named["input_ids"] = np.asarray([[og_id if og_id < BASE else og.notes["image_token_id"] for og_id in follow]],
                                    dtype=np.int32)
    assert nxt == [s.token for s in og.run(named, len(follow), greedy) if s.token is not None]


def test_repetition_penalty_on_image_rows_is_ogs(vl: Variant) -> None:
    """The engine's penalty reads an image's virtual ids as <|image_pad|>, as og's generator reads
    its prompt: greedy tokens with repetition_penalty 1.5 equal og's."""
    from ortserve.vision.images import ImageLimits, decode
    from ortserve.vision.runner import Sampling, VisionModel

    messages, images = image_turn("What is in the image? What is in the image?", png(seed=9))
    og = VisionModel(vl.model_dir)
    named, n_in = og.inputs(load_codec(vl).render_chat(messages), [decode(images[0], ImageLimits())], ["image"])
    want = [s.token for s in og.run(named, n_in, Sampling(max_tokens=10, temperature=0.0, repetition_penalty=1.5))
            if s.token is not None]
    plain = [s.token for s in og.run(named, n_in, Sampling(max_tokens=10, temperature=0.0)) if s.token is not None]

    async def run() -> list[int]:
        ve = load(vl)
        seqs = capture(ve.engine.core)
        try:
            params = SamplingParams(temperature=0.0, max_tokens=10, repetition_penalty=1.5)
            return await tokens(await ve.submit(messages, images, params, ImageLimits()), seqs)
        finally:
            await ve.engine.stop()

    assert want != plain   # the penalty changes the answer here, so the equality below says something
    assert asyncio.run(run()) == want


def test_an_image_split_across_prefill_chunks_gives_ogs_tokens(vl: Variant) -> None:
    """16-token prefill chunks cut the image's 20 tokens: each chunk's positions come from every id
    the row holds, and the tokens are og's."""
    from ortserve.vision.images import ImageLimits, decode
    from ortserve.vision.rows import BASE
    from ortserve.vision.runner import Sampling, VisionModel

    messages, images = image_turn("What is in the image?", png(140, 112, seed=10))
    og = VisionModel(vl.model_dir)
    named, n_in = og.inputs(load_codec(vl).render_chat(messages), [decode(images[0], ImageLimits())], ["image"])
    want = [s.token for s in og.run(named, n_in, Sampling(max_tokens=4, temperature=0.0)) if s.token is not None]

    async def run() -> tuple[list[int], list[int], int]:
        ve = load(vl, chunk=16)
        seqs = capture(ve.engine.core)
        try:
            got = await tokens(await ve.submit(messages, images, replace(GREEDY, max_tokens=4), ImageLimits()), seqs)
            return got, ve.prompt_ids(messages, images, ImageLimits()), ve.engine.core.runner.steps
        finally:
            await ve.engine.stop()

    got, ids, steps = asyncio.run(run())
    image = np.flatnonzero(np.asarray(ids) >= BASE)
    assert len(image) == 20 and image[0] // 16 != image[-1] // 16   # the image straddles a chunk boundary
    assert steps - 3 >= -(-len(ids) // 16)                          # prefill ran in 16-token chunks
    assert got == want


def load_codec(v: Variant) -> Any:
    from ortserve.engine.tokenizer import TextCodec

    return TextCodec(v.model_dir)


def test_image_and_text_rows_share_decode_steps(vl: Variant) -> None:
    from ortserve.vision.images import ImageLimits

    turns = [image_turn("What is in the image?", png(seed=5)), text_turn("Tell me about the sea."),
             image_turn("Describe it.", png(70, 42, seed=6)), text_turn("Count to five.")]

    async def run() -> tuple[list[list[int]], list[list[int]], int]:
        ve = load(vl)
        try:
            single = [await alone(ve, t) for t in turns]   # one at a time: each decode step runs one row
            runner = ve.engine.core.runner
            assert runner.widest == 1
            ve.engine.core.cache.clear()   # each row computes its prompt again, in the shared steps
            ids = [await asyncio.get_running_loop().run_in_executor(None, ve.prompt_ids, m, i, ImageLimits())
                   for m, i in turns]
            seqs = capture(ve.engine.core)
            with ve.engine.core._cond:     # the loop waits on this lock: all four are queued before its next step
                handles = [ve.engine.submit(prompt_ids=x, params=GREEDY) for x in ids]
            together = [await tokens(h, seqs) for h in handles]
            return single, together, ve.engine.core.runner.widest
        finally:
            await ve.engine.stop()

    single, together, widest = asyncio.run(run())
    assert widest == 4   # one decode step ran the two image rows and the two text rows
    assert together == single


def test_prefix_cache_keys_on_the_image_and_features_on_its_bytes(vl: Variant) -> None:
    from ortserve.vision.images import ImageLimits
    from ortserve.vision.rows import BASE

    same = image_turn("What is in the image?", png(seed=7))
    other = image_turn("What is in the image?", png(seed=8))   # the same text, another image

    async def run() -> None:
        ve = load(vl)
        core, enc = ve.engine.core, ve.encoder
        try:
            first = await alone(ve, same)
            runs, hits, reused = enc.runs, enc.hits, core.reused_tokens
            ids = ve.prompt_ids(*same, ImageLimits())
            assert enc.hits == hits + 1   # prompt_ids took the features from the cache
            hits += 1
            again = await alone(ve, same)
            assert again == first
            assert (enc.runs, enc.hits) == (runs, hits + 1)         # no encoder run
            assert core.reused_tokens - reused == len(ids) - 1      # the whole prompt's KV but the last token
            reused = core.reused_tokens
            await alone(ve, other)
            assert enc.runs == runs + 1                             # another image: encoded
            before_image = int(np.flatnonzero(np.asarray(ids) >= BASE)[0])
            assert core.reused_tokens - reused == before_image      # only the text before the image is shared
        finally:
            await ve.engine.stop()

    asyncio.run(run())
