"""`ortserve rag ingest|ls|rm|search`: local vector stores, the same ones the server serves."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from ortserve.cli.common import echo_json, guarded, settings_from
from ortserve.rag.ingest import SUPPORTED, extension


def open_rag(settings: Any) -> Any:
    """The RAG store under settings.rag_path, embedding with the configured embedding model."""
    from ortserve.models.store import ModelStore
    from ortserve.rag.index import RagStore
    from ortserve.server.embed_holder import EmbeddingHolder

    holder = EmbeddingHolder(ModelStore(settings.store_dir), settings.embedding_model)
    state: dict[str, Any] = {}

    def embedder() -> Any:
        if "e" not in state:
            if not holder.installed():
                click.echo("importing the default embedding model (first use, about a minute)...", err=True)
            state["v"], state["e"] = holder.get()
        return state["e"]

    rag = RagStore(settings.rag_path, embedder)
    rag.embed_model_id = lambda: (embedder(), state["v"].id)[1]  # type: ignore[attr-defined]
    return rag


def store_id(rag: Any, name: str, *, create: bool = False) -> str:
    from ortserve.errors import NotFound

    vid = rag.find_store(name)
    if vid is None:
        if not create:
            raise NotFound(f"no vector store named {name!r}", param="store",
                           hint="see `ortserve rag ls`; `ortserve rag ingest PATH --store NAME` creates one")
        vid = rag.create_store(name, None, rag.embed_model_id())["id"]
    return str(vid)


def collect(paths: tuple[str, ...]) -> tuple[list[Path], list[str]]:
    """Files to ingest (directories walked, hidden entries skipped) and the refused ones."""
    files, refused = [], []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(f for f in p.rglob("*") if f.is_file() and extension(f.name) in SUPPORTED
                            and not any(part.startswith(".") for part in f.relative_to(p).parts))
        elif p.is_file() and extension(p.name) in SUPPORTED:
            files.append(p)
        elif p.is_file():
            refused.append(str(p))
        else:
            refused.append(f"{p} (not found)")
    return files, [str(r) for r in refused]


def display_name(path: Path) -> str:
    """The name chunks are cited by: relative to the working directory when inside it."""
    full = path.resolve()
    try:
        return full.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return full.as_posix()


@click.group("rag")
def rag_group() -> None:
    """Local document stores for retrieval (HOME/rag; the server's /v1/vector_stores)."""


@rag_group.command("ingest")
@click.argument("paths", nargs=-1, required=True)
@click.option("--store", "store", required=True, help="Vector store name (created if missing) or id")
@click.option("--chunk-tokens", type=int, default=200, show_default=True)
@click.option("--overlap", type=int, default=40, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@guarded
def ingest(paths: tuple[str, ...], store: str, chunk_tokens: int, overlap: int, as_json: bool) -> None:
    """Add files and directories (.txt .md .html .pdf ...) to a store; unchanged files are skipped."""
    from tqdm import tqdm

    from ortserve.errors import OrtServeError

    rag = open_rag(settings_from())
    vid = store_id(rag, store, create=True)
    files, refused = collect(paths)
    report: dict[str, list[str]] = {"added": [], "replaced": [], "unchanged": [], "failed": []}
    report["failed"] += [f"{r}: unsupported file type" for r in refused]
    bar = tqdm(total=sum(f.stat().st_size for f in files), unit="B", unit_scale=True, disable=as_json,
               desc=f"ingesting into {store}", file=sys.stderr)
    chunks = 0

    def step(n: int) -> None:
        nonlocal chunks
        chunks += n
        bar.set_postfix(chunks=chunks)

    for f in files:
        name = display_name(f)
        try:
            report[rag.ingest_path(vid, f, name, max_tokens=chunk_tokens, overlap=overlap, progress=step)].append(name)
        except OrtServeError as exc:
            report["failed"].append(f"{name}: {exc.message}")
        bar.update(f.stat().st_size)
    bar.close()
    info = rag.vector_store(vid)
    if as_json:
        echo_json({"vector_store": info, **report})
    else:
        click.echo(f"{store} ({vid}): {len(report['added'])} added, {len(report['replaced'])} replaced, "
                   f"{len(report['unchanged'])} unchanged, {len(report['failed'])} failed; "
                   f"{info['file_counts']['completed']} files in the store")
        for line in report["failed"]:
            click.echo(f"  failed: {line}", err=True)
    if report["failed"]:
        sys.exit(1)


@rag_group.command("ls")
@click.argument("store", required=False)
@click.option("--json", "as_json", is_flag=True)
@guarded
def ls(store: str | None, as_json: bool) -> None:
    """Vector stores, or the files of one store."""
    rag = open_rag(settings_from())
    if store is None:
        rows = rag.vector_stores()
        if as_json:
            return echo_json(rows)
        for v in rows:
            click.echo(f"{v['name'] or '-':<20} {v['id']}  {v['file_counts']['completed']} files  "
                       f"{v['usage_bytes'] / 1e6:.1f} MB  {v['embedding_model']}")
        return None
    files = rag.vs_files(store_id(rag, store))
    if as_json:
        return echo_json(files)
    for f in files:
        click.echo(f"{f['filename']}  {f['chunks']} chunks  {f['status']}  {f['id']}")
    return None


@rag_group.command("rm")
@click.argument("store")
@click.option("--file", "file", default=None, help="Remove only this file (its name as `rag ls STORE` shows)")
@guarded
def rm(store: str, file: str | None) -> None:
    """Delete a store, or one file from it."""
    from ortserve.errors import NotFound

    rag = open_rag(settings_from())
    vid = store_id(rag, store)
    if file is None:
        rag.delete_store(vid)
        click.echo(f"deleted {store} ({vid})")
        return
    hit = [f for f in rag.vs_files(vid) if f["filename"] in (file, display_name(Path(file))) or f["id"] == file]
    if not hit:
        raise NotFound(f"no file {file!r} in {store}", param="file", hint=f"see `ortserve rag ls {store}`")
    rag.remove_file(vid, hit[0]["id"])
    click.echo(f"removed {hit[0]['filename']} from {store}")


@rag_group.command("search")
@click.argument("query")
@click.option("--store", "store", required=True)
@click.option("-k", "k", type=int, default=5, show_default=True)
@click.option("--mode", type=click.Choice(["hybrid", "dense", "bm25"]), default="hybrid", show_default=True)
@click.option("--json", "as_json", is_flag=True)
@guarded
def search(query: str, store: str, k: int, mode: str, as_json: bool) -> None:
    """The best chunks for QUERY, with file, chunk and score."""
    rag = open_rag(settings_from())
    hits = rag.search(store_id(rag, store), query, k=k, mode=mode)
    if as_json:
        return echo_json(hits)
    for i, h in enumerate(hits, 1):
        text = " ".join(h["content"][0]["text"].split())
        click.echo(f"[{i}] {h['filename']} chunk {h['chunk_index']}  score {h['score']:.3f}\n    {text[:200]}")
    return None
