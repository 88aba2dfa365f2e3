"""The simulated NVIDIA driver and GPUs: labgpu (up/down/status), the driver daemon, fault injection, test helpers.

The stand-ins installed on the node or into containers (nvidia-smi, nvidia-persistenced, systemctl, lab_worker.py,
driverd.py, stuckfs.py) are copied or run by path and import nothing of the lab.
"""
