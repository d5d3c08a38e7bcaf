"""`ortserve bundle`: everything an air-gapped machine needs, in one directory.

    DIR/wheels/      ortserve and every wheel it needs for the target platform, Python and device
    DIR/models/      installed model variants, each with its manifest (ortserve.json, per-file SHA-256)
    DIR/SHA256SUMS   every file above, `sha256sum -c` format
    DIR/INSTALL.md   the two commands to run on the target

On the target: `pip install --no-index --find-links DIR/wheels 'ortserve[cpu]'`, then
`ortserve models import-bundle DIR` (checks SHA256SUMS and every manifest before installing).

The wheels are resolved with pip (`pip install --dry-run --report` for the target's tags,
then `pip download --no-deps --only-binary=:all:` of the exact pins). pip evaluates environment
markers for the machine it runs on, not for --platform (a Windows-only dependency such as
colorama would be missed from Linux), so the resolved set is closed again with the target's
markers until nothing is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from ortserve import __version__
from ortserve.errors import InvalidRequest, StoreError
from ortserve.models.store import MANIFEST, ModelStore, Variant, dir_name, hash_tree, sha256_file

PLATFORMS: dict[str, dict[str, Any]] = {
    # pip expands macosx_* and manylinux2014 to their older compatible tags, not manylinux_2_*
    "win_amd64": {"tags": ["win_amd64"], "markers": {
        "sys_platform": "win32", "platform_system": "Windows", "os_name": "nt", "platform_machine": "AMD64"}},
    "manylinux": {"tags": [*(f"manylinux_2_{n}_x86_64" for n in range(28, 16, -1)), "manylinux2014_x86_64"],
                  "markers": {
        "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix", "platform_machine": "x86_64"}},
    "macos": {"tags": ["macosx_14_0_arm64"], "markers": {
        "sys_platform": "darwin", "platform_system": "Darwin", "os_name": "posix", "platform_machine": "arm64"}},
}
PYTHONS = ("3.11", "3.12", "3.13")
DEVICE_EXTRAS = {"cpu": "cpu", "cuda": "cuda", "dml": "directml"}
DEVICE_PLATFORMS = {"cpu": set(PLATFORMS), "cuda": {"win_amd64", "manylinux"}, "dml": {"win_amd64"}}
SUMS = "SHA256SUMS"


@dataclass
class Target:
    platform: str
    python: str
    device: str
    extras: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.platform not in PLATFORMS:
            raise InvalidRequest(f"unknown platform {self.platform!r}; choose {', '.join(PLATFORMS)}",
                                 param="platform")
        if self.python not in PYTHONS:
            raise InvalidRequest(f"unsupported Python {self.python!r}; choose {', '.join(PYTHONS)}",
                                 param="python")
        if self.device not in DEVICE_EXTRAS:
            raise InvalidRequest(f"unknown device {self.device!r}; choose {', '.join(DEVICE_EXTRAS)}",
                                 param="device")
        if self.platform not in DEVICE_PLATFORMS[self.device]:
            raise InvalidRequest(f"{self.device} has no build for {self.platform}", param="device")

    @property
    def all_extras(self) -> list[str]:
        return [DEVICE_EXTRAS[self.device], *self.extras]

    @property
    def requirement(self) -> str:
        return f"ortserve[{','.join(self.all_extras)}]"

    def marker_env(self) -> dict[str, str]:
        return {"implementation_name": "cpython", "platform_python_implementation": "CPython",
                "python_version": self.python, "python_full_version": f"{self.python}.0",
                "platform_release": "", "platform_version": "", "implementation_version": f"{self.python}.0",
                **PLATFORMS[self.platform]["markers"]}

    def pip_target_args(self) -> list[str]:
        abi = "cp" + self.python.replace(".", "")
        args = ["--only-binary=:all:", "--python-version", self.python, "--implementation", "cp", "--abi", abi]
        for tag in PLATFORMS[self.platform]["tags"]:
            args += ["--platform", tag]
        return args


def host_platform() -> str:
    if sys.platform == "win32":
        return "win_amd64"
    return "macos" if sys.platform == "darwin" else "manylinux"


def _pip(args: list[str], what: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pip", *args]
    proc = subprocess.run(cmd, capture_output=True, encoding="utf-8", errors="replace", check=False,
                          env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip() and "is ignored" not in ln]
        raise StoreError(f"{what} failed: " + " | ".join(lines[-4:]),
                         hint="the build machine needs its package index (PyPI or a mirror) for `ortserve bundle`")
    return proc


def build_ortserve_wheel(out: Path, source: Path | None = None) -> Path:
    """ortserve's own wheel, built from its source tree (pip wheel --no-deps)."""
    src = source or Path(__file__).resolve().parents[2]
    if not (src / "pyproject.toml").is_file():
        raise StoreError("`ortserve bundle` builds ortserve's wheel from its source tree, and none was found "
                         f"at {src}", hint="run it from a source checkout, or pass --ortserve-wheel FILE")
    out.mkdir(parents=True, exist_ok=True)
    for args in (["--no-build-isolation"], []):  # offline first; build isolation fetches setuptools
        try:
            _pip(["wheel", "--no-deps", "--quiet", *args, "-w", str(out), str(src)], "building ortserve's wheel")
            break
        except StoreError:
            if args == []:
                raise
    wheels = sorted(out.glob(f"ortserve-{__version__}-*.whl"))
    if not wheels:
        raise StoreError(f"building ortserve's wheel left no ortserve-{__version__}-*.whl in {out}")
    return wheels[-1]


