"""`ortserve info` and `ortserve config`: the machine, the runtime, every setting."""

from __future__ import annotations

import importlib.metadata
import os
import platform
from pathlib import Path
from typing import Any

import click

from ortserve import native
from ortserve.cli.common import echo_json, guarded, settings_from
from ortserve.config import config_file, describe


def cpu_facts() -> dict[str, Any]:
    model, flags = platform.processor() or platform.machine(), set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace", encoding="utf-8").splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name":
                model = value.strip()
            elif key in ("flags", "Features"):
                flags.update(value.split())
    simd = [f for f in ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "amx_tile",
                        "neon", "asimd", "sve") if f in flags]
    physical = None
    try:
        import psutil

        physical = psutil.cpu_count(logical=False)
    except ImportError:  # pragma: no cover
        pass
    return {"model": model, "logical_cores": os.cpu_count(), "physical_cores": physical, "simd": simd,
            "arch": platform.machine()}


def machine_info(settings: Any) -> dict[str, Any]:
    import psutil

    from ortserve.engine.packages import check_install
    from ortserve.engine.runtime import available_devices, candidates, gpu_facts
    from ortserve.models.store import ModelStore

    def version(dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    import onnxruntime as ort

    devices = available_devices()
    store = ModelStore(settings.store_dir)
    try:
        choice = candidates(settings.device)[0]
        device = {"device": choice.device, "provider": choice.provider, "reason": choice.reason}
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        device = {"error": str(exc)}
    return {
        "os": f"{platform.system()} {platform.release()}", "python": platform.python_version(),
        "cpu": cpu_facts(), "ram_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "gpus": [d for d in ("cuda", "dml", "webgpu") if devices.get(d)], "gpu_memory": gpu_facts(),
        "install": check_install().to_dict(),
        "onnxruntime": ort.__version__, "onnxruntime_genai": _genai_version(version),
        "providers": ort.get_available_providers(), "devices": devices, "selected_device": device,
        "store": {"path": str(store.root), "size_mb": round(store.size() / 2**20, 1),
                  "variants": [v.id for v in store.variants()]},
        "auto_variant": _auto_variant(store, settings),
        "native": native.status(settings.native, settings.native_isa).to_dict(),
    }


def _genai_version(version: Any) -> str | None:
    from ortserve.engine.packages import GENAI

    return next((f"{v} ({d})" for d in GENAI if (v := version(d))), None)


def _auto_variant(store: Any, settings: Any) -> dict[str, Any]:
    from ortserve.models import select
    from ortserve.models.catalog import DEFAULT_MODEL

    ref = settings.model or DEFAULT_MODEL
    try:
        res = select.resolve(store, ref, settings.device)
        return {"model": ref, "variant": res.model_id, "why": res.reason}
    except Exception as exc:  # noqa: BLE001 - not installed yet is a normal answer here
        return {"model": ref, "variant": None, "why": str(getattr(exc, "message", exc))}


@click.command()
@click.option("--json", "as_json", is_flag=True)
@click.option("--device", default=None)
@guarded
def info(as_json: bool, device: str | None) -> None:
    """The machine, the runtime and the model `auto` would pick."""
    settings = settings_from(device=device)
    data = machine_info(settings)
    if as_json:
        echo_json(data)
        return
    cpu = data["cpu"]
    lines = [
        f"OS            {data['os']} (Python {data['python']})",
        f"CPU           {cpu['model']} — {cpu['physical_cores']} cores / {cpu['logical_cores']} threads",
        f"SIMD          {', '.join(cpu['simd']) or 'none detected'}",
        f"RAM           {data['ram_gb']} GB",
        f"GPUs          {', '.join(data['gpus']) or 'none usable'}",
        *(f"GPU {g['index']}         {g['name']}: {g['memory_free_mb']} of {g['memory_total_mb']} MiB free"
          for g in data["gpu_memory"]),
        f"onnxruntime   {data['onnxruntime']}   onnxruntime-genai {data['onnxruntime_genai']}",
        f"Providers     {', '.join(data['providers'])}",
        (f"GGUF kernels  {'ortserve.gguf ops' if data['native']['active'] else 'MatMulNBits'} "
         f"({data['native']['reason']})"),
        (f"Device        {data['selected_device'].get('device', '?')} "
         f"({data['selected_device'].get('reason', data['selected_device'].get('error'))})"),
        (f"Model store   {data['store']['path']} ({data['store']['size_mb']} MB, "
         f"{len(data['store']['variants'])} variants)"),
        f"Auto picks    {data['auto_variant']['variant'] or '-'} ({data['auto_variant']['why']})",
    ]
    install = data["install"]
    if install["ok"]:
        lines.append(f"Install       ok: {' + '.join(install['runtimes'] + install['genai'])}")
    else:
        lines += [f"Install       BROKEN: {p}" for p in install["problems"]]
        lines.append(f"Fix           {install['fix']}")
    click.echo("\n".join(lines))


@click.command("config")
@click.option("--json", "as_json", is_flag=True)
@guarded
def config_command(as_json: bool) -> None:
    """Every setting: its env vars, default and current value (flags > env > .env > file > default)."""
    settings = settings_from()
    rows = describe(settings)
    if as_json:
        echo_json({"config_file": str(config_file() or ""), "settings": rows})
        return
    click.echo(f"config file: {config_file() or '(none: ortserve.toml / ortserve.json / ORTSERVE_CONFIG)'}")
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        click.echo(f"{r['name']:<{width}}  = {r['value']!s:<22} [{' | '.join(r['env'])}] default {r['default']!s}"
                   f"\n{'':<{width}}    {r['doc']}")
