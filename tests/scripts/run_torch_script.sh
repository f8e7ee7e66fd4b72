#!/usr/bin/env bash
# run_torch_script.sh PYTHON DP_LAUNCH NPROC SCRIPT BACKEND
# Runs a torch.distributed script under dp-launch and checks every rank reported success.
# Exits 77 (ctest: skipped) with the reason when the prerequisites are missing.
set -u
py=$1 launcher=$2 nproc=$3 script=$4 backend=$5
if [[ -z $py ]] || ! "$py" -c 'import torch' 2>/dev/null; then
    echo "SKIPPED: no python3 with torch (run ./scripts/setup.sh, or configure with -DDP_PYTHON=...)"
    exit 77
fi
if [[ $backend == nccl ]]; then
    gpus=$("$py" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null)
    if [[ ${gpus:-0} -lt 1 ]]; then
        echo "SKIPPED: needs a CUDA GPU (torch.cuda.is_available() is False on this machine)"
        exit 77
    fi
    nproc=$gpus
fi
out=$("$launcher" -n "$nproc" -- "$py" "$script" "$backend" 2>&1)
rc=$?
echo "$out"
if [[ $rc -ne 0 ]]; then
    echo "FAILED: dp-launch exited $rc"
    exit 1
fi
ok=$(grep -c "all_reduce ok ($backend)" <<<"$out")
if [[ $ok -ne $nproc ]]; then
    echo "FAILED: $ok of $nproc ranks reported success"
    exit 1
fi
echo "PASSED: $nproc ranks"
