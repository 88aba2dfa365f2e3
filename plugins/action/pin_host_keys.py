# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin behind inferops.gpu_inference.pin_host_keys (documentation: plugins/modules/pin_host_keys.py).

Runs on the controller and contacts nothing: it checks the node's pinned SSH host keys (module_utils/deploy/ssh_host_keys.py)
and writes them to a known_hosts file of the controller user's own, for the ssh options it returns.
"""
from __future__ import annotations

import os
import stat
import tempfile

from ansible.plugins.action import ActionBase

from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import ssh_host_keys

# Under the controller user's home (AWX: the job's own), never a shared directory: another local user who could
# write there could replace the keys.
_STATE_DIR = os.path.join("~", ".ansible", "inferops-ssh")


def _private_dir(path):
    """Make ``path`` (and its parent) a directory of this user's, mode 0700; refuse one that is a link or another
    user's."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise ssh_host_keys.HostKeyError("%s is not a directory of uid %d (a link, or another user's): remove it, "
                                         "the pinned known_hosts file is written there" % (path, os.geteuid()))
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path


def _write(path, text):
    """Write ``text`` to ``path`` with mode 0600 before any byte is written, atomically (rename)."""
    try:
        with open(path) as f:
            if f.read() == text and stat.S_IMODE(os.stat(path).st_mode) == 0o600:
                return False
    except OSError:
        pass
    fd, tmp = tempfile.mkstemp(prefix=".known_hosts.", dir=os.path.dirname(path))  # mkstemp: mode 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return True


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        result["changed"] = False
        task_vars = task_vars or {}
        where = str(task_vars.get("inventory_hostname") or "the node")
        try:
            if ssh_host_keys.node_connection(self._task.args.get("connection"), where) == "local":
                result.update(ssh_args="", known_hosts="", fingerprints=[], msg="the node is this controller (local): no host key")
                return result
            keys = ssh_host_keys.parse(self._task.args.get("host_keys"), where)
            base = _private_dir(os.path.expanduser(_STATE_DIR))
            path = os.path.join(base, ssh_host_keys.known_hosts_name(keys))
            _write(path, ssh_host_keys.known_hosts_text(keys))
            args = self._task.args
            control = ssh_host_keys.control_path(base, keys, args.get("address"), args.get("port"), args.get("user"))
            result.update(known_hosts=path, ssh_args=ssh_host_keys.ssh_args(path, control),
                          fingerprints=ssh_host_keys.describe(keys))
        except (ssh_host_keys.HostKeyError, OSError) as exc:
            result["failed"] = True
            result["msg"] = str(exc)
        return result
