"""Hostile names and secrets through the collection's REAL connection (inferops.gpu_inference.pct_remote: paramiko
SSH to the lab node's sshd, then the lab's `pct exec` into a real LXC container), driven by ansible-playbook.

A model directory, a wheelhouse or a free-text survey answer (sglang_server_model_path) can carry file names with
`$(...)`, backquotes, `;`, spaces and line breaks. Each must land with exactly its name or be refused with a clear
message, and nothing in a name may run: no marker file appears in the container, on the node or on this machine.
A secret written by managed_files (the role's API key and environment files) must never be seen with a group or
other permission bit: an inotify watcher inside the container stats every file of the directory at each event of
the run (creation, each write, each attribute change, the rename into place), and a control write under umask 022
shows that the watcher sees a creation mode.

CT 182 is made here and destroyed afterwards (this file's VMIDs: 182-183).
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess

import pytest

from conftest import LAB, REPO, NODE, node_ssh, running_ct

VMID = 182
MARK = "pwned-quoting"
# Where an injected command would leave its marker: absolute paths, and relative ones under the shell's home or
# working directory (container: / and /root; node and this machine: /tmp, /root).
MARK_DIRS = ["/", "/tmp", "/root"]
HOSTILE_NAMES = [
    "$(cd;touch %s-dollar)" % MARK,
    "`cd;touch %s-backquote`" % MARK,
    "a;cd;touch %s-semicolon" % MARK,
    "two  spaces and 'quotes\"",
    "-n",
    "*",
]


@pytest.fixture(scope="module")
def ct(lab, api_root):
    yield from running_ct(api_root, VMID)


@pytest.fixture
def run_play(ct, tmp_path):
    """ansible-playbook of `tasks` against CT 182 through inferops.gpu_inference.pct_remote, with `extra` as
    extra variables (a JSON file: no templating of the hostile strings on the way)."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(json.dumps({"all": {"hosts": {"hostile182": {
        "ansible_connection": "inferops.gpu_inference.pct_remote", "ansible_host": "127.0.0.1", "ansible_port": 2222,
        "ansible_user": "root", "ansible_private_key_file": "%s/ssh/id_ed25519" % LAB, "proxmox_vmid": ct,
        "ansible_python_interpreter": "/usr/bin/python3",
        # The node's host key, pinned as inventories/lab pins it.
        "proxmox_node_ssh_host_keys": open("%s/ssh/ssh_host_ed25519_key.pub" % LAB).read()}}}}))

    def play(tasks, extra):
        book = tmp_path / "play.yml"
        book.write_text(json.dumps([{"hosts": "hostile182", "gather_facts": False, "tasks": tasks}]))
        (tmp_path / "extra.json").write_text(json.dumps(extra))
        env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
        return subprocess.run([os.path.join(REPO, ".venv", "bin", "ansible-playbook"), "-i", str(inventory),
                               str(book), "-e", "@%s" % (tmp_path / "extra.json")],
                              capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    return play


def ct_run(vmid, *argv, stdin=None):
    r = subprocess.run(["/usr/sbin/pct", "exec", str(vmid), "--", *argv], input=stdin, capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def ct_python(vmid, code, *args):
    return json.loads(ct_run(vmid, "/usr/bin/python3", "-c", code, *args))


LIST_TREE = r"""
import json, os, sys
out = {}
for root, dirs, files in os.walk(sys.argv[1]):
    for n in dirs + files:
        p = os.path.join(root, n)
        out[os.path.relpath(p, sys.argv[1])] = open(p).read() if os.path.isfile(p) else None
print(json.dumps(out))
"""

FIND_MARKS = r"""
import json, os, sys
found = []
for d in sys.argv[2:]:
    try:
        found += [os.path.join(d, n) for n in os.listdir(d) if sys.argv[1] in n]
    except OSError:
        pass
print(json.dumps(found))
"""


def assert_no_marker(vmid):
    """No marker in the container, on the node (its own SSH view) or on this machine."""
    assert ct_python(vmid, FIND_MARKS, MARK, *MARK_DIRS) == []
    r = node_ssh(NODE, "ls -a %s" % " ".join(MARK_DIRS))
    assert r.returncode == 0 and MARK not in r.stdout, r.stdout + r.stderr
    for d in MARK_DIRS:
        assert not [n for n in os.listdir(d) if MARK in n], d


def test_hostile_names_land_with_exactly_their_name_and_nothing_runs(ct, run_play, tmp_path):
    src = tmp_path / "model"
    src.mkdir()
    for i, name in enumerate(HOSTILE_NAMES):
        (src / name).write_text("tree file %d\n" % i)
    (tmp_path / "one").write_text("one file\n")
    # Destinations named by injections (as sglang_server_model_path could be): a "/" inside $(...) makes directories.
    model_dest = "/tmp/hostile/model $(touch /tmp/%s-tree)" % MARK
    one_dest = "/tmp/hostile/$(touch /tmp/%s-dest)/a b `touch /tmp/%s-dest2`" % (MARK, MARK)
    tasks = [{"name": "Copy hostile names", "inferops.gpu_inference.managed_files": {
        "trees": [{"src": "{{ model_src }}/", "dest": "{{ model_dest }}"}],
        "files": [{"src": "{{ one_src }}", "dest": "{{ one_dest }}"}]}}]
    extra = {"model_src": str(src), "model_dest": model_dest, "one_src": str(tmp_path / "one"), "one_dest": one_dest}
    r = run_play(tasks, extra)
    assert r.returncode == 0, r.stdout + r.stderr
    files = {k: v for k, v in ct_python(ct, LIST_TREE, "/tmp/hostile").items() if v is not None}
    expected = {os.path.relpath(one_dest, "/tmp/hostile"): "one file\n"}
    for i, name in enumerate(HOSTILE_NAMES):
        expected[os.path.relpath(model_dest, "/tmp/hostile") + "/" + name] = "tree file %d\n" % i
    # Every file exactly as named, with its bytes; nothing else (no temporary file left, no file named by a fragment).
    assert files == expected
    assert_no_marker(ct)
    # Run again: the names are read back exactly, so nothing differs and nothing is copied.
    r = run_play(tasks, extra)
    assert r.returncode == 0 and "changed=0" in r.stdout, r.stdout + r.stderr


def test_a_name_with_a_line_break_is_refused_and_nothing_is_copied(ct, run_play, tmp_path):
    src = tmp_path / "model"
    src.mkdir()
    (src / "config.json").write_text("{}\n")
    (src / ("weights\ncd;touch %s-newline" % MARK)).write_text("x\n")
    r = run_play([{"name": "Copy a model with a line break in a name", "inferops.gpu_inference.managed_files": {
        "trees": [{"src": "{{ model_src }}/", "dest": "/tmp/hostile-nl/model"}]}}], {"model_src": str(src)})
    assert r.returncode != 0, r.stdout
    assert "contains the control character \\n" in r.stdout and "rename the file" in r.stdout, r.stdout
    assert "Traceback" not in r.stdout + r.stderr
    assert ct_python(ct, LIST_TREE, "/tmp/hostile-nl") == {}  # refused before any change: not even config.json
    assert_no_marker(ct)


def test_fetch_reads_a_hostile_path_exactly(ct, run_play, tmp_path):
    """fetch_file with a container path holding `$(...)`, a line break and spaces: the bytes of that file."""
    path = "/tmp/hostile-fetch/$(touch /tmp/%s-fetch) x\n`cd;touch %s-fetch2`" % (MARK, MARK)
    ct_run(ct, "/usr/bin/python3", "-c", "import os, sys; os.makedirs(os.path.dirname(sys.argv[1]), exist_ok=True); "
           "open(sys.argv[1], 'w').write('fetched exactly\\n')", path)
    out = tmp_path / "fetched"
    r = run_play([{"name": "Fetch a hostile path", "ansible.builtin.fetch": {
        "src": "{{ hostile_path }}", "dest": "{{ out }}", "flat": True}}], {"hostile_path": path, "out": str(out)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert out.read_text() == "fetched exactly\n"
    assert_no_marker(ct)


# Inside the container: every event on the directory (creation, write, close, attribute change, rename into place)
# and the mode and size of the file it names at that moment; ends when the file "stop" appears.
WATCHER = r"""
import ctypes, grp, json, os, stat, struct, sys
d = sys.argv[1]
libc = ctypes.CDLL("libc.so.6", use_errno=True)
fd = libc.inotify_init()
IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE, IN_MOVED_TO, IN_CREATE = 0x2, 0x4, 0x8, 0x80, 0x100
if libc.inotify_add_watch(fd, d.encode(), IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE) < 0:
    raise SystemExit("inotify_add_watch failed")
print("ready", flush=True)
seen = []
while True:
    buf = os.read(fd, 65536)
    i = 0
    while i < len(buf):
        wd, mask, cookie, size = struct.unpack_from("iIII", buf, i)
        name = buf[i + 16:i + 16 + size].rstrip(b"\0").decode()
        i += 16 + size
        if name == "stop":
            print(json.dumps(seen), flush=True)
            raise SystemExit(0)
        try:
            st = os.lstat(os.path.join(d, name))
        except FileNotFoundError:
            continue
        seen.append({"name": name, "mask": mask, "mode": stat.S_IMODE(st.st_mode), "size": st.st_size,
                     "group": grp.getgrgid(st.st_gid).gr_name})
"""


def test_a_secret_is_never_seen_with_group_or_other_bits(ct, run_play):
    secret_dir = "/etc/hostile-secret"
    ct_run(ct, "/bin/mkdir", "-p", "-m", "0755", secret_dir)
    watcher = subprocess.Popen(["/usr/sbin/pct", "exec", str(ct), "--", "/usr/bin/python3", "-c", WATCHER, secret_dir],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert watcher.stdout.readline() == "ready\n", watcher.stderr.read()
        # Control: a file made by a plain `cat >` under the usual umask is seen by the watcher at 0644.
        ct_run(ct, "/bin/sh", "-c", "umask 022 && echo control > %s" % shlex.quote(secret_dir + "/control"))
        r = run_play([{"name": "Write secrets as the role does", "no_log": True,
                       "inferops.gpu_inference.managed_files": {
                           "files": [{"content": "{{ env_text }}", "dest": secret_dir + "/sglang.env", "mode": "0600"},
                                     {"content": "{{ key_text }}", "dest": secret_dir + "/api-key", "mode": "0640",
                                      "group": "daemon"}],
                           "owner": "root", "group": "root"}}],
                     {"env_text": "HF_TOKEN=\"hf_SECRET\"\n", "key_text": "sk-SECRET-%s\n" % ("x" * 5000)})
        assert r.returncode == 0, r.stdout + r.stderr
        ct_run(ct, "/usr/bin/touch", secret_dir + "/stop")
        out, err = watcher.communicate(timeout=120)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
    events = json.loads(out.strip().splitlines()[-1])
    control = [e for e in events if e["name"] == "control"]
    assert control and control[0]["mode"] == 0o644, events  # the watcher sees a creation mode
    secrets = [e for e in events if e["name"] != "control"]
    # The temporary files were seen being made and written (bytes in them). No observation ever shows an "other"
    # bit; a group bit only on the API key once it has its final group and all its bytes (the install step sets the
    # owner, then the mode, on the complete file); the environment file never has one.
    tmp = [e for e in secrets if e["name"].endswith(".inferops-managed.tmp")]
    assert {e["name"] for e in tmp} == {"sglang.env.inferops-managed.tmp", "api-key.inferops-managed.tmp"}, secrets
    assert any(e["size"] > 0 and e["mode"] == 0o600 for e in tmp if e["name"].startswith("api-key")), secrets
    key_size = len("sk-SECRET-%s\n" % ("x" * 5000))
    assert [e for e in secrets if e["mode"] & 0o007] == []
    assert [e for e in secrets if e["name"].startswith("sglang.env") and e["mode"] & 0o077] == []
    assert [e for e in secrets if e["mode"] & 0o070 and (e["group"] != "daemon" or e["size"] != key_size)] == []
    final = ct_python(ct, "import json, os, sys; print(json.dumps({n: [oct(os.stat(os.path.join(sys.argv[1], n)).st_mode & 0o777), "
                          "os.stat(os.path.join(sys.argv[1], n)).st_gid, open(os.path.join(sys.argv[1], n)).read()[:9]] "
                          "for n in sorted(os.listdir(sys.argv[1]))}))", secret_dir)
    assert final["sglang.env"][:1] == ["0o600"] and final["api-key"][:1] == ["0o640"], final
    assert final["api-key"][2] == "sk-SECRET" and final["sglang.env"][2] == "HF_TOKEN=", final
    assert "SECRET" not in r.stdout + r.stderr  # no_log held
