#!/usr/bin/env bash
# Packs what benchmarks/gpu.sh needs on a lent GPU machine that reaches no package registry and
# takes 64 MiB a call (the device tool's limits): the wheels its image lacks, and the default
# model's GGUF (94 MiB) split over two carries. Run it here, in the project's venv:
#
#   bash benchmarks/gpu_carry.sh
#
# It writes .gpu1/ and .gpu2/ (added to .git/info/exclude) and prints the two calls to make, back
# to back on one warm machine (it is given back about 30 s after a call): the first installs the
# wheels into /tmp/site and leaves its piece of the model in /tmp; the second joins the pieces
# into $MCPRL_CACHE_DIR (checked by sha256) and runs gpu.sh with the stages it is given.
#
# The wheels are the runtime needs of mcprl that the GPU image (torch 2.11, transformers, peft,
# numpy, httpx, ...; /work/.library/device/KINDS.md lists it) does not hold, at this venv's
# versions. litellm (36 MiB) is left out: only a RULER judge imports it. Add names with EXTRA.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python}
pyv=${DEVICE_PYTHON:-3.12}
names="annotated-types anyio apache-tvm-ffi attrs cffi cryptography distro faker fastuuid gguf
h11 h2 hpack httpcore httpcore2 httpx httpx2 hyperframe importlib-metadata jiter jsonschema
jsonschema-specifications mcp mcp-types openai opentelemetry-api pycparser pydantic
pydantic-core pydantic-settings pyjwt python-dotenv python-multipart referencing rpds-py rstr
sniffio sse-starlette starlette typing-extensions typing-inspection uvicorn xgrammar ${EXTRA:-}"

rm -rf .gpu1 .gpu2
mkdir -p .gpu1/whl .gpu2 .git/info
grep -qx '/.gpu1/' .git/info/exclude 2>/dev/null || printf '/.gpu1/\n/.gpu2/\n' >>.git/info/exclude

# name==version for each name, as installed here (pip normalizes - and _ alike)
reqs=$("$py" - $names <<'EOF'
import sys
from importlib.metadata import version, PackageNotFoundError
out = []
for name in sys.argv[1:]:
    try:
        out.append(f"{name}=={version(name)}")
    except PackageNotFoundError:
        sys.exit(f"gpu_carry: {name} is not installed here; install the project first")
print(" ".join(out))
EOF
)
platforms=""
for n in 17 24 27 28 31 34 35; do platforms+=" --platform manylinux_2_${n}_x86_64"; done
# shellcheck disable=SC2086
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyv" \
    --implementation cp $platforms --platform manylinux2014_x86_64 -d .gpu1/whl $reqs

gguf=$("$py" -c "from mcprl.serving._models import default_gguf; print(default_gguf())")
sum=$(sha256sum "$gguf" | cut -c1-16)
split -b 40M "$gguf" .gpu2/g-
mv .gpu2/g-aa .gpu1/

cat >.gpu1/run1.sh <<'EOF'
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .gpu1/whl/*.whl 2>&1 | tail -3
cp .gpu1/g-aa /tmp/g-aa
PYTHONPATH=/tmp/site:$PWD python3 -c "import mcprl.cli, mcprl.train, torch; \
print('mcprl imports; cuda:', torch.cuda.is_available())"
EOF
cat >.gpu2/run2.sh <<EOF
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH=/tmp/site:\$PWD MCPRL_CACHE_DIR=/tmp/mcprl-cache
g=\$MCPRL_CACHE_DIR/gguf/$(basename "$gguf")
mkdir -p \$(dirname \$g)
cat /tmp/g-aa .gpu2/g-a? >\$g
sha256sum \$g | grep -q '^$sum' || { echo "the model's pieces do not add up: was run1.sh run first, on this machine?"; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc
  python3 -c "import torch, transformers, peft; print(torch.__version__, transformers.__version__, peft.__version__)"
} 2>&1 | tee \$OUT/env.txt
bash benchmarks/gpu.sh \$OUT "\$@"
EOF

tree=$(($(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1) / 1048576 + 1))
for d in .gpu1 .gpu2; do
    size=$(du -sm "$d" | cut -f1)
    echo "$d: ${size} MiB (+ ${tree} MiB of the working tree)"
    if ((size + tree > 63)); then echo "  over the 64 MiB a call: move wheels or split smaller" >&2; fi
done
cat <<'EOF'
Then, back to back:
  run  carry [".gpu1"]  command "bash .gpu1/run1.sh"                      timeout_s 120
  run  carry [".gpu2"]  timeout_s 600
    command "TESTS_S=200 LEARNING_S=380 LEARNING_ARGS='--seeds 1' bash .gpu2/run2.sh tests learning"
EOF
