#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_host_facts
short_description: Gather NVIDIA GPU, host memory, cgroup and container facts
version_added: 0.1.0
author:
  - inferops team (@inferops)
description:
  - Reads, without changing anything, the facts a GPU inference deployment needs about a
    Proxmox VE node or about an LXC container on it.
  - GPUs from C(nvidia-smi --query-gpu=...) and compute processes from
    C(nvidia-smi --query-compute-apps=...) (both with C(--format=csv,noheader,nounits)).
  - Host memory from C(/proc/meminfo), in bytes (MemTotal, MemAvailable, Shmem, Mlocked,
    Unevictable, SwapTotal and a few more). Inside an LXC container these come from lxcfs and
    reflect the container's limits.
  - The memory limit and usage of the cgroup the module runs in (cgroup v2 C(memory.max) and
    C(memory.current), or v1 C(memory.limit_in_bytes) and C(memory.usage_in_bytes)).
    C(max) or a huge value means no limit and is reported as V(null).
  - Whether it runs in a container (C(systemd-detect-virt --container) when present,
    C(/run/systemd/container), C(container=) in C(/proc/1/environ)).
  - The NVIDIA device nodes C(/dev/nvidia*) with their type, major and minor numbers.
  - When C(nvidia-smi) is missing or fails, RV(gpus) is empty and RV(nvidia_smi_error) says why;
    the module only fails then if O(require_gpus=true).
  - Inside a container, C(nvidia-smi) lists no compute processes (the NVIDIA driver does not
    translate PID namespaces); run the module on the node to see them, keyed by host PIDs.
options:
  require_gpus:
    description:
      - Fail when C(nvidia-smi) is missing, fails, or reports no GPU.
      - With V(false), such a host is reported with an empty RV(gpus) list and RV(nvidia_smi_error).
    type: bool
    default: false
  nvidia_smi_path:
    description:
      - Path to the C(nvidia-smi) binary.
      - By default it is looked up in E(PATH) and the usual system directories.
      - A path that does not exist or is not executable is reported as no C(nvidia-smi) (O(require_gpus) then fails).
    type: path
  gather_compute_apps:
    description:
      - Also list the processes using the GPUs (C(--query-compute-apps)).
    type: bool
    default: true
  container_vmids:
    description:
      - On a Proxmox VE node, the containers whose memory cgroup to read (init PID from C(pct status VMID --verbose)),
        for RV(containers_memory). A stopped container is reported with null figures.
      - What a container holds is read from its cgroup, because the PVE API's C(mem) (usage less page cache, which
        includes shared memory) leaves out the shared-memory pools SGLang pins.
    type: list
    elements: int
    default: []
extends_documentation_fragment:
  - inferops.gpu_inference.attributes
  - inferops.gpu_inference.attributes.facts
attributes:
  check_mode:
    support: full
    details: The module never changes anything.
  diff_mode:
    support: none
  facts:
    support: full
notes:
  - Values in C(gpus) that C(nvidia-smi) reports as C([N/A]) or C([Not Supported]) are V(null).
seealso:
  - module: inferops.gpu_inference.pve_lxc
"""

EXAMPLES = r"""
- name: Read the GPU and memory state of the node
  inferops.gpu_inference.gpu_host_facts:

- name: Fail unless the container sees its GPUs
  inferops.gpu_inference.gpu_host_facts:
    require_gpus: true

- name: Show the free host memory
  ansible.builtin.debug:
    msg: "{{ (ansible_facts.gpu_host.memory.mem_available_bytes / 1024 ** 3) | round(1) }} GiB available"
"""

RETURN = r"""
ansible_facts:
  description: Facts to add to C(ansible_facts); everything below is also returned at the top level.
  returned: always
  type: dict
  contains:
    gpu_host:
      description: The same keys as the top-level return values (gpus, gpu_count, memory, cgroup, ...).
      type: dict
      returned: always
gpus:
  description:
    - One entry per GPU, in nvidia-smi index order.
    - C(minor_number) is the GPU's device minor (C(/dev/nvidia<minor_number>), what PVE's devN entries pass), read
      from C(nvidia-smi -q)'s "Minor Number" under the GPU's PCI bus id; null when the driver does not give it
      (RV(gpu_numbering_problems) says why). It is usually, not always, the index.
    - C(utilization_gpu_pct) is nvidia-smi's C(utilization.gpu) (percent); null where the driver does not report it.
  returned: always
  type: list
  elements: dict
  sample:
    - index: 0
      name: NVIDIA H100 80GB HBM3
      memory_total_mib: 81559
      memory_used_mib: 0
      uuid: GPU-5a1b6c7d-0e1f-2a3b-4c5d-6e7f8a9b0c1d
      pci_bus_id: "00000000:18:00.0"
      driver_version: 550.54.15
      persistence_mode: Enabled
      utilization_gpu_pct: 0
      minor_number: 0
