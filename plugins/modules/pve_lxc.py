#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: pve_lxc
short_description: Make a Proxmox VE LXC container match a declared config, with NVIDIA GPU passthrough
version_added: 0.1.0
author:
  - inferops team (@inferops)
description:
  - Creates, configures, starts, stops and removes one Proxmox VE LXC container through the PVE REST API
    (proxmoxer).
  - "What it adds to M(community.proxmox.proxmox): (1) an idempotent config update that compares the declared
    options with the container's config after normalising PVE's formatting (key order inside option strings,
    C(size=) and C(hwaddr=) filled in by PVE, booleans as 1/0, the allocation form C(local-lvm:8) against the
    allocated volume), sends only the difference with the C(digest) it read, so that a concurrent change is
    refused rather than overwritten, and removes keys with C(delete=); (2) check mode and C(--diff) in PVE's
    conf text form; (3) NVIDIA GPU passthrough as native C(devN) entries (PVE 8.1 and later); (4) a clear
    message when PVE refuses C(devN) because the login is not C(root@pam) with a password; (5) waiting on
    every task (UPID) with a timeout, reporting the task's exit status and log on failure, and a stop that
    tries a clean shutdown (with PVE's C(timeout)) before a hard stop."
  - Only the declared options are managed; other keys of the container's config are left alone unless listed
    in O(delete) or given as V(null) in O(extra_config). This includes PVE 9's C(entrypoint) and C(env), and
    inside a declared C(netN) or C(mpN) the PVE 9 keys C(host-managed), C(keepattrs) and C(idmap) when the
    declaration leaves them out (an operator's value stays).
  - Memory options carry their unit in their name (O(memory_mib), O(swap_mib)).
options:
  vmid:
    description: The container ID.
    type: int
    required: true
  node:
    description: The PVE node that holds (or will hold) the container.
    type: str
    required: true
  state:
    description:
      - V(present) creates the container if missing and makes its config match, without changing whether it runs.
      - V(started) and V(stopped) do the same, then start or stop it.
      - V(absent) stops it (shutdown, then stop) and removes it.
      - V(query) changes nothing. It checks the node is readable and returns RV(exists), RV(status) and RV(mem_bytes)
        of the container (the credentials stay in no_log parameters, unlike an C(Authorization) header of C(uri)).
    type: str
    choices: [present, started, stopped, absent, query]
    default: present
  owner_tag:
    description:
      - A PVE tag that marks the containers this task manages. It is added at creation and kept on every update; an
        existing container without it is refused (nothing is changed) unless O(adopt=true). Also checked by V(query).
    type: str
  adopt:
    description: Take over an existing container that lacks O(owner_tag) (and add the tag to it).
    type: bool
    default: false
  ostemplate:
    description:
      - The template to create the container from, e.g. C(local:vztmpl/debian-13-standard_13.1-1_amd64.tar.zst).
      - Required when the container does not exist yet; ignored otherwise.
    type: str
  hostname:
    description: The container's host name (PVE option C(hostname)).
    type: str
  cores:
    description: Number of CPU cores (PVE option C(cores)).
    type: int
  memory_mib:
    description:
      - Memory limit in MiB (PVE option C(memory)); it becomes the cgroup's C(memory.max).
    type: int
  swap_mib:
    description: Swap limit in MiB (PVE option C(swap)).
    type: int
  rootfs:
    description:
      - The root volume (PVE option C(rootfs)), e.g. C(local-lvm:8) (allocate 8 GiB on local-lvm) or
        C(local-lvm:vm-129-disk-0,size=8G).
      - The allocation form matches an existing volume on the same storage with the same size. This module does
        not resize or move volumes and says so when the declared value would need it.
    type: str
  net:
    description:
      - "Network interfaces, a dict of C(netN) keys to PVE option strings (or dicts), e.g.
        C({net0: 'name=eth0,bridge=vmbr0,ip=dhcp'})."
      - C(hwaddr) and C(type) filled in by PVE are kept when not declared. Interfaces not listed are left alone.
    type: dict
  features:
    description:
      - "Container features as a string (C(nesting=1,keyctl=1)) or a dict (C({nesting: true, keyctl: true}))."
    type: raw
  gpu_passthrough:
    description:
      - NVIDIA devices to pass through as native C(devN) entries.
      - A count N gives C(/dev/nvidia0) to C(/dev/nvidia{N-1}); a list gives device paths (an integer item I means
        C(/dev/nvidiaI)). C(/dev/nvidiactl), C(/dev/nvidia-uvm) and C(/dev/nvidia-uvm-tools) are added whenever a
        GPU node is passed. V(0) or V([]) removes all NVIDIA C(devN) entries. Leave unset to leave them alone.
      - Devices already passed through keep their C(devN) index; new ones take the lowest free index. C(devN)
        entries for non-NVIDIA paths are left alone.
      - Only C(root@pam) with a password (O(api_user=root@pam) and O(api_password)) may set C(devN) through the
        API; API tokens are always refused. Without O(api_host) the module uses C(pvesh) on the node, which acts as
        root@pam.
      - PVE checks at every container start that each path is a device node on the host; a missing node (for
        example a not yet created C(/dev/nvidia-uvm)) makes the start fail.
    type: raw
  gpu_device_options:
    description: Options added to every GPU C(devN) entry.
    type: dict
    suboptions:
      uid:
        description: Owner inside the container (default 0).
        type: int
      gid:
        description: Group inside the container (default 0), e.g. 44 for C(video).
        type: int
      mode:
        description: Access mode as a quoted octal string, e.g. C('0666') (PVE's default is 0660).
        type: str
      deny_write:
        description: Pass the devices read-only (C(deny-write=1)).
        type: bool
  extra_config:
    description:
      - Other PVE container options, as PVE names them (e.g. C(onboot), C(tags), C(cpulimit), C(mp0), C(dev20)).
      - A V(null) value removes the key.
      - Raw C(lxc.*) keys are refused; they are not API parameters and live only in C(/etc/pve/lxc/<vmid>.conf).
      - PVE 9 only (PVE 8 refuses them as unknown parameters) - C(entrypoint), the container's init command, and
        C(env), given as a list of C(NAME=value) strings (sent NUL-separated, as PVE takes it).
    type: dict
  delete:
    description: Config keys to remove if present (sent as C(delete=)).
    type: list
    elements: str
  unprivileged:
    description: Create an unprivileged container. Only used at creation; PVE cannot change it later.
    type: bool
    default: true
  password:
    description: Root password inside a new container. Only used at creation.
    type: str
  ssh_public_keys:
    description: SSH public keys for root inside a new container (one per line). Only used at creation.
    type: str
  pool:
    description: Resource pool to add a new container to. Only used at creation.
    type: str
  timeout:
    description: Seconds to wait for each PVE task (create, start, stop, destroy).
    type: int
    default: 300
  shutdown_timeout:
    description:
      - Seconds PVE gives the container to shut down cleanly (the C(timeout) of C(status/shutdown)) before the
        module stops it hard with C(status/stop) (if O(force_stop=true)).
    type: int
    default: 60
  force_stop:
    description: Stop the container hard when a clean shutdown did not finish in O(shutdown_timeout).
    type: bool
    default: true
  purge:
    description: With O(state=absent), also remove the container from backup jobs, replication and HA.
    type: bool
    default: false
  node_guests:
    description:
      - With O(state=query), also list every guest of the node (containers and VMs, managed or not) with its memory
        limit, use, status and the GPUs its config passes through (RV(node_guests)); needs VM.Audit on each guest.
    type: bool
    default: false
  api_host:
    description:
      - The PVE node or cluster address. Uses E(PROXMOX_HOST) if not given.
      - Leave unset to run C(pvesh) on the node itself (proxmoxer's C(local) backend); run the task on the PVE node
        as root then. This acts as root@pam and may set C(devN).
    type: str
  api_port:
    description: The API port (PVE's default 8006). Uses E(PROXMOX_PORT) if not given.
    type: int
  api_user:
    description:
      - The user to log in as, with its realm, e.g. C(root@pam). Uses E(PROXMOX_USER) if not given.
      - With an API token, the token's owner.
    type: str
  api_password:
    description: The password of O(api_user). Uses E(PROXMOX_PASSWORD) if not given. Keep it in Vault.
    type: str
  api_token_id:
    description:
      - The API token name (e.g. C(ansible)), or the full C(user@realm!name). Uses E(PROXMOX_TOKEN_ID) if not given.
    type: str
  api_token_secret:
    description: The API token secret (a UUID). Uses E(PROXMOX_TOKEN_SECRET) if not given. Keep it in Vault.
    type: str
  validate_certs:
    description:
      - Verify the API's TLS certificate. Uses E(PROXMOX_VALIDATE_CERTS) if not given.
      - Keep it on; for a private CA (PVE's own, or a lab's) set O(ca_path) instead.
    type: bool
    default: true
  ca_path:
    description:
      - A PEM CA bundle to verify the API's certificate with (passed to requests as C(verify)), e.g. a copy of the
        node's C(/etc/pve/pve-root-ca.pem). Uses E(PROXMOX_CA_PATH) if not given.
    type: path
  api_timeout:
    description: Seconds to wait for each API request.
    type: int
    default: 10
extends_documentation_fragment:
  - inferops.gpu_inference.attributes
attributes:
  check_mode:
    support: full
    details: Reads the container and reports what would change; sends no POST, PUT or DELETE.
  diff_mode:
    support: full
    details: The diff is the container's config in PVE's conf text form, before and after.
requirements:
  - proxmoxer >= 2.0
  - requests
notes:
  - A C(devN) change on a running container may stay pending until the container restarts (always on PVE 8.x;
    on PVE 9 only newly added devices are hotplugged). The module returns such keys in RV(pending) and warns.
  - The container's userspace NVIDIA driver must match the host's kernel module exactly.
seealso:
  - module: community.proxmox.proxmox
  - module: inferops.gpu_inference.gpu_host_facts
"""

EXAMPLES = r"""
- name: SGLang container with 8 GPUs
  inferops.gpu_inference.pve_lxc:
    api_host: pve1.example.org
    api_user: root@pam
    api_password: "{{ vault_pve_root_password }}"
    ca_path: /etc/inferops/pve-root-ca.pem
    node: pve1
    vmid: 129
    state: started
    ostemplate: local:vztmpl/debian-13-standard_13.1-1_amd64.tar.zst
    hostname: sglang-129
    cores: 64
    memory_mib: 524288
    swap_mib: 0
    rootfs: local-lvm:200
    net:
      net0: name=eth0,bridge=vmbr0,ip=dhcp
    features:
      nesting: true
    gpu_passthrough: 8
    extra_config:
      onboot: 1

- name: Change memory only, with an API token (no devN change, so a token is enough)
  inferops.gpu_inference.pve_lxc:
    api_host: pve1.example.org
    api_user: root@pam
    api_token_id: ansible
    api_token_secret: "{{ vault_pve_token_secret }}"
    node: pve1
    vmid: 129
    memory_mib: 786432

- name: Remove the container
  inferops.gpu_inference.pve_lxc:
    api_host: pve1.example.org
    api_user: root@pam
    api_password: "{{ vault_pve_root_password }}"
    node: pve1
    vmid: 198
    state: absent
"""

RETURN = r"""
tags:
  description: (state=query) The container's PVE tags (empty when it does not exist).
  type: list
  elements: str
  returned: state is query
template_present:
  description: (state=query) Whether O(ostemplate) is in its storage on the node; only when O(ostemplate) is given
    and the container does not exist (the template only serves to create it).
  type: bool
  returned: state is query, ostemplate is given and the container does not exist
exists:
  description: (state=query) Whether the container is in the node's listing.
  type: bool
  returned: state is query
mem_bytes:
  description: (state=query) Memory the container uses now, from the node's listing (0 when absent or stopped).
  type: int
  returned: state is query
node_guests:
  description:
    - (state=query, node_guests=true) Every guest of the node, by VMID - C(vmid), C(type) (C(lxc) or C(qemu)),
      C(name), C(status), C(maxmem_bytes) (its memory limit), C(mem_bytes) (its use now), C(tags) and C(gpus) (the
      C(/dev/nvidiaN) indexes a container passes through as devN; a VM's vfio GPU is invisible to the NVIDIA driver
      and not listed).
  type: list
  elements: dict
  returned: state is query and node_guests is true
vmid:
  description: The container ID.
  returned: always
  type: int
  sample: 129
status:
  description: The container's state after the task (V(running), V(stopped), or V(absent)); in check mode, the state it would have.
  returned: always
  type: str
  sample: running
created:
  description: Whether the container was (or in check mode, would be) created.
  returned: always
  type: bool
config:
  description: The container's config after the task (in check mode, as it would be), without C(digest).
  returned: when the container exists after the task
  type: dict
  sample: {"hostname": "sglang-129", "memory": 524288, "dev0": "/dev/nvidia0"}
status_before:
  description: >-
    The container's state before the task (V(running), V(stopped), or V(absent)); null when O(state) is V(query)
    or V(absent).
  returned: always
  type: str
  sample: running
restart_needed:
  description: >-
    Whether the GPU passthrough (C(devN) keys) changed on a container that was running; it sees the device nodes
    added or removed only after a restart, which the module leaves to the caller.
  returned: always
  type: bool
changes:
  description: The config keys sent (C(set)) and removed (C(delete)).
  returned: always
  type: dict
  sample: {"set": {"memory": "786432"}, "delete": []}
pending:
  description: Config keys PVE holds as pending until the container restarts.
  returned: always
  type: list
  elements: str
  sample: ["dev8"]
stop_method:
  description: How the container was stopped (V(shutdown) or V(stop)); V(null) if it was not stopped.
  returned: always
  type: str
diff:
  description: The config before and after in PVE's conf text form.
  returned: always
  type: dict
  contains:
    before:
      description: Config before.
      type: str
      returned: always
    after:
      description: Config after.
      type: str
      returned: always
"""

import dataclasses
import traceback

from ansible.module_utils.basic import AnsibleModule, env_fallback, missing_required_lib

from ansible_collections.inferops.gpu_inference.plugins.module_utils.pve import pve_api
from ansible_collections.inferops.gpu_inference.plugins.module_utils.pve import pve_config
from ansible_collections.inferops.gpu_inference.plugins.module_utils.pve.pve_client import PveClient
from ansible_collections.inferops.gpu_inference.plugins.module_utils.pve.pve_options import ConfigError, split_tags

PROXMOXER_IMPORT_ERROR = None
try:
    from proxmoxer import ProxmoxAPI
except ImportError:
    ProxmoxAPI = None
    PROXMOXER_IMPORT_ERROR = traceback.format_exc()


def argument_spec():
    return dict(
        vmid=dict(type="int", required=True),
        node=dict(type="str", required=True),
        state=dict(type="str", default="present", choices=["present", "started", "stopped", "absent", "query"]),
        ostemplate=dict(type="str"),
        hostname=dict(type="str"),
        cores=dict(type="int"),
        memory_mib=dict(type="int"),
        swap_mib=dict(type="int"),
        rootfs=dict(type="str"),
        net=dict(type="dict"),
        features=dict(type="raw"),
        gpu_passthrough=dict(type="raw", no_log=False),
        gpu_device_options=dict(
            type="dict",
            options=dict(
                uid=dict(type="int"),
                gid=dict(type="int"),
                mode=dict(type="str"),
                deny_write=dict(type="bool"),
            ),
        ),
        extra_config=dict(type="dict"),
        delete=dict(type="list", elements="str"),
        unprivileged=dict(type="bool", default=True),
        password=dict(type="str", no_log=True),
        ssh_public_keys=dict(type="str", no_log=False),
        pool=dict(type="str"),
        timeout=dict(type="int", default=300),
        shutdown_timeout=dict(type="int", default=60),
        force_stop=dict(type="bool", default=True),
        purge=dict(type="bool", default=False),
        node_guests=dict(type="bool", default=False),
        owner_tag=dict(type="str"),
        adopt=dict(type="bool", default=False),
        api_host=dict(type="str", fallback=(env_fallback, ["PROXMOX_HOST"])),
        api_port=dict(type="int", fallback=(env_fallback, ["PROXMOX_PORT"])),
        api_user=dict(type="str", fallback=(env_fallback, ["PROXMOX_USER"])),
        api_password=dict(type="str", no_log=True, fallback=(env_fallback, ["PROXMOX_PASSWORD"])),
        api_token_id=dict(type="str", no_log=False, fallback=(env_fallback, ["PROXMOX_TOKEN_ID"])),
        api_token_secret=dict(type="str", no_log=True, fallback=(env_fallback, ["PROXMOX_TOKEN_SECRET"])),
        validate_certs=dict(type="bool", default=True, fallback=(env_fallback, ["PROXMOX_VALIDATE_CERTS"])),
        ca_path=dict(type="path", fallback=(env_fallback, ["PROXMOX_CA_PATH"])),
        api_timeout=dict(type="int", default=10),
    )


class PveLxc:
    """The module's states, given an AnsibleModule-like object and a proxmoxer-like API object.

    What to send is decided in module_utils (pve_config: the declared state and the plan; pve_api: the login and
    errors); the calls themselves are PveClient's.
    """

    def __init__(self, module, api, auth):
        self.module = module
        self.auth = auth  # dict(method=password|token|local, user=..., url=...)
        self.params = module.params
        self.node = self.params["node"]
        self.vmid = self.params["vmid"]
        self.check_mode = module.check_mode
        self.result = dict(
            changed=False,
            vmid=self.vmid,
            node=self.node,
            created=False,
            status=None,
            status_before=None,
            restart_needed=False,
            changes=dict(set={}, delete=[]),
            pending=[],
            stop_method=None,
            diff=dict(before="", after=""),
        )
        self.pve = PveClient(
            api, self.node, self.vmid, auth, self.fail, module.warn,
            task_timeout=self.params["timeout"],
            ca_path=self.params.get("ca_path"),
            validate_certs=self.params.get("validate_certs", True),
            api_timeout_s=self.params.get("api_timeout"),
        )

    def fail(self, msg, **extra):
        self.result.update(extra)
        self.module.fail_json(msg=msg, **self.result)

    def declared(self):
        try:
            return pve_config.declared_state(self.params)
        except ConfigError as exc:
            self.fail(str(exc))

    def check_passthrough_auth(self, plan):
        refusal = pve_api.passthrough_refusal(plan.device_keys(), self.vmid, self.auth["method"], self.auth.get("user"))
        if refusal:
            self.fail(refusal, error_kind="passthrough_root_only")

    def check_owner(self, tags):
        """Refuse an existing container that does not carry O(owner_tag), unless O(adopt)."""
        refusal = pve_config.owner_refusal(self.vmid, self.node, self.params.get("owner_tag"), tags, self.params.get("adopt"))
        if refusal:
            self.fail(refusal, error_kind="not_owned")

    def with_owner_tag(self, declared, current):
        """``current``: the existing container's config, None when it does not exist."""
        owner = self.params.get("owner_tag")
        if not owner:
            return declared
        tags = split_tags(current.get("tags")) if current is not None else []
        if current is not None:
            self.check_owner(tags)
        return dataclasses.replace(declared, config={**declared.config, "tags": pve_config.tags_with_owner(tags, owner)})

    def refuse_vmid_elsewhere(self):
        """A VMID this node does not have may be another node's: refused before any change (PVE would refuse the
        create with "CT <vmid> already exists on node '<other>'" only once everything else was done)."""
        other = self.pve.cluster_node_of()
        if other and other != self.node:
            self.fail(pve_config.vmid_on_other_node(self.vmid, self.node, other), error_kind="vmid_on_other_node")

    # ---- states ---------------------------------------------------------------------------
    def query(self):
        """state=query: read only. The node's status, the container's listing entry (status, mem) and config when it
        exists, and whether O(ostemplate) is in its storage."""
        self.pve.check_node()
        # One listing and one config read serve the container and node_guests (fewer API calls per run).
        listing = self.pve.lxc_listing()
        entry = self.pve.listing_entry(listing)
        config = self.pve.read_config() if entry is not None else {}
        self.result.update(exists=entry is not None, status=(entry or {}).get("status", "absent"),
                           mem_bytes=int((entry or {}).get("mem") or 0), config=config,
                           tags=split_tags(config.get("tags")))
        template = self.params.get("ostemplate")
        # The template matters only to create the container: not looked for when it exists.
        if template and entry is None:
            self.result["template_present"] = self.pve.template_present(template)
        if self.params.get("node_guests"):
            self.result["node_guests"] = self.pve.node_guests(
                lxc_listing=listing, known_configs={self.vmid: config} if entry is not None else None)
        if entry is not None:
            self.check_owner(self.result["tags"])
        else:
            self.refuse_vmid_elsewhere()
        if entry is None and template and not self.result["template_present"]:
            self.fail(pve_config.missing_template(self.vmid, self.node, template), error_kind="template_missing")
        return self.result

    def run(self):
        state = self.params["state"]
        if state == "query":
            return self.query()
        declared = self.declared()
        exists = self.pve.exists()
        if state == "absent":
            return self.ensure_absent(exists)
        # Read once: the owner check and the update compare against the same config (one API call less per run).
        current = self.pve.read_config() if exists else None
        declared = self.with_owner_tag(declared, current)

        if not exists:
            self.result["status_before"] = "absent"
            self.refuse_vmid_elsewhere()
            self.create(declared)
            if self.check_mode:
                self.result["status"] = "running" if state == "started" else "stopped"
                return self.result
        else:
            plan = self.update(declared, current)

        status = self.pve.read_status() if not (self.check_mode and self.result["created"]) else "stopped"
        if exists:
            # The config change does not start or stop it: this is its state before the task.
            self.result["status_before"] = status
            # A running container sees GPU device nodes added or removed (devN) only after a restart.
            self.result["restart_needed"] = status == "running" and plan.touches_devices()
        if state == "started" and status != "running":
            self.start()
            status = "running"
        elif state == "stopped" and status != "stopped":
            self.stop()
            status = "stopped"
        self.result["status"] = status
        return self.result

    def create(self, declared):
        if not self.params["ostemplate"]:
            self.fail(pve_config.missing_ostemplate(self.vmid, self.node))
        try:
            config = pve_config.create_config(declared)
        except ConfigError as exc:
            self.fail(str(exc))
        plan = pve_config.ConfigPlan(set=dict(config))
        self.check_passthrough_auth(plan)
        self.result.update(changed=True, created=True, changes=plan.changes(), config=dict(config),
                           diff=dict(before="", after=pve_config.render_conf(config)))
        if self.check_mode:
            return
        self.pve.create(pve_config.create_params(config, self.vmid, self.params))
        self.show_config_after()

    def update(self, declared, current):
        if not self.params["unprivileged"] and str(current.get("unprivileged", "0")) == "1":
            self.module.warn(f"CT {self.vmid} is unprivileged; unprivileged=false only applies at creation")
        try:
            plan = pve_config.plan_update(current, declared)
        except ConfigError as exc:
            self.fail(str(exc))
        after = pve_config.apply_plan(current, plan)
        self.result.update(config=after, changes=plan.changes(),
                           diff=dict(before=pve_config.render_conf(current), after=pve_config.render_conf(after)))
        if not plan.changed:
            return plan
        self.check_passthrough_auth(plan)
        self.result["changed"] = True
        if self.check_mode:
            return plan
        self.pve.put_config(plan.put_params(current.get("digest")))
        self.show_config_after()
        pending = self.pve.read_pending()
        self.result["pending"] = pending
        if pending:
            self.module.warn(
                f"CT {self.vmid}: {', '.join(pending)} stay pending until the container restarts "
                "(e.g. `pct reboot`); PVE could not apply them to the running container."
            )
        return plan

    def show_config_after(self):
        """The config as PVE has it after a change, in the result and the diff's 'after'."""
        after = self.pve.read_config(with_digest=False)
        self.result["config"] = after
        self.result["diff"]["after"] = pve_config.render_conf(after)

    def start(self):
        self.result["changed"] = True
        if not self.check_mode:
            self.pve.start()

    def stop(self):
        self.result["changed"] = True
        if self.check_mode:
            self.result["stop_method"] = "shutdown"
            return
        self.result["stop_method"] = self.pve.stop(self.params["shutdown_timeout"], self.params["force_stop"])

    def ensure_absent(self, exists):
        if not exists:
            self.result["status"] = "absent"
            return self.result
        before = pve_config.render_conf(self.pve.read_config())
        self.result.update(diff=dict(before=before, after=""), changed=True, status="absent")
        if self.check_mode:
            return self.result
        if self.pve.read_status() != "stopped":
            self.stop()
        self.pve.remove(self.params["purge"])
        return self.result


def connect(module):
    """A proxmoxer API object and a description of the login; fails the module with a clear message."""
    p = module.params
    if ProxmoxAPI is None:
        module.fail_json(msg=missing_required_lib("proxmoxer"), exception=PROXMOXER_IMPORT_ERROR)
    try:
        host, kwargs, auth = pve_api.login_settings(p)
    except ConfigError as exc:
        module.fail_json(msg=str(exc))
    if host is None:
        try:
            return ProxmoxAPI(**kwargs), auth
        except Exception as exc:
            module.fail_json(msg=f"cannot use pvesh on this machine (no api_host given): {exc}")
    if not p["validate_certs"]:
        module.warn("validate_certs is off: the API's identity is not checked. Prefer ca_path for a private CA.")
    try:
        api = ProxmoxAPI(host, **kwargs)
        # A token is only checked on the first request; fail here with a clear message.
        api.version.get()
    except Exception as exc:
        err = pve_api.classify_exception(exc, auth, p["ca_path"], p["validate_certs"], p["api_timeout"])
        module.fail_json(msg=f"connecting to {auth['url']}: {err.message}", error_kind=err.kind)
    return api, auth


def main():
    module = AnsibleModule(
        argument_spec=argument_spec(),
        supports_check_mode=True,
        mutually_exclusive=[("api_password", "api_token_id")],
        required_together=[("api_token_id", "api_token_secret")],
    )
    api, auth = connect(module)
    result = PveLxc(module, api, auth).run()
    module.exit_json(**result)


if __name__ == "__main__":
    main()
