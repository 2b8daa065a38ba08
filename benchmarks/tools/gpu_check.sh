#!/bin/bash
# One device call's worth of checks and model timings (about 8 minutes on an H100): the four Triton test files,
# then Conv-TasNet eager, compiled and under CUDA graphs in one process. Outputs go to $OUT (or benchmarks/out).
#     bash benchmarks/tools/gpu_check.sh [norms] [modes]     (defaults: none,formula,cln and all three modes)
# A time budget: the tests stop after TEST_S seconds (default 280), the models at TOTAL_S (default 585) in all.
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH=.
OUT=${OUT:-benchmarks/out}
mkdir -p "$OUT"
NORMS=${1:-none,formula,cln}
MODES=${2:-eager,compile,reduce-overhead}
nvidia-smi -L
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
t0=$(date +%s)
timeout "${TEST_S:-280}" python -m pytest -q -n "${JOBS:-16}" -p no:cacheprovider tests/test_triton_ops.py \
    tests/test_triton_forward.py tests/test_triton_backward.py tests/test_direct_launch.py > "$OUT/tests.txt" 2>&1
echo "tests: rc=$? in $(( $(date +%s) - t0 )) s"
grep -E "^(FAILED|ERROR)| passed| failed" "$OUT/tests.txt" | tail -30
t1=$(date +%s)
timeout $(( ${TOTAL_S:-585} - (t1 - t0) )) python benchmarks/models.py --models conv_tasnet --norms "$NORMS" \
    --modes "$MODES" --dtypes fp32 --reps 10 --out "$OUT" > "$OUT/models.txt" 2>&1
echo "models: rc=$? in $(( $(date +%s) - t1 )) s"
grep -v Warning "$OUT/models.txt" | tail -12
