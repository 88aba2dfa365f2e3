#!/usr/bin/env bash
# Device check on a machine with one real NVIDIA GPU (e.g. H200): see tests/device/README.md.
# Never resets or reconfigures the GPU (no nvidia-smi -r, no -pm). Self-checking, bounded to 3 minutes.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" = 0 ] || { echo "run as root (fd scan of other processes, cgroup moves)"; exit 2; }
nvidia-smi -L || { echo "SKIP: no NVIDIA GPU"; exit 77; }
nvidia-smi --query-gpu=index,name,memory.used,memory.total,persistence_mode --format=csv
# The collection link for ansible, if ansible is installed here (optional).
mkdir -p .collections/ansible_collections/inferops
ln -sfn ../../.. .collections/ansible_collections/inferops/gpu_inference
exec timeout -k 10 170 python3 tests/device/check.py
