#!/bin/bash
# Record the device machine a GPU session ran on into FILE (torch, CUDA, Python, CPU count, the GPU's name, then
# `nvidia-smi -L`) and print it:  experiments/gpu/machine.sh OUT/machine.txt
FILE=${1:?usage: experiments/gpu/machine.sh FILE}
python3 - <<'PY' > "$FILE" 2>&1
import os, platform, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "python", platform.python_version(), "cpus", os.cpu_count())
print("device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device")
PY
nvidia-smi -L >> "$FILE" 2>&1 || true
cat "$FILE"
