"""The model store: one directory per model variant, each with a manifest.

Layout under ``HOME/models``::

    <model>--<variant>/        an installed variant (ONNX GenAI files + ortserve.json)
    .tmp/<name>.<pid>.<rand>/  work in progress; never read as installed
    .locks/<name>.lock         held while a variant is being installed

A variant becomes visible only by an atomic rename of a complete directory whose
manifest (with the SHA-256 of every file) was written first, so a crash at any point
leaves nothing half-installed; the registry *is* the set of such directories.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from ortserve import faults
from ortserve.errors import NotFound, StorageFull, StoreError, disk_full

MANIFEST = "ortserve.json"
_ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_VARIANT_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,31}$")


def validate_name(name: str, what: str = "model id") -> str:
    """Model ids and variant names: lowercase letters, digits, '.', '_', '-'; no paths."""
    # '--' joins model and variant in directory names, so it may not appear inside either
    if not isinstance(name, str) or not _ID_RE.match(name) or ".." in name or "--" in name:
        raise StoreError(f"invalid {what} {name!r}: use lowercase letters, digits, '.', '_' and '-' "
                         "(no path separators, no '..' or '--')", param="model")
    return name


@dataclass
class Variant:
    model: str                      # e.g. smollm2-135m
    variant: str                    # e.g. int8-cpu
    precision: str
    device: str
    path: Path
    source: str = ""
    architecture: str = ""
    context_length: int = 0
    size_bytes: int = 0
    files: dict[str, str] = field(default_factory=dict)   # relative path -> sha256
    created: float = 0.0
    aliases: list[str] = field(default_factory=list)
    quality: dict[str, Any] = field(default_factory=dict)  # e.g. {"perplexity": 11.6, "reference": 11.55}
    speed: dict[str, Any] = field(default_factory=dict)    # e.g. {"decode_tps": 79.0}
    notes: dict[str, Any] = field(default_factory=dict)
    link: str = ""                  # imported with --link: the files live here, not in ``path``
    kind: str = "chat"              # chat (ONNX GenAI) | embedding (engine/embed.py) | adapter (LoRA)
    sampling: dict[str, Any] = field(default_factory=dict)  # the model's own sampling defaults (models/sampling.py)
    base: str = ""                  # kind "adapter" (models/adapters.py): the id of the model it applies to
    tool_format: str = ""           # the tool-call syntax chosen by hand (engine/formats); "" = detected

    @property
    def id(self) -> str:
        return f"{self.model}:{self.variant}"

    @property
    def model_dir(self) -> Path:
        """The directory to load: the store copy, or the referenced directory of a linked import."""
        return Path(self.link) if self.link else self.path

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["id"] = self.id
        d["path"] = str(self.path)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any], path: Path) -> Variant:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__ and k != "path"}
        return cls(path=path, **known)


def dir_name(model: str, variant: str) -> str:
    return f"{model}--{variant}"


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def hash_tree(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            out[p.relative_to(root).as_posix()] = sha256_file(p)
    return out


class ModelStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root).expanduser()

    # ---- reading -------------------------------------------------------
    def variants(self) -> list[Variant]:
        if not self.root.is_dir():
            return []
        out = []
        for d in sorted(self.root.iterdir()):
            if d.name.startswith(".") or not (d / MANIFEST).is_file():
                continue
            try:
                out.append(Variant.from_json(json.loads((d / MANIFEST).read_text(encoding="utf-8")), d))
            except (ValueError, TypeError):
                continue  # a foreign or damaged manifest is not an installed model
        return out

    def find(self, ref: str) -> list[Variant]:
        """Variants matching 'model', 'model:variant' or an alias."""
        model, _, variant = ref.partition(":")
        hits = []
        for v in self.variants():
            if ref in v.aliases or (v.model == model and (not variant or v.variant == variant)):
                hits.append(v)
        return hits

    def get(self, ref: str) -> Variant:
        hits = self.find(ref)
        if not hits:
            raise NotFound(f"model {ref!r} is not installed", param="model",
                           hint="see `ortserve models list`, or `ortserve models pull/import`")
        if len(hits) > 1 and ":" not in ref:
            raise StoreError(f"{ref!r} has several variants ({', '.join(h.id for h in hits)}); name one",
                             param="model")
        return hits[0]

    # ---- writing -------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, name: str, timeout: float = 3600.0) -> Iterator[None]:
        locks = self.root / ".locks"
        locks.mkdir(parents=True, exist_ok=True)
        lock = FileLock(locks / f"{name}.lock", timeout=timeout)
        try:
            lock.acquire(poll_interval=0.2)
        except Timeout:
            raise StoreError(f"timed out waiting for lock {lock.lock_file}") from None
        try:
            yield
        finally:
            lock.release()

    def install(self, model: str, variant: str, build: Callable[[Path], dict[str, Any]],
                *, replace: bool | Callable[[Variant], bool] = False) -> Variant:
        """Build a variant into a temp dir and rename it into place, under a lock.

        ``build(tmp_dir)`` writes the model files and returns manifest fields
        (precision, device, source, ...). A concurrent install of the same variant waits
        for the first and then returns its result instead of converting again. ``replace``
        may be a test of the installed variant, made under the lock (so of two processes
        upgrading a stale variant, only the first rebuilds it).
        """
        validate_name(model)
        validate_name(variant, "variant")
        name = dir_name(model, variant)
        final = self.root / name
        with self.lock(name):
            if final.is_dir() and (final / MANIFEST).is_file():
                have = Variant.from_json(json.loads((final / MANIFEST).read_text(encoding="utf-8")), final)
                if not (replace(have) if callable(replace) else replace):
                    return have
            self._sweep_tmp(name)
            tmp = self.root / ".tmp" / f"{name}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
            tmp.mkdir(parents=True)
            try:
                fields = build(tmp)
                faults.point("store.build")
                content = Path(fields["link"]) if fields.get("link") else tmp
                files = hash_tree(content)
                v = Variant(model=model, variant=variant, path=final, files=files, created=time.time(),
                            size_bytes=sum((content / f).stat().st_size for f in files), **fields)
                _write_json_atomic(tmp / MANIFEST, v.to_json())
                _fsync_tree(tmp)
                faults.point("store.manifest")
                trash = None
                if final.exists():   # a crash before the next rename puts it back (_sweep_tmp)
                    trash = self.root / ".tmp" / f"{name}.old.{uuid.uuid4().hex[:8]}"
                    final.replace(trash)
                    faults.point("store.swap")
                tmp.replace(final)
                fsync_dir(self.root)
                if trash is not None:
                    shutil.rmtree(trash, ignore_errors=True)
                faults.point("store.installed")
                return v
            except BaseException as exc:
                shutil.rmtree(tmp, ignore_errors=True)
                if disk_full(exc):
                    raise StorageFull(f"disk full while installing {model}:{variant}; nothing was installed",
                                      param="model", hint=f"free space under {self.root} or point ORTSERVE_HOME "
                                      "at a bigger disk") from exc
                raise

    def update_manifest(self, v: Variant, **changes: Any) -> Variant:
        with self.lock(v.path.name):
            data = json.loads((v.path / MANIFEST).read_text(encoding="utf-8"))
            data.update(changes)
            _write_json_atomic(v.path / MANIFEST, data)
        return Variant.from_json(data, v.path)

    def remove(self, ref: str) -> list[Variant]:
        victims = self.find(ref)
        if not victims:
            raise NotFound(f"model {ref!r} is not installed", param="model")
        for v in victims:
            with self.lock(v.path.name):
                trash = self.root / ".tmp" / f"{v.path.name}.rm.{uuid.uuid4().hex[:8]}"
                trash.parent.mkdir(parents=True, exist_ok=True)
                v.path.replace(trash)
                shutil.rmtree(trash, ignore_errors=True)
        return victims

    def verify(self, v: Variant) -> dict[str, list[str]]:
        """Re-hash every file: what is corrupt, missing, or there but not in the manifest."""
        if not v.model_dir.is_dir():
            return {"corrupt": [], "missing": sorted(v.files), "extra": []}
        actual = hash_tree(v.model_dir)
        corrupt = [f for f, h in v.files.items() if f in actual and actual[f] != h]
        missing = [f for f in v.files if f not in actual]
        extra = [f for f in actual if f not in v.files]
        return {"corrupt": corrupt, "missing": missing, "extra": extra}

    def size(self) -> int:
        if not self.root.is_dir():
            return 0
        return sum(p.stat().st_size for p in self.root.rglob("*") if p.is_file())

    def _sweep_tmp(self, name: str) -> None:
        """Remove leftovers of killed installs of ``name``; we hold its lock, so none is live.

        A variant moved aside by a replace that was killed before the new one took its place is
        put back: the old variant was committed, and a crash must not lose it.
        """
        tmp_root = self.root / ".tmp"
        if tmp_root.is_dir():
            # <name>.<pid>.<rand>[.hf|.ref], the builder's .<name>.<pid>.<rand>.cache, and the
            # <name>.old|rm.<rand> trash of a replace/remove; never another variant's work
            mine = re.compile(rf"^\.?{re.escape(name)}\.(\d+|old|rm)\.[0-9a-f]{{8}}(\.[a-z]+)?$")
            final = self.root / name
            for d in sorted(tmp_root.iterdir()):
                if not mine.match(d.name):
                    continue
                if ".old." in d.name and not final.exists() and (d / MANIFEST).is_file():
                    d.replace(final)
                    fsync_dir(self.root)
                else:
                    shutil.rmtree(d, ignore_errors=True)
        if (self.root / name).is_dir():   # a manifest update killed before its rename
            for p in (self.root / name).glob(f".{MANIFEST}.*"):
                p.unlink(missing_ok=True)

    def sweep(self) -> list[str]:
        """At start: clean what killed installs left, for every variant no live process is installing
        (its lock is free). Returns the names swept."""
        tmp_root = self.root / ".tmp"
        names = {d.name for d in self.root.iterdir() if not d.name.startswith(".")} if self.root.is_dir() else set()
        if tmp_root.is_dir():
            left = re.compile(r"^\.?(.+?)\.(\d+|old|rm)\.[0-9a-f]{8}(\.[a-z]+)?$")
            names |= {m.group(1) for d in tmp_root.iterdir() if (m := left.match(d.name))}
        swept = []
        for name in sorted(names):
            try:
                with self.lock(name, timeout=0):
                    self._sweep_tmp(name)
                    swept.append(name)
            except StoreError:
                continue          # being installed right now by another process
        return swept


def _write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    with tmp.open("w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def _fsync_tree(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            with p.open("rb") as f:
                os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable (POSIX; Windows cannot open a directory, and needs not)."""
    if os.name != "posix":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
