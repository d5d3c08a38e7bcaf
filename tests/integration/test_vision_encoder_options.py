"""The vision encoder's onnxruntime session takes the server's threads and spinning (issue 42's
benchmark against llama-server, docs/vision.md "Against llama-server"): it used onnxruntime's
defaults, every core and spinning threads, whatever ``--intra-op-threads`` said."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

pytest.importorskip("mobius")


@pytest.mark.parametrize("threads, spinning", [(1, False), (2, True)])
def test_the_encoder_session_takes_the_servers_threads_and_spinning(tiny_vl, threads, spinning):
    from ortserve.server.vision_engine import VisionEngine

    v = tiny_vl[2]
    settings = SimpleNamespace(max_batch=2, kv_cache_mb=16, prefix_cache=False, huge_pages=False,
                               intra_op_threads=threads, thread_spinning=spinning)
    ve = VisionEngine(v.model, v.model_dir, settings, ThreadPoolExecutor(1))
    so = ve.encoder.session.get_session_options()
    assert so.intra_op_num_threads == threads
    assert so.get_session_config_entry("session.intra_op.allow_spinning") == ("1" if spinning else "0")
