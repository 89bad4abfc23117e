#!/usr/bin/env bash
# The benchmark-only environment for anomalib's PatchCore (bench/kiosk.py runs bench/anomalib_peer.py in it).
# anomalib is never a runtime dependency and never goes into .venv: this makes a separate venv, .venv-anomalib,
# whose site-packages see .venv's packages through a .pth file (torch, numpy, scikit-learn... are reused, not
# downloaded again), and installs anomalib there with torch pinned to the version .venv has.
#
#   bash bench/anomalib_env.sh        (after `make setup`; idempotent)
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=.venv
ENV=.venv-anomalib
TORCH=2.13.0
[ -x "$BASE/bin/python" ] || { echo "bench/anomalib_env.sh: $BASE is missing; run make setup first" >&2; exit 2; }
if [ ! -x "$ENV/bin/python" ]; then
    # the same interpreter .venv was made from
    "$("$BASE/bin/python" -c 'import sys; print(sys._base_executable)')" -m venv "$ENV"
fi
base_site=$("$BASE/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
env_site=$("$ENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# after the env's own site-packages on sys.path: what pip installs here wins over .venv's copy
echo "$(cd "$base_site" && pwd)" > "$env_site/_edgerun_base.pth"
"$ENV/bin/python" -m pip install -q "anomalib==2.7.0" "torch==$TORCH"
"$ENV/bin/python" -c 'import anomalib, torch; print("anomalib", anomalib.__version__, "torch", torch.__version__)'
