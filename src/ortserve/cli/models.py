"""`ortserve models ...`: list, show, import, import-adapter, convert, verify, rm, pull.

Every command prints a one-line ``error: <message> (<hint>)`` and exits 2 (user
mistake) or 1 (anything else) on failure; ``--json`` gives machine-readable output.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from ortserve.cli.models_common import (  # re-exported: cli/bundle.py and tests import them from here
    DEVICES,
    PRECISIONS,
    QUALITY_WARN_PCT,
    Progress,
    _emit,
    _fmt_mb,
    _options,
    _quality,
    _report_install,
    _speed,
    _store,
    _table,
    handles_errors,
    json_option,
    quant_options_decorator,
    show_embedding,
    show_reranker,
)

__all__ = ["DEVICES", "PRECISIONS", "QUALITY_WARN_PCT", "Progress", "handles_errors", "json_option",
           "models_group", "quant_options_decorator"]


@click.group("models")
def models_group() -> None:
    """Manage the local model store (ORTSERVE_HOME/models)."""


@models_group.command("list")
@click.option("--available", is_flag=True, help="List the built-in catalog instead.")
@json_option
@handles_errors
def list_cmd(available: bool, as_json: bool) -> None:
    """Installed model variants (or, with --available, the catalog)."""
    store = _store()
    if available:
        from ortserve.models.catalog import CATALOG

        installed = {v.model for v in store.variants()}
        rows: list[dict[str, Any]] = [{"id": e.id, "description": e.description, "source": e.source, "size_mb": e.size_mb,
                 "ram_gb": e.ram_gb, "convert_ram_gb": e.convert_ram_gb, "installed": e.id in installed}
                for e in CATALOG.values()]
        if as_json:
            return _emit(rows)
        return _table([[r["id"], f"{r['size_mb']} MB", f"{r['ram_gb']:g} GB", "yes" if r["installed"] else "",
                         r["source"]] for r in rows], ["ID", "DOWNLOAD", "RAM", "INSTALLED", "SOURCE"])
    variants = store.variants()
    if as_json:
        return _emit([{**v.to_json(), **_stale(v)} for v in variants])
    if not variants:
        return click.echo("no models installed; try `ortserve models pull smollm2-135m`")
    _table([[v.id, v.kind, v.precision, v.device, _fmt_mb(v.size_bytes), _quality(v), _speed(v),
             ",".join(v.aliases)] for v in variants],
           ["ID", "KIND", "PRECISION", "DEVICE", "SIZE", "QUALITY (vs fp32)", "TOK/S | SENT/S", "ALIASES"])
    for v in variants:
        if _stale(v):
            click.echo(f"note: {_stale(v)['stale_graph']}")


def _stale(v: Any) -> dict[str, str]:
    """{"stale_graph": why and how to upgrade} for an exact GGUF import with an older graph."""
    from ortserve.models.catalog import DEFAULT_MODEL
    from ortserve.models.importer import source_gguf, stale_exact

    why = stale_exact(v)
    if why is None:
        return {}
    gguf = source_gguf(v)
    how = ("re-imported when the server next starts with it, or now: `ortserve models pull smollm2-135m`"
           if v.model == DEFAULT_MODEL and gguf else
           f"re-import it: `ortserve models import {gguf} --id {v.model}`" if gguf else
           f"its GGUF ({v.source}) is gone, so it stays as it is")
    return {"stale_graph": f"{why}; {how}"}


@models_group.command("show")
@click.argument("ref")
@click.option("--device", type=click.Choice(("auto", *DEVICES)), default=None,
              help="Explain the choice for this device only.")
@json_option
@handles_errors
def show_cmd(ref: str, device: str | None, as_json: bool) -> None:
    """A model's variants, their quality and speed, and which one each device would load."""
    from ortserve.cli.common import settings_from
    from ortserve.models.sampling import defaults_for
    from ortserve.models.select import resolve, variants_of

    store = _store()
    variants = [store.get(ref)] if ":" in ref else variants_of(store, ref)
    if not variants:
        store.get(ref)  # raises the not-installed error with its hint
    if variants[0].kind in ("embedding", "reranker"):
        return (show_embedding if variants[0].kind == "embedding" else show_reranker)(variants, as_json)
    if variants[0].kind == "adapter":  # LoRA (docs/lora.md)
        v = variants[0]
        if as_json:
            return _emit({"variants": [v.to_json()]})
        click.echo(f"{v.model} (LoRA adapter of {v.base}): rank {v.notes.get('rank')}, scale {v.notes.get('scale')}, "
                   f"targets {', '.join(v.notes.get('target_modules', []))}")
        click.echo(f"  source        {v.source}\n  use it as     model \"{v.base.partition(':')[0]}:{v.model}\"")
        return None
    devices = [device] if device else sorted({"cpu", *(v.device for v in variants)})
    model = variants[0].model
    choices = {d: resolve(store, model, d) for d in devices}
    settings = settings_from()
    sampling = {v.id: defaults_for(settings, v.model_dir) for v in variants}
    tools = {v.id: _tools_of(v) for v in variants}
    if as_json:
        return _emit({"variants": [{**v.to_json(), **_stale(v), "tool_calls": tools[v.id], "sampling_defaults": {
                          "values": dict(sampling[v.id].values), "sources": dict(sampling[v.id].sources),
                          "model_source": sampling[v.id].model_source}} for v in variants],
                      "selection": {d: {"id": r.model_id, "path": str(r.path), "reason": r.reason}
                                    for d, r in choices.items()}})
    for v in variants:
        click.echo(f"{v.id}")
        click.echo(f"  path          {v.model_dir}" + ("  (linked)" if v.link else ""))
        click.echo(f"  source        {v.source}")
        click.echo(f"  architecture  {v.architecture}  context {v.context_length}")
        click.echo(f"  precision     {v.precision} for {v.device}" +
                   (f"  options {v.notes['builder_options']}" if v.notes.get("builder_options") else ""))
        click.echo(f"  size          {_fmt_mb(v.size_bytes)} in {len(v.files)} files")
        if v.notes.get("gguf_exact"):   # which kernels run the file's blocks (docs/gguf.md)
            click.echo(f"  kernels       {_kernels(v.notes['gguf_exact'])}")
        click.echo(f"  perplexity    {_quality(v)}" + (f"  reference {v.quality['reference_perplexity']:.2f}"
                                                       if v.quality.get("reference_perplexity") else ""))
        click.echo(f"  decode        {_speed(v)} tok/s (single stream, CPU)")
        d = sampling[v.id]
        click.echo("  sampling      " + ", ".join(f"{n}={x:g} ({d.sources[n]})" for n, x in d.values.items())
                   + (f"  model's from {d.model_source}" if d.model_source else ""))
        if tools[v.id]:
            click.echo(f"  tool calls    {_said(tools[v.id])}")
        if v.aliases:
            click.echo(f"  aliases       {', '.join(v.aliases)}")
        if _stale(v):
            click.echo(f"  graph         {_stale(v)['stale_graph']}")
    for d, r in choices.items():
        click.echo(f"on {d}: {r.model_id} - {r.reason}")


