#!/usr/bin/env bash
# The GPU evidence in one lease (gpu_evidence.py run-all): each part under its own time limit, the whole run under
# LIMIT seconds (default 540; parts that would start with under 15 s left are skipped and said so). Every part's
# output is stored as it came under $W/raw/ (the profiler's CSV, return code and stderr; pytest's output in
# raw/tests.txt); results in $W (default /tmp/ev), tarred to $OUT/ev.tgz when OUT is set. Wheels in .whl/
# (numba-cuda, numpy, fla-core, iosim) are installed first if present.
#   bash experiments/bench/gpu_evidence.sh --dry-run          # the plan and each part's limit; no GPU needed
#   PARTS="env tests=120 sweep" LIMIT=300 bash experiments/bench/gpu_evidence.sh   # a part's own limit: name=SECONDS
#   PREDICTIONS=experiments/bench/predictions/h200.json bash experiments/bench/gpu_evidence.sh   # another registered file
#   (default: predictions/h200-next.json, the file registered for the next lease, experiments/bench/hierarchy_next.py)
set -u
W=${W:-/tmp/ev}
LIMIT=${LIMIT:-540}
E="python3 experiments/bench/gpu_evidence.py run-all --out $W --limit $LIMIT ${PARTS:+--parts $PARTS} ${PREDICTIONS:+--predictions $PREDICTIONS}"
if [ "${1:-}" = "--dry-run" ]; then exec $E --dry-run; fi
mkdir -p "$W"
export PYTHONUNBUFFERED=1 NUMBA_CACHE_DIR=/tmp/numba-ev
exec > >(tee -a "$W/log.txt") 2>&1
if ls .whl/*.whl >/dev/null 2>&1; then
  # iosim editable, as a developer installs it (the tests' subprocesses import it from the checkout); the other
  # wheels (and iosim's, where the editable install fails) into /tmp/site
  if python3 -m pip install -q --no-index --no-deps --no-build-isolation -e .; then
    rm -f .whl/iosim-*.whl
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
  smoke='import numpy as np; from numba import cuda
@cuda.jit
def k(x): x[cuda.grid(1)] += 1
a = cuda.to_device(np.zeros(32, np.float32)); k[1, 32](a); assert a.copy_to_host().sum() == 32'
  if ! python3 -P -c "$smoke"; then
    echo "the carried numpy does not run a kernel here: the machine's numpy"
    rm -rf /tmp/site/numpy /tmp/site/numpy-* /tmp/site/numpy.libs
    if ! python3 -P -c "$smoke"; then
      echo "the carried numba-cuda does not run a kernel here: the machine's numba-cuda"
      rm -rf /tmp/site/numba_cuda /tmp/site/numba_cuda-* /tmp/site/_numba_cuda_redirector*
    fi
  fi
fi
python3 -P -c "import numpy, numba, numba_cuda, iosim, numba.cuda; print('numpy', numpy.__version__, 'numba', numba.__version__, 'numba-cuda', numba_cuda.__version__, numba.cuda.__file__, 'iosim', iosim.__file__)"
$E
echo "== done"
if [ -n "${OUT:-}" ]; then tar -czf "$OUT/ev.tgz" -C "$W" . && cp "$W/log.txt" "$OUT/log.txt"; fi
