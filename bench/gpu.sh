#!/usr/bin/env bash
# The first-GPU check (bench/gpu.py), ready for a machine with JAX+CUDA, Flax, Optax and Orbax but
# no network: wheels of what it lacks (Grain, ...) travel in the git-ignored .whl/ folder of the
# checkout and are installed first, then triskele itself (no build isolation: nothing is fetched).
#   bash bench/gpu.sh [--out DIR]        on the GPU
#   bash bench/gpu.sh --cpu --out DIR    tiny shapes on CPU (the test suite runs this)
# The wheels go to TRISKELE_SITE if given, else to a fresh private folder (mktemp -d, removed on
# exit): never to a fixed shared path, which another local user could create first and fill.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if [[ -n "${TRISKELE_SITE:-}" ]]; then
  site=$TRISKELE_SITE
else
  site=$(mktemp -d "${TMPDIR:-/tmp}/triskele-site.XXXXXXXX")
  trap 'rm -rf "$site"' EXIT
fi
if compgen -G ".whl/*.whl" > /dev/null; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! "$python" -c "import triskele.train" 2> /dev/null; then
  "$python" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$site" .
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
"$python" bench/gpu.py "$@"  # not exec: the EXIT trap removes the site after