@models_group.command("import")
@click.argument("path", type=click.Path(path_type=str))
@click.option("--id", "model_id", default=None, help="Model id (default: from the file/dir name).")
@click.option("--link", is_flag=True, help="ONNX dirs: reference the files in place instead of copying.")
@click.option("--requantize", type=click.Choice(["fp32", "int8", "int4"]), default=None,
              help="GGUF: dequantize and rebuild at this precision instead of keeping the file's blocks.")
@click.option("--tool-format", default=None, metavar="NAME",
              help="The tool-call syntax to use instead of the detected one: hermes, llama3_json, mistral, "
                   "phi4 or gemma (docs/tools.md).")
@click.option("--speed", is_flag=True, help="GGUF: also measure decode speed, loading the whole model as "
              "serving does (~1.7x a Q4_K_M file's memory; the import alone stays near the file's size).")
@click.option("--mmproj", default=None, type=click.Path(path_type=str), metavar="MMPROJ.gguf",
              help="The vision projector (llama.cpp's mmproj GGUF) of a Qwen2.5-VL text GGUF: the pair "
                   "becomes a vision model (docs/vision.md).")
@quant_options_decorator
@json_option
@handles_errors
def import_cmd(path: str, model_id: str | None, link: bool, requantize: str | None, precision: str | None,
               device: str, block_size: str | None, algo: str | None, last_matmul: str | None,
               accuracy_level: int | None, tool_format: str | None, speed: bool, mmproj: str | None,
               as_json: bool) -> None:
    """Import a .gguf file, a Hugging Face model dir, or an ONNX GenAI dir.

    A GGUF keeps its quantized blocks (exact import) unless --requantize/--precision is given;
    a Hugging Face dir is built at --precision (default int8 on cpu). A vision model's GGUF
    comes with its projector: PATH --mmproj MMPROJ.gguf.
    """
    from pathlib import Path

    from ortserve.models.importer import import_path

    if requantize and precision and requantize != precision:
        raise click.UsageError("--requantize and --precision disagree; give one")
    if mmproj and (link or requantize or precision or speed or tool_format):
        raise click.UsageError("--mmproj imports the pair as it is (fp32 vision graphs on cpu): "
                               "drop --link, --requantize, --precision, --speed and --tool-format")
    if tool_format is not None:
        _format_name(tool_format)  # a bad name fails before the import, not after
        if link:
            raise click.UsageError("--tool-format needs the files in the store; drop --link")
    opts = _options(block_size, algo, last_matmul, accuracy_level)
    with Progress(f"importing {Path(path).name}") as progress:
        v = import_path(_store(), Path(path), model_id=model_id, precision=requantize or precision,
                        device=device, options=opts, link=link, progress=progress, speed=speed,
                        mmproj=Path(mmproj) if mmproj else None)
    if tool_format is not None:
        v = _set_tool_format(v, tool_format)
    _report_install(v, as_json)


