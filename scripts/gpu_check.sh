#!/usr/bin/env bash
# Check and measure the CuPy backend on a GPU machine, one stage per call, each
# stage's output kept in a folder (default gpu_results/, or $OUT when it is set).
#
#   bash scripts/gpu_check.sh setup            # install from wheels/ if there is no index, name the GPU
#   bash scripts/gpu_check.sh selftest         # minidist selftest --backend cupy (checks + whole suite,
#                                              #   in $JOBS pytest-xdist workers, stopped after $SUITE_S s)
#   bash scripts/gpu_check.sh quick            # selftest --quick: checks at small sizes, one-process tests
#   bash scripts/gpu_check.sh suite tests/nn tests/attention   # part of the suite, $JOBS workers
#   bash scripts/gpu_check.sh demos            # every demo under MINIDIST_BACKEND=cupy, 4 at a time
#   bash scripts/gpu_check.sh bench            # bench_gpu.py, then bench_attention.py's memory on CuPy
#   bash scripts/gpu_check.sh checks           # quick, then the multi-process part ($PARTS), with
#                                              #   the demos side by side
#   bash scripts/gpu_check.sh all              # setup, bench (the GPU to itself), checks: ~6 minutes
#
# A machine that reaches no package index but already has CuPy, PyTorch, NumPy,
# pytest, hypothesis and ml_dtypes needs the wheels of minidist's two pure-Python
# dependencies (and, for the MX / NVFP4 comparison, torchao's), fetched beforehand
# on a machine that can, for that machine's Python:
#
#   pip download multiprocess dill torchao --no-deps --only-binary=:all: \
#       --python-version 3.12 -d wheels/
#
# Every stage writes <stage>.txt; a stage that fails says so on its last line and
# the script goes on to the next, so one call brings back everything it could run.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
JOBS=${JOBS:-10}        # pytest-xdist workers for the selftest's property suite
SUITE_S=${SUITE_S:-300} # the property suite is interrupted (and reports) after this many seconds
# the multi-process part of the suite the checks run: collectives, DDP, ZeRO, TP, pipelines,
# fully_shard and its compositions (the one-process part runs in selftest --quick)
PARTS=${PARTS:-"tests/comm/collectives tests/parallel/data tests/parallel/zero tests/parallel/tensor
  tests/parallel/pipeline tests/distributed/test_fully_shard.py tests/distributed/test_fully_shard_llama.py
  tests/distributed/test_fsdp_prefetch.py tests/distributed/test_fsdp_tp.py tests/distributed/test_errors.py
  tests/distributed/test_device_mesh.py tests/checkpoint tests/calc/planner/test_measure.py"}
results=${OUT:-gpu_results}
export PYTHONFAULTHANDLER=1   # a rank that dies of a signal prints where
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1   # Open MPI's mpiexec, as root
command -v ip >/dev/null || export MINIDIST_SKIP_TWO_HOST=1       # no iproute2: no two hosts
mkdir -p "$results"

run_stage() {  # run_stage NAME COMMAND...: the command's output, and its status, into NAME.txt
  local name=$1; shift
  echo "== $name: $*"
  { "$@"; rc=$?; echo "== $name: exit status $rc"; exit "$rc"; } 2>&1 | tee "$results/$name.txt"
  return "${PIPESTATUS[0]}"
}

setup() {
  if ! "$PY" -c "import multiprocess, dill" 2>/dev/null; then
    if [ -d wheels ]; then
      "$PY" -m pip install -q --no-index --no-deps --find-links wheels/ multiprocess dill
    else
      echo "multiprocess and dill are missing and there is no wheels/ folder:" \
           "run 'pip download multiprocess dill --no-deps -d wheels/' where an index is reachable" >&2
      return 2
    fi
  fi
  if ! "$PY" -c "import torchao" 2>/dev/null && ls wheels/torchao-*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps wheels/torchao-*.whl  # only bench_gpu's part 4
  fi
  "$PY" -m pip install -q --no-deps --no-build-isolation -e . || return 1
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$PY" -c "import cupy, numpy, torch, importlib.util as u
print('cupy', cupy.__version__, '| CUDA runtime', cupy.cuda.runtime.runtimeGetVersion(),
      '| numpy', numpy.__version__, '| torch', torch.__version__, '| torch CUDA', torch.version.cuda,
      '| pytest-xdist', 'yes' if u.find_spec('xdist') else 'no')"
  "$PY" -c "from minidist import backend; backend.set_backend('cupy'); print('minidist on', backend.device_name())"
}

one_demo() {  # one_demo PATH: run it on the GPU; one line, and its last lines if it failed
  local d=$1 start=$SECONDS log
  log="$results/demos/$(basename "$d" .py).log"
  if MINIDIST_BACKEND=cupy timeout 300 "$PY" "$d" > "$log" 2>&1; then
    echo "ok      $d  [$((SECONDS - start)) s]"
  else
    echo "FAILED  $d  [$((SECONDS - start)) s]"; tail -n 15 "$log" | sed 's/^/        /'
  fi
}

demos() {  # each demo at its defaults, on the GPU, 4 at a time (each log in demos/)
  mkdir -p "$results/demos"
  export -f one_demo; export PY results
  ls demos/[0-9]*.py | xargs -P 4 -I{} bash -c 'one_demo {}' | tee "$results/demos/summary.txt"
  local failed
  failed=$(grep -c '^FAILED' "$results/demos/summary.txt")
  echo "$failed demo(s) failed"
  [ "$failed" -eq 0 ]
}

selftest() {  # the comparison suite, then the property suite in $JOBS workers, interrupted
  # (SIGINT: pytest prints what failed so far) after $SUITE_S seconds
  timeout -s INT -k 30 "$SUITE_S" "$PY" -m minidist.cli selftest --backend cupy --jobs "$JOBS" "$@"
}

suite() {  # pytest on PATHS under MINIDIST_BACKEND=cupy in $JOBS workers, interrupted likewise
  MINIDIST_BACKEND=cupy timeout -s INT -k 30 "$SUITE_S" "$PY" -m pytest -n "$JOBS" -p no:warnings "$@"
}

checks() {  # selftest --quick, then the multi-process part, with the demos side by side
  { run_stage quick selftest --quick; run_stage parts suite $PARTS; } > /dev/null &
  run_stage demos demos > /dev/null
  wait
  # what comes back from a lent machine is a few files: the demo logs as one
  tar -czf "$results/demo_logs.tar.gz" -C "$results" demos && rm -r "$results/demos"
  tail -n 25 "$results/quick.txt"; tail -n 40 "$results/parts.txt"; tail -n 30 "$results/demos.txt"
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
  selftest) run_stage selftest selftest ;;
  quick)    run_stage quick selftest --quick ;;
  suite)    [ $# -gt 0 ] || { echo "usage: gpu_check.sh suite TEST_PATH..." >&2; exit 2; }
            run_stage "${NAME:-suite_$(echo "$*" | tr -c 'A-Za-z0-9' '_' | cut -c1-60)}" suite "$@" ;;
  demos)    run_stage demos demos ;;
  bench)    run_stage bench bench ;;
  checks)   checks ;;
  all)      run_stage setup setup || exit 1
            run_stage bench bench                        # timings: the GPU to itself
            checks ;;
  *)        awk 'NR > 1 && /^# A machine/ {exit} NR > 1' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