def resolve(target: Target, ortserve_wheel: Path, max_rounds: int = 6) -> list[dict[str, Any]]:
    """The wheels (name, version, url, filename) ortserve needs on ``target``; no download."""
    extra_reqs: list[str] = []
    for _ in range(max_rounds):
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "report.json"
            _pip(["install", "--dry-run", "--ignore-installed", "--quiet", "--target", str(Path(tmp) / "t"),
                  *target.pip_target_args(), "--report", str(report),
                  f"{ortserve_wheel}[{','.join(target.all_extras)}]", *extra_reqs],
                 f"resolving wheels for {target.platform}/Python {target.python}/{target.device}")
            items = json.loads(report.read_text(encoding="utf-8"))["install"]
        missing = _missing_for_target(items, target)
        if not missing:
            needed = _reachable(items, target)  # drops what only the build machine's markers wanted
            return [{"name": it["metadata"]["name"], "version": it["metadata"]["version"],
                     "url": it["download_info"]["url"],
                     "filename": it["download_info"]["url"].rsplit("/", 1)[-1]}
                    for it in items if canonicalize_name(it["metadata"]["name"]) in needed]
        extra_reqs += missing
    raise StoreError(f"could not close the dependency set for {target.platform}: still missing {missing}")


def _wanted(req: Requirement, env: dict[str, str], extras: set[str]) -> bool:
    return req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in (extras or {""}))


def _reachable(items: list[dict[str, Any]], target: Target) -> set[str]:
    """Names reachable from ortserve[extras] through requirements that hold on the target."""
    by_name = {canonicalize_name(it["metadata"]["name"]): it for it in items}
    env = target.marker_env()
    seen: set[str] = set()
    todo: list[tuple[str, set[str]]] = [("ortserve", set(target.all_extras))]
    while todo:
        name, extras = todo.pop()
        if name in seen and not extras:
            continue
        seen.add(name)
        for raw in by_name.get(name, {}).get("metadata", {}).get("requires_dist") or []:
            req = Requirement(raw)
            dep = canonicalize_name(req.name)
            if dep in by_name and _wanted(req, env, extras) and (dep not in seen or req.extras):
                todo.append((dep, set(req.extras)))
    return seen