@models_group.command("tool-format")
@click.argument("ref")
@click.argument("name", required=False)
@json_option
@handles_errors
def tool_format_cmd(ref: str, name: str | None, as_json: bool) -> None:
    """Show the tool-call syntax a model speaks and where the choice comes from, or set it:
    NAME is hermes, llama3_json, mistral, phi4 or gemma; "auto" goes back to detecting it
    (template, then vocabulary, then Hermes; docs/tools.md)."""
    store = _store()
    variants = [store.get(ref)] if ":" in ref else store.find(ref)
    if not variants:
        store.get(ref)  # raises the not-installed error with its hint
    for v in variants:
        if v.kind != "chat":
            raise click.UsageError(f"{v.id} is not a chat model ({v.kind}): only chat models call tools")
    if name is not None:
        variants = [_set_tool_format(v, name) for v in variants]
    out = {v.id: _tools_of(v) or {"tool_format": None, "source": "an unreadable tokenizer"} for v in variants}
    if as_json:
        return _emit(out)
    for vid, d in out.items():
        click.echo(f"{vid}: {_said(d)}")
    return None


def _tools_of(v: Any) -> dict[str, str]:
    """The tool-call syntax a chat variant speaks and where that comes from ({} when unreadable)."""
    from ortserve.engine.tokenizer import TextCodec
    from ortserve.errors import OrtServeError

    try:
        codec = TextCodec(v.model_dir)
    except (OrtServeError, OSError, ValueError):
        return {}
    return {"tool_format": codec.tool_format.name, "source": codec.tool_format_source}


def _said(d: dict[str, Any]) -> str:
    why = {"manifest": "set by hand; auto goes back to detecting it",
           "fallback": "the fallback: nothing in its template or vocabulary names a syntax"}
    return f"{d['tool_format']} ({why.get(d['source'], 'from its ' + str(d['source']))})"


def _format_name(name: str) -> str:
    """``name`` checked: a format's name, or "" for "auto"."""
    from ortserve.engine.formats import FORMATS

    if name == "auto":
        return ""
    if name not in FORMATS:
        raise click.BadParameter(f"must be one of {', '.join(FORMATS)} or auto, got {name!r}",
                                 param_hint="tool format")
    return name


def _set_tool_format(v: Any, name: str) -> Any:
    if v.kind != "chat":
        raise click.UsageError(f"{v.id} is not a chat model ({v.kind}): only chat models call tools")
    if v.link:
        raise click.UsageError(f"{v.id} was imported with --link: its manifest is not beside its files; "
                               "import it without --link to choose its tool format")
    return _store().update_manifest(v, tool_format=_format_name(name))


@models_group.command("import-adapter")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option("--base", required=True, help="The installed model the adapter was trained on (id or alias).")
@click.option("--id", "adapter_id", default=None, help="Adapter id (default: the directory's name).")
@click.option("--scale", type=float, default=1.0, show_default=True,
              help="Multiplies the adapter's own lora_alpha/r (as llama-server's --lora-scaled).")
@json_option
@handles_errors
def import_adapter_cmd(path: Path, base: str, adapter_id: str | None, scale: float, as_json: bool) -> None:
    """Import a PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors)
    or a llama.cpp LoRA GGUF (convert_lora_to_gguf.py output, f32/f16).

    It is checked against --base (layers, shapes, rank, target modules) and served per request
    as model "BASE:ID" or "ID" (docs/lora.md).
    """
    from ortserve.models.adapters import import_adapter

    v = import_adapter(_store(), path, base, name=adapter_id, scale=scale)
    if as_json:
        _emit(v.to_json())
        return
    n = v.notes
    click.echo(f"imported adapter {v.model} for {v.base}: rank {n['rank']}, scale {n['scale']}, "
               f"targets {', '.join(n['target_modules'])}")
    click.echo(f"use it as model \"{v.base.partition(':')[0]}:{v.model}\" or \"{v.model}\"")