gpu_numbering_problems:
  description: Why a GPU's C(minor_number) is null (C(nvidia-smi -q) failed, no Minor Number, one given twice); empty when every GPU is numbered.
  returned: always
  type: list
  elements: str
gpu_count:
  description: Number of GPUs nvidia-smi reported.
  returned: always
  type: int
  sample: 8
gpu_memory_total_mib:
  description: Sum of memory_total_mib over all GPUs.
  returned: always
  type: int
gpu_memory_used_mib:
  description: Sum of memory_used_mib over all GPUs.
  returned: always
  type: int
driver_version:
  description: The driver version nvidia-smi reports, when all GPUs agree; V(null) otherwise.
  returned: always
  type: str
  sample: 550.54.15
kernel_module_version:
  description: The NVIDIA kernel module version from C(/proc/driver/nvidia/version), V(null) if absent.
  returned: always
  type: str
driver_kernel_problems:
  description:
    - For the running kernel and each kernel under C(/lib/modules), why the node's NVIDIA driver is known not to build
      its kernel module for it (550/555 on 6.17, 580.x before 580.159.04 on 7.1); each is also a warning. Empty when
      no known report applies.
  returned: always
  type: list
  elements: str
compute_apps:
  description: Processes using the GPUs (host PIDs; empty inside a container).
  returned: always
  type: list
  elements: dict
  sample:
    - pid: 4242
      process_name: sglang::scheduler_TP0
      used_memory_mib: 70144
      gpu_uuid: GPU-5a1b6c7d-0e1f-2a3b-4c5d-6e7f8a9b0c1d
nvidia_smi_error:
  description: Why no GPU could be read (nvidia-smi missing, or its error output); V(null) on success.
  returned: always
  type: str
memory:
  description: Host memory from /proc/meminfo, in bytes (hugepage counts are plain numbers).
  returned: always
  type: dict
  sample:
    mem_total_bytes: 2164189798400
    mem_available_bytes: 2050000000000
    shmem_bytes: 1073741824
    mlocked_bytes: 0
    unevictable_bytes: 0
    swap_total_bytes: 0
cgroup:
  description:
    - Memory limit and usage of the cgroup the module runs in, in bytes.
    - C(memory_limit_bytes) is V(null) when there is no limit (C(max) or a huge value).
  returned: always
  type: dict
  sample:
    version: 2
    path: /
    memory_limit_bytes: 549755813888
    memory_usage_bytes: 1234567168
    limit_cgroup: /
container:
  description: Whether the module runs in a container.
  returned: always
  type: dict
  sample:
    in_container: true
    type: lxc
    source: /proc/1/environ
containers_memory:
  description:
    - Per container of O(container_vmids) (the VMID as a string), its memory cgroup's limit, usage, what it holds
      beyond reclaimable page cache (C(memory_held_bytes)) and OOM kills, in bytes; null figures when stopped.
  returned: always
  type: dict
  sample:
    "129":
      cgroup_version: 2
      path: /lxc/129
      memory_limit_bytes: 15032385536
      memory_usage_bytes: 2092552192
      memory_held_bytes: 2059751424
      oom_kills: 0
device_nodes:
  description: NVIDIA device nodes under /dev.
  returned: always
  type: list
  elements: dict
  sample:
    - path: /dev/nvidia0
      type: char
      major: 195
      minor: 0
      mode: "0666"
