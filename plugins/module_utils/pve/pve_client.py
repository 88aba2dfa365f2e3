# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The PVE API calls pve_lxc makes for one container, through a proxmoxer-like API object.

No Ansible and no proxmoxer imports. Every call that fails is classified (pve_api.classify_exception) and handed
to ``fail``, which must not return (pve_lxc passes one that ends in AnsibleModule.fail_json). Every task (UPID)
is waited for, with a timeout; a failed task is reported with its exit status and the end of its log.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from ansible_collections.inferops.gpu_inference.plugins.module_utils.pve import pve_api
from ansible_collections.inferops.gpu_inference.plugins.module_utils.pve.pve_config import pending_keys
from ansible_collections.inferops.gpu_inference.plugins.module_utils.pve.pve_gpu_devices import config_gpus
from ansible_collections.inferops.gpu_inference.plugins.module_utils.pve.pve_options import ConfigError, split_tags


class PveClient:
    """CT ``vmid`` on ``node``, read and changed through ``api`` under the login ``auth`` (pve_api.login_settings)."""

    def __init__(
        self,
        api: Any,
        node: str,
        vmid: int,
        auth: dict[str, str],
        fail: Callable[..., Any],
        warn: Callable[[str], Any],
        *,
        task_timeout: int = 300,
        ca_path: Optional[str] = None,
        validate_certs: bool = True,
        api_timeout_s: Optional[int] = None,
    ) -> None:
        self.api = api
        self.node = node
        self.vmid = vmid
        self.auth = auth
        self.fail = fail
        self.warn = warn
        self.task_timeout = task_timeout
        self.ca_path = ca_path
        self.validate_certs = validate_certs
        self.api_timeout_s = api_timeout_s

    # ---- plumbing -------------------------------------------------------------------------
    def call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # proxmoxer, requests: classified into a clear message
            err = pve_api.classify_exception(
                exc, self.auth, self.ca_path, self.validate_certs, self.api_timeout_s
            )
            self.fail(f"{what}: {err.message}", error_kind=err.kind)

    @property
    def ct(self) -> Any:
        return self.api.nodes(self.node).lxc(self.vmid)

    def wait_task(self, upid: str, what: str, timeout: Optional[int] = None, fail: bool = True) -> tuple[bool, Any]:
        """Wait for a task; returns (ok, exitstatus)."""
        timeout = self.task_timeout if timeout is None else timeout
        try:
            task_node = pve_api.upid_node(upid)
        except ConfigError as exc:
            self.fail(f"{what}: {exc}")
        deadline = time.monotonic() + timeout
        status: dict[str, Any] = {}
        while True:
            status = self.call(f"{what}: reading task status", self.api.nodes(task_node).tasks(upid).status.get) or {}
            if status.get("status") == "stopped":
                break
            if time.monotonic() >= deadline:
                if fail:
                    self.fail(
                        f"{what}: task {upid} still running after {timeout}s; PVE may still be working on it "
                        "(see the node's task log). Raise timeout if this is expected.",
                        task=upid,
                    )
                return False, "timeout"
            time.sleep(1)
        if pve_api.task_succeeded(status):
            return True, status.get("exitstatus")
        exitstatus = status.get("exitstatus") or "unknown"
        if fail:
            log = ""
            try:
                log = pve_api.task_log_tail(self.api.nodes(task_node).tasks(upid).log.get(limit=500) or [])
            except Exception:  # the log is a nicety; the exit status is what matters
                log = ""
            message = f"{what}: task {upid} failed with exit status {exitstatus!r}"
            if log:
                message += f"; task log (last lines):\n{log}"
            self.fail(message, task=upid, task_exitstatus=exitstatus)
        return False, exitstatus

    def task(self, what: str, fn: Callable[..., Any], **params: Any) -> None:
        """Start a task with ``fn(**params)`` and wait until it succeeded."""
        upid = self.call(what, fn, **params)
        self.wait_task(upid, what)

    # ---- reading --------------------------------------------------------------------------
    def check_node(self) -> None:
        """The node's status: refused clearly when the node is unknown or not readable."""
        self.call(f"reading the status of node {self.node} (needs Sys.Audit on /nodes/{self.node})",
                  self.api.nodes(self.node).status.get)

    def lxc_listing(self) -> list[dict[str, Any]]:
        """GET /nodes/<node>/lxc: the node's containers (status, mem, maxmem, tags)."""
        return list(self.call(f"listing containers on node {self.node}", self.api.nodes(self.node).lxc.get) or [])

    def listing_entry(self, listing: Optional[list[dict[str, Any]]] = None) -> Optional[dict[str, Any]]:
        """The container's entry in the node's listing (status, mem, ...); None when it does not exist. ``listing``:
        one already read in this run (query reads it once for this and node_guests)."""
        listing = self.lxc_listing() if listing is None else listing
        return next((dict(item) for item in listing if str(item.get("vmid")) == str(self.vmid)), None)

    def cluster_node_of(self) -> Optional[str]:
        """The node the cluster lists this VMID on (GET /cluster/resources type=vm: every node's guests the user may
        audit), None when no node has it. VMIDs are unique in a cluster (pve-cluster Cluster.pm check_vmid_unused)."""
        listing = self.call("listing the cluster's guests", self.api.cluster.resources.get, type="vm") or []
        for item in listing:
            if str(item.get("vmid")) == str(self.vmid):
                return str(item.get("node") or "") or None
        return None

    def node_guests(self, lxc_listing: Optional[list[dict[str, Any]]] = None,
                    known_configs: Optional[dict[int, dict[str, Any]]] = None) -> list[dict[str, Any]]:
        """Every guest of the node (containers and VMs) with its memory limit, use, status and the GPUs its config
        passes through (devN of /dev/nvidiaN; a VM's hostpci GPU is bound to vfio and invisible to the NVIDIA driver,
        so it cannot be asked for and is not listed). ``lxc_listing`` and ``known_configs`` ({vmid: config}): reads
        already made in this run, not made again."""
        node = self.api.nodes(self.node)
        guests: list[dict[str, Any]] = []
        known_configs = known_configs or {}
        for kind, lister in (("lxc", node.lxc), ("qemu", node.qemu)):
            if kind == "lxc" and lxc_listing is not None:
                listing = lxc_listing
            else:
                listing = self.call(f"listing the {'containers' if kind == 'lxc' else 'VMs'} of node {self.node}", lister.get) or []
            for item in listing:
                vmid = int(item.get("vmid"))
                gpus: list[int] = []
                if kind == "lxc":
                    config = known_configs.get(vmid)
                    if config is None:
                        config = self.call(f"reading the config of CT {vmid}", node.lxc(vmid).config.get) or {}
                    gpus = config_gpus(config)
                guests.append({"vmid": vmid, "type": kind, "name": str(item.get("name") or ""),
                               "status": str(item.get("status") or "unknown"), "maxmem_bytes": int(item.get("maxmem") or 0),
                               "mem_bytes": int(item.get("mem") or 0), "gpus": gpus,
                               "tags": split_tags(item.get("tags"))})
        return sorted(guests, key=lambda g: g["vmid"])

    def exists(self) -> bool:
        return self.listing_entry() is not None

    def template_present(self, template: str) -> bool:
        storage = template.partition(":")[0]
        content = self.call(
            f"listing the templates of storage {storage} on node {self.node}",
            self.api.nodes(self.node).storage(storage).content.get, content="vztmpl") or []
        return any(item.get("volid") == template for item in content)

    def read_config(self, with_digest: bool = True) -> dict[str, Any]:
        config = dict(self.call(f"reading the config of CT {self.vmid}", self.ct.config.get) or {})
        if not with_digest:
            config.pop("digest", None)
        return config

    def read_status(self) -> str:
        current = self.call(f"reading the status of CT {self.vmid}", self.ct.status.current.get) or {}
        return current.get("status", "unknown")

    def read_pending(self) -> list[str]:
        try:
            pending = self.ct.pending.get() or []
        except Exception:  # older or simulated APIs without /pending: not worth failing for
            return []
        return pending_keys(pending)

    # ---- changing -------------------------------------------------------------------------
    def create(self, params: dict[str, Any]) -> None:
        upid = self.call(f"creating CT {self.vmid} on node {self.node}", self.api.nodes(self.node).lxc.post, **params)
        self.wait_task(upid, f"creating CT {self.vmid}")

    def put_config(self, params: dict[str, Any]) -> None:
        self.call(f"updating the config of CT {self.vmid}", self.ct.config.put, **params)

    def start(self) -> None:
        self.task(f"starting CT {self.vmid}", self.ct.status.start.post)

    def stop(self, shutdown_timeout: int, force_stop: bool) -> str:
        """A clean shutdown (PVE's ``timeout``), then, if allowed, a hard stop; returns 'shutdown' or 'stop'."""
        what = f"shutting down CT {self.vmid}"
        upid = self.call(what, self.ct.status.shutdown.post, timeout=shutdown_timeout)
        ok, exitstatus = self.wait_task(upid, what, timeout=shutdown_timeout + 30, fail=not force_stop)
        if ok or self.read_status() == "stopped":
            return "shutdown"
        self.warn(f"CT {self.vmid} did not shut down cleanly in {shutdown_timeout}s ({exitstatus}); stopping it hard")
        self.task(f"stopping CT {self.vmid}", self.ct.status.stop.post)
        return "stop"

    def remove(self, purge: bool) -> None:
        params = {"purge": 1} if purge else {}
        self.task(f"removing CT {self.vmid}", self.ct.delete, **params)