def _missing_for_target(items: list[dict[str, Any]], target: Target) -> list[str]:
    """Requirements the target needs (its own markers) that the resolved set lacks."""
    have = {canonicalize_name(it["metadata"]["name"]) for it in items}
    env = target.marker_env()
    missing: list[str] = []
    for it in items:
        name = canonicalize_name(it["metadata"]["name"])
        extras = set(target.all_extras) if name == "ortserve" else set(it.get("requested_extras") or [])
        for raw in it["metadata"].get("requires_dist") or []:
            req = Requirement(raw)
            if canonicalize_name(req.name) in have:
                continue
            if _wanted(req, env, extras):
                missing.append(str(Requirement(f"{req.name}{req.specifier}")))
    return sorted(set(missing))


def download(wheels: list[dict[str, Any]], target: Target, out: Path, ortserve_wheel: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy2(ortserve_wheel, out / ortserve_wheel.name)
    pins = [f"{w['name']}=={w['version']}" for w in wheels if canonicalize_name(w["name"]) != "ortserve"]
    _pip(["download", "--no-deps", "--quiet", *target.pip_target_args(), "-d", str(out), *pins],
         f"downloading {len(pins)} wheels")


def pick_variants(store: ModelStore, refs: list[str], device: str) -> list[Variant]:
    """``model`` (the variant `ortserve serve` would pick for the device) or ``model:variant``."""
    from ortserve.models.select import choose, variants_of

    out = []
    for ref in refs:
        if ":" in ref:
            out.append(store.get(ref))
            continue
        candidates = variants_of(store, ref)
        if not candidates:
            raise StoreError(f"model {ref!r} is not installed here, so it cannot be bundled",
                             hint=f"ortserve models pull {ref} --device {device}  (or import it) first")
        v, _ = choose(candidates, device)
        if v.device != device:
            raise StoreError(f"{ref} has no {device} variant installed (only {v.device})",
                             hint=f"ortserve models convert {ref} --device {device}")
        out.append(v)
    return out


def copy_variant(v: Variant, models_dir: Path) -> Path:
    problems = ModelStore(v.path.parent).verify(v)
    if problems["corrupt"] or problems["missing"]:
        raise StoreError(f"{v.id} is damaged in the store ({problems}); not bundling it",
                         hint=f"ortserve models verify {v.model}")
    dest = models_dir / dir_name(v.model, v.variant)
    shutil.copytree(v.model_dir, dest, ignore=shutil.ignore_patterns(MANIFEST))
    manifest = {**v.to_json(), "link": "", "path": dest.name}
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True), encoding="utf-8")
    return dest


def write_sums(root: Path) -> Path:
    lines = [f"{sha256_file(p)}  {p.relative_to(root).as_posix()}"
             for p in sorted(root.rglob("*")) if p.is_file() and p.name != SUMS]
    path = root / SUMS
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def install_md(target: Target, variants: list[Variant], wheels: list[dict[str, Any]]) -> str:
    py = "py" if target.platform == "win_amd64" else f"python{target.python}"
    pip = f"{py} -m pip" if target.platform != "win_amd64" else f"py -{target.python} -m pip"
    models = "\n".join(f"- `{v.id}` ({v.precision}, {v.device}, {v.size_bytes / 1e6:.0f} MB)" for v in variants)
    return f"""# ortserve {__version__}: offline install bundle

Target: **{target.platform}**, Python **{target.python}**, device **{target.device}**
({len(wheels)} wheels). Nothing below uses the network.

On the target machine, from the directory that holds this file:

```
{pip} install --no-index --find-links wheels "{target.requirement}"
ortserve models import-bundle .
```

The second command checks every file against `{SUMS}` and each model's manifest, refuses the
bundle if anything was changed or damaged in transit, and installs the models into the store
(`ORTSERVE_HOME`, default `~/.cache/ortserve`). Then `ortserve serve` serves them.

Models:
{models or "- none"}

Check the bundle by hand on Linux/macOS: `sha256sum -c {SUMS}`; on Windows:
`Get-FileHash -Algorithm SHA256 <file>` and compare with the line in `{SUMS}`.
"""


