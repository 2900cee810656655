#!/usr/bin/env bash
# The first-GPU check (bench/gpu.py), ready for a machine with JAX+CUDA, Flax, Optax and Orbax but
# no network: wheels of what it lacks (Grain, ...) travel in the git-ignored .whl/ folder of the
# checkout and are installed first, then triskele itself (no build isolation: nothing is fetched).
#   bash bench/gpu.sh [--out DIR]        on the GPU
#   bash bench/gpu.sh --cpu --out DIR    tiny shapes on CPU (the test suite runs this)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
site=${TRISKELE_SITE:-/tmp/site}
if compgen -G ".whl/*.whl" > /dev/null; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! "$python" -c "import triskele.train" 2> /dev/null; then
  "$python" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$site" .
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
exec "$python" bench/gpu.py "$@"
