#!/usr/bin/env bash
# The GPU measurements in one run, each stage under its own time limit, for a GPU machine that is
# lent briefly: the engine against HF's generate (with a profile of its decode steps), the CUDA
# tests, the trainer against TRL, and the default training run with its held-out evaluation.
#
#   bash benchmarks/gpu.sh OUT_DIR [STAGE...]      # stages: engine tests training learning
#
# Logs and results go to OUT_DIR (engine.log, tests.log, training.log, learning.log,
# learning.json, history.jsonl). A stage that runs out of time is cut off and the next one runs.
# Limits (seconds) can be set by ENGINE_S, TESTS_S, TRAINING_S and LEARNING_S; LEARNING_ARGS adds
# flags to benchmarks/learning.py (for example "--seeds 2").
# On a lent machine with no package registry, benchmarks/gpu_carry.sh packs the wheels and the
# model to carry there, and prints the calls that run this script.
set -u
out=${1:?usage: gpu.sh OUT_DIR [STAGE...]}
shift
stages=${*:-engine tests training learning}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
py=${PYTHON:-python3}

run() {  # run NAME LIMIT CMD...: CMD's output to OUT_DIR/NAME.log, then its tail here
    local name=$1 limit=$2
    shift 2
    echo "== $name: up to ${limit}s, from $(date +%T)"
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    echo "== $name: exit $rc at $(date +%T)$([ $rc = 124 ] && echo ' (cut off at its limit)')"
    grep -v -e '^Loading weights' -e 'it/s]' "$out/$name.log" | tail -n 30
}

for stage in $stages; do
    case $stage in
    engine)
        run engine "${ENGINE_S:-150}" "$py" benchmarks/engine.py --device cuda \
            --dtypes bfloat16 --concurrency 8 32 --tokens 64 --repeats 3 \
            --skip-transformers-serve --profile 32
        ;;
    tests)
        run tests "${TESTS_S:-150}" "$py" -m pytest -q -p no:cacheprovider \
            tests/test_cuda.py tests/test_engine.py tests/test_training.py
        ;;
    training)
        run training "${TRAINING_S:-120}" "$py" benchmarks/training.py --device cuda \
            --dtypes bfloat16 float32 --steps 4
        ;;
    learning)
        run learning "${LEARNING_S:-300}" "$py" benchmarks/learning.py \
            --path /tmp/mcprl-learning --out "$out/learning.json" ${LEARNING_ARGS:-}
        cp /tmp/mcprl-learning/learning.log "$out/learning-cli.log" 2>/dev/null
        cp /tmp/mcprl-learning/learning/default/history.jsonl "$out/" 2>/dev/null
        ;;
    *)
        echo "unknown stage $stage (engine, tests, training, learning)" >&2
        exit 2
        ;;
    esac
done