def build_bundle(target: Target, models: list[str], out: Path, *, store: ModelStore,
                 ortserve_wheel: Path | None = None, resolve_only: bool = False,
                 say: Any = None) -> dict[str, Any]:
    say = say or (lambda _m: None)
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        raise StoreError(f"{out} is not empty", hint="give --out a new or empty directory")
    variants = pick_variants(store, models, target.device)
    with tempfile.TemporaryDirectory() as tmp:
        say("building ortserve's wheel")
        wheel = ortserve_wheel or build_ortserve_wheel(Path(tmp))
        say(f"resolving wheels for {target.platform} / Python {target.python} / {target.device}")
        wheels = resolve(target, wheel)
        summary = {"target": vars(target) | {"extras": list(target.extras)}, "requirement": target.requirement,
                   "wheels": [w["filename"] for w in wheels], "models": [v.id for v in variants]}
        if resolve_only:
            (out / "wheels.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
            return summary
        say(f"downloading {len(wheels)} wheels")
        download(wheels, target, out / "wheels", wheel)
    for v in variants:
        say(f"copying {v.id}")
        copy_variant(v, out / "models")
    (out / "INSTALL.md").write_text(install_md(target, variants, wheels), encoding="utf-8")
    (out / "bundle.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    write_sums(out)
    return summary


# ---- the target side -------------------------------------------------------------------------

def check_sums(root: Path) -> list[str]:
    """Problems with the bundle's files: changed, missing, or not listed. Empty when intact."""
    sums = root / SUMS
    if not sums.is_file():
        return [f"{SUMS} is missing: not an ortserve bundle, or an incomplete copy"]
    listed: dict[str, str] = {}
    for line in sums.read_text(encoding="utf-8").splitlines():
        if line.strip():
            digest, _, name = line.partition("  ")
            listed[name] = digest
    problems = []
    for name, digest in listed.items():
        p = root / name
        if ".." in Path(name).parts or Path(name).is_absolute():
            problems.append(f"{name}: a path outside the bundle")
        elif not p.is_file():
            problems.append(f"{name}: missing")
        elif sha256_file(p) != digest:
            problems.append(f"{name}: SHA-256 does not match {SUMS} (changed or damaged)")
    for p in sorted((root / "models").rglob("*")) if (root / "models").is_dir() else []:
        if p.is_file() and p.relative_to(root).as_posix() not in listed:
            problems.append(f"{p.relative_to(root).as_posix()}: not listed in {SUMS}")
    return problems


def import_bundle(root: Path, store: ModelStore, say: Any = None) -> list[Variant]:
    say = say or (lambda _m: None)
    root = Path(root)
    problems = check_sums(root)
    if problems:
        raise StoreError(f"refusing the bundle at {root}: " + "; ".join(problems[:5])
                         + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""),
                         hint="copy the bundle again from the machine that built it")
    installed = []
    for d in sorted((root / "models").iterdir()) if (root / "models").is_dir() else []:
        data = json.loads((d / MANIFEST).read_text(encoding="utf-8"))
        actual = hash_tree(d)
        if actual != data.get("files"):
            bad = sorted(set(actual) ^ set(data.get("files", {}))
                         | {f for f in actual if data.get("files", {}).get(f) not in (None, actual[f])})
            raise StoreError(f"refusing {d.name}: its files do not match its manifest ({', '.join(bad[:5])})",
                             hint="copy the bundle again from the machine that built it")
        fields = {k: data[k] for k in ("precision", "device", "source", "architecture", "context_length",
                                       "aliases", "quality", "speed", "notes") if k in data}

        def build(tmp: Path, src: Path = d, fields: dict[str, Any] = fields) -> dict[str, Any]:
            shutil.copytree(src, tmp, dirs_exist_ok=True, ignore=shutil.ignore_patterns(MANIFEST))
            return fields

        say(f"installing {data['model']}:{data['variant']}")
        installed.append(store.install(data["model"], data["variant"], build, replace=True))
    return installed
