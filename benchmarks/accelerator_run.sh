#!/usr/bin/env bash
# torch_tpu on a machine with an accelerator (a TPU VM; a GPU host with JAX's CUDA wheels):
# set up without network, verify the device, run the training-parity tests and the
# benchmarks on the default platform, and write each part's log under OUT.
# CI never runs this: it has no accelerator.
#
# Usage: benchmarks/accelerator_run.sh OUT [setup] [verify] [tests] [bench] [profile] [accuracy] [zoo]
#   (no part named: all but zoo)
# Environment:
#   TORCH_WHEELS=DIR   a folder holding torch 2.13.0's CPU wheel, used when python3 lacks torch
#   PIP_INDEX=URL      a package index for torch's own needs (default: pip's configured one)
#   SITE=DIR           where setup installs (default /tmp/site); appended to PYTHONPATH, so
#                      the machine's own JAX stays first
#   TESTS="..."        the test files to run (default: the parity files below)
#   PART_TIMEOUT=S     each part's time limit in seconds (default 420)
set -uo pipefail
OUT=${1:?usage: accelerator_run.sh OUT [setup] [verify] [tests] [bench] [profile] [accuracy] [zoo]}
shift
PARTS=${*:-setup verify accuracy tests bench profile}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SITE=${SITE:-/tmp/site}
LIMIT=${PART_TIMEOUT:-420}
mkdir -p "$OUT"
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}:$SITE"
export PYTHONUNBUFFERED=1
cd "$ROOT"

part() {  # part NAME: run that function with the time limit, log to OUT/NAME.log, report
    local name=$1
    local start=$SECONDS
    timeout "$LIMIT" bash -c "$name" > "$OUT/$name.log" 2>&1
    local rc=$?
    echo "== $name: exit $rc, $((SECONDS - start)) s"
    tail -n 25 "$OUT/$name.log"
}

setup() {
    local pip=(python3 -m pip install -q --no-compile --target "$SITE")
    if ! python3 -c "import torch" 2>/dev/null; then
        "${pip[@]}" --only-binary=:all: ${PIP_INDEX:+--index-url "$PIP_INDEX"} \
            ${TORCH_WHEELS:+--find-links "$TORCH_WHEELS"} torch==2.13.0 || return
    fi
    # PyTorch's OpInfo database needs expecttest; only its tests miss it.
    python3 -c "import expecttest" 2>/dev/null || "${pip[@]}" ${PIP_INDEX:+--index-url "$PIP_INDEX"} \
        expecttest || echo "expecttest not installed: OpInfo tests cannot run"
    # The project itself without its dependencies: its entry points make `import torch`
    # autoload the device; the code is read from src/ (first on PYTHONPATH).
    "${pip[@]}" --no-deps --no-build-isolation "$ROOT"
    python3 - <<'EOF'
import jax, torch
print("jax", jax.__version__, jax.devices(), "| torch", torch.__version__)
EOF
}

verify() {
    python3 -c "import sys, torch_tpu_cli; sys.exit(torch_tpu_cli.main(['verify']))"
}

tests() {
    # One process: one program at a time can hold a TPU (no pytest -n).
    python3 -m pytest -v -rf -p no:cacheprovider -m "not slow" --durations=15 \
        ${TESTS:-tests/test_smoke.py tests/test_training.py tests/test_accelerator.py \
        tests/test_compile_step.py tests/test_modes.py tests/test_precision.py \
        tests/test_amp.py tests/test_donation.py}
}

bench() {
    python3 benchmarks/bench_strict.py --per-op --quick
    python3 benchmarks/bench_step.py --rounds 2
    python3 benchmarks/bench_modes.py --steps 3
}

profile() {  # where the host's time goes (strict a + b, compile_step's step)
    python3 benchmarks/profile_host.py
}

accuracy() {  # the platform's own arithmetic against exact, beside CPU's
    python3 benchmarks/accuracy_probe.py
}

zoo() {
    python3 -m pytest -q -p no:cacheprovider tests/models/test_zoo.py
}

export ROOT SITE OUT PIP_INDEX="${PIP_INDEX:-}" TORCH_WHEELS="${TORCH_WHEELS:-}" TESTS="${TESTS:-}"
export -f setup verify tests bench profile accuracy zoo
for name in $PARTS; do
    case $name in
        setup | verify | tests | bench | profile | accuracy | zoo) part "$name" ;;
        *) echo "unknown part $name (setup verify tests bench profile accuracy zoo)" >&2; exit 2 ;;
    esac
done
