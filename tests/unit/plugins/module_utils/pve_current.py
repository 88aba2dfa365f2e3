# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A container's config as the PVE API returns it, for the pve_* module_utils tests."""
from __future__ import annotations

# GET /nodes/pve/lxc/129/config as PVE returns it (ints for integer options).
CURRENT = {
    "arch": "amd64",
    "cores": 8,
    "digest": "1f2e3d4c5b6a79881f2e3d4c5b6a79881f2e3d4c",
    "features": "nesting=1,keyctl=1",
    "hostname": "sglang-129",
    "memory": 65536,
    "net0": "name=eth0,bridge=vmbr0,hwaddr=BC:24:11:2A:3B:4C,ip=dhcp,type=veth",
    "ostype": "debian",
    "rootfs": "local-lvm:vm-129-disk-0,size=200G",
    "swap": 0,
    "unprivileged": 1,
    "dev0": "/dev/nvidia0",
    "dev1": "/dev/nvidia1",
    "dev2": "/dev/nvidiactl",
    "dev3": "/dev/nvidia-uvm",
    "dev4": "/dev/nvidia-uvm-tools",
    "dev5": "/dev/dri/renderD128,gid=104",
}
