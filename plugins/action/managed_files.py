# -*- coding: utf-8 -*-
# Copyright: inferops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin behind inferops.gpu_inference.managed_files (documentation: plugins/modules/managed_files.py).

The digests, the comparison and the requests are module_utils/deploy/managed_files.py's; this only moves them: one
command reads the target's state of every file, one transfer per file that differs, one command installs them.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import tempfile

from ansible.errors import AnsibleError
from ansible.module_utils.common.text.converters import to_text
from ansible.plugins.action import ActionBase

from ansible_collections.inferops.gpu_inference.plugins.module_utils.deploy import managed_files as mf

ARGS = ("files", "srcs", "dest_dir", "trees", "directories", "owner", "group", "mode", "directory_mode", "python")


class ActionModule(ActionBase):
    # Files go straight to a temporary name beside their destination: no remote tmp directory (one command less).
    TRANSFERS_FILES = False

    def _remote(self, python, request):
        cmd = " ".join([shlex.quote(python), "-c", shlex.quote(mf.REMOTE_SCRIPT), shlex.quote(json.dumps(request))])
        res = self._low_level_execute_command(cmd, sudoable=True)
        if res.get("rc") != 0:
            raise mf.ManagedFilesError("the target's %s step failed (rc %s): %s" % (
                request["op"], res.get("rc"), (to_text(res.get("stderr")) or to_text(res.get("stdout"))).strip()[-500:]))
        try:
            return json.loads(to_text(res.get("stdout")).strip().splitlines()[-1])
        except (ValueError, IndexError) as exc:
            raise mf.ManagedFilesError("the target's %s step printed no JSON: %s" % (request["op"], exc))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        unknown = sorted(set(args) - set(ARGS))
        if unknown:
            return dict(result, failed=True, msg="unsupported option(s): %s (supported: %s)" % (", ".join(unknown), ", ".join(ARGS)))
        # null: not managed (files written as the connection's user, such as a report on the controller).
        owner, group = (None if args.get(k, "root") is None else str(args.get(k, "root")) for k in ("owner", "group"))
        python = str(args.get("python") or "/usr/bin/python3")

        def find(src):
            return self._find_needle("files", src)

        staging = None
        try:
            files = list(args.get("files") or [])
            # Content given inline (rendered on the controller) is staged in a private temporary file.
            for i, entry in enumerate(files):
                if isinstance(entry, dict) and "content" in entry:
                    if "src" in entry:
                        raise mf.ManagedFilesError("files[%d] has both src and content" % i)
                    staging = staging or tempfile.mkdtemp(prefix="inferops-managed-")
                    path = os.path.join(staging, "content-%d" % i)
                    with open(path, "w", encoding="utf-8") as handle:
                        handle.write(str(entry["content"]))
                    files[i] = dict((k, v) for k, v in entry.items() if k != "content")
                    files[i].update(src=path, label="content", text=str(entry["content"]))
            if args.get("srcs"):
                if not args.get("dest_dir"):
                    raise mf.ManagedFilesError("srcs needs dest_dir (the directory on the target they are copied into)")
                files += [{"src": src, "dest": str(args["dest_dir"]).rstrip("/") + "/"} for src in args["srcs"]]
            directory_mode = args.get("directory_mode", "0755")
            rows = mf.expand(files, args.get("trees") or [], find, args.get("mode", "0644"), directory_mode)
            dirs = mf.directories(args.get("directories") or [])
            if not rows and not dirs:
                return dict(result, changed=False, msg="no file to manage", copied=[], attributes_fixed=[],
                            directories_made=[], unchanged=0, bytes_copied=0)
            request = mf.read_request(rows, dirs)
            remote = mf.check_remote_answer(self._remote(python, request), request["paths"])
            changes = mf.plan(rows, remote, owner, group)
            dir_changes = mf.plan_dirs(dirs, remote, owner, group, directory_mode)
            changed = bool(changes["copy"] or changes["fix"] or dir_changes["make"] or dir_changes["fix"])
            result.update(mf.summary(changes, dir_changes), changed=changed)
            if self._task.diff and changed:
                texts_req = mf.text_request(changes)
                texts = self._remote(python, texts_req) if texts_req else {}
                result["diff"] = mf.diff_of(changes, dir_changes, texts, directory_mode)
            if not changed or self._task.check_mode:
                return result
            if changes["copy"] or dir_changes["make"] or dir_changes["fix"]:
                self._remote(python, mf.mkdirs_request(changes, owner, group, directory_mode, dir_changes))
            for item in changes["copy"]:
                self._connection.put_file(item["src"], item["dest"] + mf.TMP_SUFFIX)
            if changes["copy"] or changes["fix"]:
                self._remote(python, mf.install_request(changes, owner, group, directory_mode))
        except (mf.ManagedFilesError, AnsibleError, OSError) as exc:
            return dict(result, failed=True, msg=to_text(exc))
        finally:
            if staging:
                shutil.rmtree(staging, ignore_errors=True)
        return result
