#!/bin/bash
# Try a multi-host run on one machine: 2 processes x 4 simulated CPU devices, coordinator on
# 127.0.0.1, gloo collectives. The same numbers come out as with 1 process and 8 devices.
set -euo pipefail
python -m triskele.train --local-processes 2 --devices-per-process 4 \
    --mesh data=2,fsdp=2,tensor=2 --dcn data=2 --workdir runs/local-multihost --steps 50 "$@"
