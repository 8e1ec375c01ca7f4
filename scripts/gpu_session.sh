# One device call: setup, then tests/precision and the tests fixed since the last run, on CuPy.
export PYTHON=python3 S=scripts/gpu_check.sh
bash $S setup > /dev/null 2>&1; tail -3 $OUT/setup.txt
NAME=precision JOBS=12 SUITE_S=170 bash $S suite tests/precision -rfE --tb=short > /dev/null 2>&1 &
MINIDIST_BACKEND=cupy timeout 90 python3 demos/25_diloco.py > $OUT/demo25.txt 2>&1; echo "demo 25: exit $?"
NAME=fixed JOBS=3 SUITE_S=150 bash $S suite tests/parallel/diloco tests/parallel/test_measure.py tests/test_blocks.py tests/comm/transport/test_cma.py -rfE --tb=short > /dev/null 2>&1
timeout 20 python3 scripts/ftz_probe.py > $OUT/probe.txt 2>&1
wait
tail -4 $OUT/demo25.txt; tail -12 $OUT/fixed.txt; tail -40 $OUT/precision.txt
