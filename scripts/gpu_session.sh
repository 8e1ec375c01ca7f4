# One device call: setup, the GPT / Llama steps (fused AdamW against the chain), then on
# CuPy the tests of what is new since the last run, and demos 25 and 27.
export PYTHON=python3 S=scripts/gpu_check.sh
bash $S setup > /dev/null 2>&1; tail -3 $OUT/setup.txt
timeout 100 python3 bench/bench_gpu.py --parts gpt llama --steps 10 > $OUT/bench.txt 2>&1; echo "bench: exit $?"
NAME=new JOBS=12 SUITE_S=150 bash $S suite tests/optim tests/distributed/test_hsdp.py \
  tests/distributed/test_fsdp_gather_format.py tests/parallel/fault_tolerance \
  tests/comm/launch/test_fault_tolerant_world.py tests/parallel/tensor/test_async_tp.py \
  tests/parallel/expert/test_overlapped_dispatch.py tests/parallel/pipeline/test_dualpipe.py \
  tests/autograd/test_selective_checkpoint.py tests/parallel/diloco tests/parallel/zero \
  -rfE --tb=short > /dev/null 2>&1 &
for d in 25_diloco 27_fault_tolerance; do
  MINIDIST_BACKEND=cupy timeout 70 python3 demos/$d.py > $OUT/demo$d.txt 2>&1; echo "demo $d: exit $?"
done
wait
grep -A12 "training step" $OUT/bench.txt; tail -3 $OUT/bench.txt; tail -25 $OUT/new.txt