@models_group.command("convert")
@click.argument("ref")
@quant_options_decorator
@json_option
@handles_errors
def convert_cmd(ref: str, precision: str | None, device: str, block_size: str | None, algo: str | None,
                last_matmul: str | None, accuracy_level: int | None, as_json: bool) -> None:
    """Build another precision/device of an installed model from its recorded source."""
    from ortserve.models.importer import convert_model

    if precision is None:
        raise click.UsageError("convert needs --precision (fp32, fp16, int8 or int4)")
    opts = _options(block_size, algo, last_matmul, accuracy_level)
    model = ref.partition(":")[0]
    with Progress(f"converting {model} to {precision}/{device}") as progress:
        v = convert_model(_store(), model, precision=precision, device=device, options=opts, progress=progress)
    _report_install(v, as_json)


@models_group.command("verify")
@click.argument("ref")
@json_option
@handles_errors
def verify_cmd(ref: str, as_json: bool) -> None:
    """Re-hash every file of a model's variants; exit 1 if any is corrupt or missing."""
    from ortserve.models.select import variants_of

    store = _store()
    variants = [store.get(ref)] if ":" in ref else variants_of(store, ref)
    if not variants:
        store.get(ref)
    results = {v.id: store.verify(v) for v in variants}
    bad = any(r["corrupt"] or r["missing"] for r in results.values())
    if as_json:
        _emit({vid: {**r, "ok": not (r["corrupt"] or r["missing"])} for vid, r in results.items()})
    else:
        for vid, r in results.items():
            if r["corrupt"] or r["missing"]:
                click.echo(f"{vid}: FAILED corrupt={r['corrupt']} missing={r['missing']}")
            else:
                click.echo(f"{vid}: ok ({len(store.get(vid).files)} files)"
                           + (f", {len(r['extra'])} untracked" if r["extra"] else ""))
    if bad:
        click.echo(f"error: {ref} has corrupt or missing files (re-import it: `ortserve models rm {ref}` "
                   "then import or pull again)", err=True)
        sys.exit(1)


@models_group.command("rm")
@click.argument("ref")
@json_option
@handles_errors
def rm_cmd(ref: str, as_json: bool) -> None:
    """Remove a model (all variants) or one variant (model:variant)."""
    removed = _store().remove(ref)
    if as_json:
        return _emit([v.id for v in removed])
    for v in removed:
        click.echo(f"removed {v.id}" + (f" (the linked files in {v.link} were kept)" if v.link else ""))


@models_group.command("pull")
@click.argument("ref")
@click.option("--device", type=click.Choice(DEVICES), default="cpu", show_default=True)
@json_option
@handles_errors
def pull_cmd(ref: str, device: str, as_json: bool) -> None:
    """Install a catalog model (`ortserve models list --available`)."""
    from ortserve.models.importer import pull

    with Progress(f"pulling {ref}") as progress:
        v = pull(_store(), ref, device=device, progress=progress)
    _report_install(v, as_json)


@models_group.command("import-bundle")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@json_option
@handles_errors
def import_bundle_cmd(directory: Path, as_json: bool) -> None:
    """Install the models of an `ortserve bundle` (checks SHA256SUMS and manifests first)."""
    from ortserve.bundle import import_bundle

    with Progress("import-bundle") as progress:
        installed = import_bundle(directory, _store(), say=progress)
    if as_json:
        return _emit([v.to_json() for v in installed])
    click.echo(f"bundle {directory}: every file matches SHA256SUMS and its manifest")
    for v in installed:
        click.echo(f"installed {v.id} ({v.precision}, {v.device}, {_fmt_mb(v.size_bytes)})")
    if not installed:
        click.echo("the bundle holds no models")


if __name__ == "__main__":
    models_group(prog_name="ortserve models")


def _kernels(exact: dict[str, Any]) -> str:
    kernels = exact.get("kernels", "matmulnbits")
    why = exact.get("native_refused") or exact.get("native_off")
    return kernels + (f" ({exact['native_isa']})" if exact.get("native_isa") else "") + (f"; native: {why}" if why else "")
