#!/usr/bin/env bash
# Check and measure the CuPy backend on a GPU machine, one stage per call, each
# stage's output kept in a folder (default gpu_results/, or $OUT when it is set).
#
#   bash scripts/gpu_check.sh setup            # install from wheels/ if there is no index, name the GPU
#   bash scripts/gpu_check.sh selftest         # minidist selftest --backend cupy (checks + whole suite)
#   bash scripts/gpu_check.sh quick            # selftest --quick: checks at small sizes, one-process tests
#   bash scripts/gpu_check.sh suite tests/nn tests/attention   # part of the suite under MINIDIST_BACKEND=cupy
#   bash scripts/gpu_check.sh demos            # every demo under MINIDIST_BACKEND=cupy
#   bash scripts/gpu_check.sh bench            # bench_gpu.py, then bench_attention.py's memory on CuPy
#   bash scripts/gpu_check.sh all              # setup, selftest, demos, bench
#
# A machine that reaches no package index but already has CuPy, PyTorch, NumPy,
# pytest, hypothesis and ml_dtypes needs the wheels of minidist's two pure-Python
# dependencies, fetched beforehand on a machine that can:
#
#   pip download multiprocess dill --no-deps -d wheels/
#
# Every stage writes <stage>.txt; a stage that fails says so on its last line and
# the script goes on to the next, so one call brings back everything it could run.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
results=${OUT:-gpu_results}
mkdir -p "$results"

run_stage() {  # run_stage NAME COMMAND...: the command's output, and its status, into NAME.txt
  local name=$1; shift
  echo "== $name: $*"
  { "$@"; echo "== $name: exit status $?"; } 2>&1 | tee "$results/$name.txt"
}

setup() {
  if ! "$PY" -c "import multiprocess, dill" 2>/dev/null; then
    if [ -d wheels ]; then
      "$PY" -m pip install -q --no-index --find-links wheels/ multiprocess dill
    else
      echo "multiprocess and dill are missing and there is no wheels/ folder:" \
           "run 'pip download multiprocess dill --no-deps -d wheels/' where an index is reachable" >&2
      return 2
    fi
  fi
  "$PY" -m pip install -q --no-deps --no-build-isolation -e . || return 1
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$PY" -c "import cupy, numpy, torch
print('cupy', cupy.__version__, '| CUDA runtime', cupy.cuda.runtime.runtimeGetVersion(),
      '| numpy', numpy.__version__, '| torch', torch.__version__, '| torch CUDA', torch.version.cuda)"
  "$PY" -c "from minidist import backend; backend.set_backend('cupy'); print('minidist on', backend.device_name())"
}

demos() {  # each demo at its defaults, on the GPU; a failure prints the demo and its last lines
  local failed=0
  for d in demos/[0-9]*.py; do
    local start=$SECONDS
    if MINIDIST_BACKEND=cupy timeout 600 "$PY" "$d" > "$results/demo_$(basename "$d" .py).log" 2>&1; then
      echo "ok      $d  [$((SECONDS - start)) s]"
    else
      echo "FAILED  $d  [$((SECONDS - start)) s]"; tail -n 15 "$results/demo_$(basename "$d" .py).log"
      failed=$((failed + 1))
    fi
  done
  echo "$failed demo(s) failed"
  [ "$failed" -eq 0 ]
}

bench() {
  "$PY" bench/bench_gpu.py || return 1
  echo "-- flash vs naive attention on CuPy (peak bytes from CuPy's memory pool):"
  MINIDIST_BACKEND=cupy "$PY" bench/bench_attention.py
}

stage=${1:-}
[ $# -gt 0 ] && shift
case "$stage" in
  setup)    run_stage setup setup ;;
  selftest) run_stage selftest minidist selftest --backend cupy ;;
  quick)    run_stage quick minidist selftest --backend cupy --quick ;;
  suite)    [ $# -gt 0 ] || { echo "usage: gpu_check.sh suite TEST_PATH..." >&2; exit 2; }
            run_stage "suite_$(echo "$*" | tr -c 'A-Za-z0-9' '_')" \
              env MINIDIST_BACKEND=cupy "$PY" -m pytest "$@" ;;
  demos)    run_stage demos demos ;;
  bench)    run_stage bench bench ;;
  all)      run_stage setup setup; run_stage selftest minidist selftest --backend cupy
            run_stage demos demos; run_stage bench bench ;;
  *)        sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