"""

import os
import sys

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.gpu_inference.plugins.module_utils.host import bounded_command, gpu_facts
from ansible_collections.inferops.gpu_inference.plugins.module_utils.recover import recover_pve, recover_smi

# Seconds any command of this module may take: then it and every process of its session are killed (bounded_command).
COMMAND_TIMEOUT_S = 60


def _run(module, argv):
    return module.run_command(bounded_command.argv(sys.executable, COMMAND_TIMEOUT_S, argv),
                              environ_update={"LC_ALL": "C"})


def _run_nvidia_smi(module, args):
    rc, out, err = _run(module, args)
    if rc != 0:
        detail = (err or out or "").strip() or "no output"
        return None, f"{' '.join(args[:2])} exited with {rc}: {detail}"
    return out, None


def gather(module, root="/"):
    params = module.params
    result = {
        "gpus": [],
        "compute_apps": [],
        "nvidia_smi_error": None,
        "gpu_numbering_problems": [],
    }

    smi = params["nvidia_smi_path"]
    if smi and not os.access(smi, os.X_OK):
        smi = None  # a named nvidia-smi that is not there yet (a container before its userspace driver)
    elif not smi:
        smi = module.get_bin_path("nvidia-smi", opt_dirs=["/usr/bin", "/usr/local/bin"])
    if not smi:
        result["nvidia_smi_error"] = "nvidia-smi not found (no NVIDIA userspace driver installed, or not in PATH)"
    else:
        out, error = _run_nvidia_smi(module, gpu_facts.gpu_query_args(smi))
        if error:
            result["nvidia_smi_error"] = error
        else:
            try:
                result["gpus"] = gpu_facts.parse_gpu_csv(out)
            except gpu_facts.ParseError as exc:
                result["nvidia_smi_error"] = f"unexpected nvidia-smi --query-gpu output: {exc}"
        if result["gpus"]:
            # The device minor of each GPU (/dev/nvidiaN) through its PCI bus id: never taken to be the index.
            out, error = _run_nvidia_smi(module, recover_smi.minor_query_args(smi))
            numbering = recover_smi.gpu_numbering(result["gpus"], recover_smi.parse_q_minors(out) if not error else {})
            for gpu in result["gpus"]:
                gpu["minor_number"] = numbering["minor_of_index"].get(gpu["index"])
            result["gpu_numbering_problems"] = [error] if error else numbering["problems"]
        if result["nvidia_smi_error"] is None and params["gather_compute_apps"]:
            out, error = _run_nvidia_smi(module, gpu_facts.compute_apps_query_args(smi))
            if error:
                module.warn(f"could not list GPU compute processes: {error}")
            else:
                try:
                    result["compute_apps"] = gpu_facts.parse_compute_apps_csv(out)
                except gpu_facts.ParseError as exc:
                    module.warn(f"unexpected nvidia-smi --query-compute-apps output: {exc}")
    result.update(gpu_facts.summarize_gpus(result["gpus"]))
    result["kernel_module_version"] = gpu_facts.read_kernel_module_version(root)
    # A kernel the node runs or can boot whose module build is known to fail for this driver: warned, not refused
    # (the running module works; the next boot into that kernel would come up without it).
    result["driver_kernel_problems"] = []
    driver = result.get("kernel_module_version") or result.get("driver_version")
    for release in gpu_facts.node_kernels(root):
        problem = gpu_facts.driver_kernel_problem(driver, release)
        if problem:
            result["driver_kernel_problems"].append(problem)
            module.warn(problem)

    try:
        result["memory"] = gpu_facts.read_host_memory(root)
    except gpu_facts.ParseError as exc:
        module.fail_json(msg=f"cannot read host memory: {exc}")
    result["cgroup"] = gpu_facts.collect_cgroup_memory(root)

    detect_virt_output = None
    detect_virt = module.get_bin_path("systemd-detect-virt")
    if detect_virt:
        # Exit status 1 with "none" means "not in a container"; only the output matters.
        _rc, out, _err = _run(module, [detect_virt, "--container"])
        detect_virt_output = out
    result["container"] = gpu_facts.detect_container(root, detect_virt_output)
    result["device_nodes"] = gpu_facts.list_nvidia_devices(root)
    result["containers_memory"] = _containers_memory(module, params["container_vmids"], root)
    return result


def _containers_memory(module, vmids, root):
    """Each container's cgroup memory (recover_pve.container_memory), its init PID from ``pct status --verbose``."""
    if not vmids:
        return {}
    pct = module.get_bin_path("pct", required=True, opt_dirs=["/usr/sbin"])
    out = {}
    for vmid in vmids:
        rc, text, err = _run(module, [pct, "status", str(vmid), "--verbose"])
        if rc != 0:
            module.fail_json(msg="pct status %d --verbose failed (%d): %s" % (vmid, rc, (err or text).strip()))
        status = recover_pve.parse_pct_status(text)
        pid = status["pid"] if status["status"] == "running" else None
        out[str(vmid)] = recover_pve.container_memory(vmid, pid, root)
    return out


def main():
    module = AnsibleModule(
        argument_spec=dict(
            require_gpus=dict(type="bool", default=False),
            nvidia_smi_path=dict(type="path"),
            gather_compute_apps=dict(type="bool", default=True),
            container_vmids=dict(type="list", elements="int", default=[]),
        ),
        supports_check_mode=True,
    )
    facts = gather(module)
    if module.params["require_gpus"]:
        if facts["nvidia_smi_error"]:
            module.fail_json(
                msg=f"require_gpus is set but no GPU could be read: {facts['nvidia_smi_error']}. "
                "Check that the NVIDIA driver is installed (on the node) or that the container has the "
                "/dev/nvidia* devN entries and the matching userspace driver.",
                **facts,
            )
        if not facts["gpus"]:
            module.fail_json(msg="require_gpus is set but nvidia-smi reported no GPU.", **facts)
    module.exit_json(changed=False, ansible_facts={"gpu_host": facts}, **facts)


if __name__ == "__main__":
    main()
