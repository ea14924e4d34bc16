#!/usr/bin/env bash
# The GPU evidence in one lease (see gpu_evidence.py): each part under its own time limit, the whole run under
# LIMIT seconds (parts that would start after it are skipped and said so). Results: $W (default /tmp/ev), tarred to
# $OUT/ev.tgz when OUT is set. Wheels in .whl/ (numba-cuda, numpy, fla-core, iosim) are installed first if present.
#   PARTS="env tests sweep ncu-sweep sdpa ncu-torch ncu-triton occupancy bench" LIMIT=400 bash experiments/bench/gpu_evidence.sh
set -u
W=${W:-/tmp/ev}
LIMIT=${LIMIT:-420}
PARTS=${PARTS:-"env tests sweep sdpa ncu-sweep ncu-torch ncu-triton occupancy bench bench-ncu"}
mkdir -p "$W"
START=$(date +%s)
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
left() { echo $(( LIMIT - ($(date +%s) - START) )); }
part() {  # part NAME SECONDS COMMAND...
  local name=$1 secs=$2; shift 2
  local l; l=$(left)
  if (( l < 15 )); then echo "== $name: skipped (${l}s left of ${LIMIT}s)"; return; fi
  (( secs > l )) && secs=$l
  echo "== $name (limit ${secs}s) at +$(( $(date +%s) - START ))s"
  timeout -k 5 "$secs" "$@" > "$W/$name.out" 2>&1
  echo "== $name: rc=$? at +$(( $(date +%s) - START ))s"; tail -n 12 "$W/$name.out"
}
E="python3 experiments/bench/gpu_evidence.py"
for p in $PARTS; do
  case $p in
    env) part env 40 $E env --out "$W" ;;
    tests) part tests 110 env IOSIM_GPU=1 python3 -P -m pytest -p no:cacheprovider -q -m "gpu or not slow" tests/test_cuda.py ;;
    gpu-tests) part gpu-tests 110 env IOSIM_GPU=1 python3 -P -m pytest -p no:cacheprovider -q -m "gpu or not slow" tests/test_cuda.py -k "gpu or sm90 or select_target or flash2" ;;
    sweep) part sweep 75 $E sweep --out "$W" --budget 60 ;;
    ncu-sweep) part ncu-sweep 90 $E ncu-sweep --out "$W" --budget 80 ;;
    sdpa) part sdpa 60 $E sdpa --out "$W" ;;
    ab) part ab 50 $E ab --out "$W" ;;
    ncu-torch) part ncu-torch 70 $E ncu-torch --out "$W" --budget 60 ;;
    ncu-triton) part ncu-triton 60 $E ncu-triton --out "$W" --budget 50 ;;
    occupancy) part occupancy 40 $E occupancy --out "$W" ;;
    bench) part bench 60 python3 experiments/bench/gpu.py --quick --no-ncu --seconds 0.3 --reps 5 --out "$W/bench" ;;
    bench-ncu) part bench-ncu 45 python3 experiments/bench/gpu.py --case 1,1,2048,64 --kernels flash2 flash2-backward --no-sweep --no-torch --out "$W/bench-ncu" ;;
  esac
done
echo "== done at +$(( $(date +%s) - START ))s"
if [ -n "${OUT:-}" ]; then tar -czf "$OUT/ev.tgz" -C "$W" . && cp "$W/log.txt" "$OUT/log.txt"; fi
