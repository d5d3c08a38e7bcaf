"""Re-vendor the page's front-end libraries from the npm registry (maintainers only).

    python src/ortserve/ui/vendor.py        # needs Node's npm and the registry; `make serve` never runs it

Each pinned package is fetched with `npm pack` (its tarball's integrity is checked by npm and
recorded), and the few files the page loads are copied into ui/vendor/ with the package's
license. Bump a version here, rerun, commit ui/vendor/. Nothing is fetched at run time.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENDOR = HERE / "vendor"

# package@version -> {file in the tarball: name in ui/vendor/}
PACKAGES: dict[str, dict[str, str]] = {
    "marked@18.2.1": {"lib/marked.umd.js": "marked.umd.js"},
    "dompurify@3.4.18": {"dist/purify.min.js": "purify.min.js"},
    "@highlightjs/cdn-assets@11.12.0": {"highlight.min.js": "highlight.min.js",
                                        "styles/github.min.css": "hljs-github.min.css",
                                        "styles/github-dark.min.css": "hljs-github-dark.min.css"},
    "uplot@1.6.32": {"dist/uPlot.iife.min.js": "uPlot.iife.min.js", "dist/uPlot.min.css": "uPlot.min.css"},
}
LICENSE_NAMES = ("LICENSE", "LICENSE.md", "LICENSE.txt", "LICENSE-MPL")


def pack(spec: str, into: Path) -> dict[str, str]:
    npm = shutil.which("npm")
    if npm is None:
        sys.exit("npm is not on PATH: vendoring needs Node (serving does not)")
    out = subprocess.run([npm, "pack", "--json", spec], cwd=into, check=True, capture_output=True,
                         text=True).stdout
    info = json.loads(out)[0]
    return {"filename": info["filename"], "integrity": info["integrity"], "version": info["version"],
            "name": info["name"]}


def copy_without_sourcemap(src: Path, dst: Path) -> None:
    """The .map files are not vendored, so their comment would only make a 404 in DevTools."""
    lines = src.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = [ln for ln in lines if not ln.lstrip().startswith(("//# sourceMappingURL=", "/*# sourceMappingURL="))]
    dst.write_text("".join(kept), encoding="utf-8", newline="")


def main() -> None:
    if VENDOR.exists():
        shutil.rmtree(VENDOR)
    (VENDOR / "LICENSES").mkdir(parents=True)
    versions = {}
    with tempfile.TemporaryDirectory() as tmp:
        for spec, files in PACKAGES.items():
            info = pack(spec, Path(tmp))
            root = Path(tmp) / info["name"].replace("/", "+")
            with tarfile.open(Path(tmp) / info["filename"]) as tar:
                tar.extractall(root, filter="data")
            pkg = root / "package"
            for src, dst in files.items():
                copy_without_sourcemap(pkg / src, VENDOR / dst)
            safe = info["name"].replace("@", "").replace("/", "-")
            for lic in LICENSE_NAMES:
                if (pkg / lic).is_file():
                    shutil.copyfile(pkg / lic, VENDOR / "LICENSES" / f"{safe}-{lic}")
            versions[info["name"]] = {"version": info["version"], "integrity": info["integrity"],
                                      "files": sorted(files.values())}
            print(f"{info['name']}@{info['version']}: {', '.join(files.values())}")
    (VENDOR / "VERSIONS.json").write_text(json.dumps(versions, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
