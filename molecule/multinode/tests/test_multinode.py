# -*- coding: utf-8 -*-
"""One SGLang server over two nodes, read from the world after converge (inventories/lab-multinode): CT 129 on pve1
(node rank 0) and CT 229 on pve2 (node rank 1), TP 4, two ranks and two GPUs on each node.

Every check reads the world itself: each node's CT config, the units' argv and environment in /proc, the scheduler
processes in each unit's cgroup, each node's nvidia-smi (pve1 on this machine's shell, pve2 over its SSH), the
server's /health and /server_info. The tests run in file order: the deployment, then the API waiting for both
nodes, then one node's ranks killed and recover.yml bringing the whole server back.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request

ROOT = os.environ.get("MOLECULE_PROJECT_DIRECTORY", os.getcwd())
LAB = "/var/lib/inferops-lab"
INVENTORY = os.path.join(ROOT, "inventories", "lab-multinode", "hosts.yml")
CTS = {129: {"node": "pve1", "addr": "10.77.0.129", "rank": 0}, 229: {"node": "pve2", "addr": "10.77.0.229", "rank": 1}}
NODE_ADDR = {"pve1": "127.0.0.1", "pve2": "127.0.0.2"}
RANK0 = "http://10.77.0.129:30000"
BYSTANDER = 130
GB = 10**9


def node(name: str, *cmd: str, timeout: int = 120, check: bool = True) -> str:
    """A command on a node as its SSH endpoint runs it (its own pct, nvidia-smi, /dev)."""
    r = subprocess.run(["ssh", "-p", "2222", "-i", f"{LAB}/ssh/id_ed25519", "-o", "IdentitiesOnly=yes",
                        "-o", f"UserKnownHostsFile={LAB}/ssh/known_hosts", "-o", "StrictHostKeyChecking=yes",
                        "-o", "BatchMode=yes", f"root@{NODE_ADDR[name]}", " ".join(shlex.quote(c) for c in cmd)],
                       capture_output=True, text=True, timeout=timeout)
    if check:
        assert r.returncode == 0, (name, cmd, r.stdout, r.stderr)
    return r.stdout


def pct(vmid: int, *cmd: str, check: bool = True) -> str:
    return node(CTS[vmid]["node"], "pct", "exec", str(vmid), "--", *cmd, check=check)


def api_key() -> str:
    with open(f"{LAB}/secrets/sglang-api-key") as f:
        return f.read().strip()


def health(base: str = RANK0) -> int:
    try:
        with urllib.request.urlopen(base + "/health", timeout=3) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def server_info() -> dict:
    req = urllib.request.Request(RANK0 + "/server_info", headers={"Authorization": "Bearer " + api_key()})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


def main_pid(vmid: int) -> int:
    return int(pct(vmid, "systemctl", "show", "-p", "MainPID", "--value", "sglang.service").strip())


def argv(vmid: int) -> list:
    return pct(vmid, "cat", f"/proc/{main_pid(vmid)}/cmdline").split("\0")[:-1]


def unit_pids(vmid: int) -> list:
    """Host PIDs of the container's sglang.service: this machine's /proc (both nodes' containers run on it), by the
    cgroup path PVE gives a container's unit (lxc/<vmid>/ns/system.slice/sglang.service)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cgroup") as f:
                    cgroup = f.read()
            except OSError:
                continue
            if f"/lxc/{vmid}/" in cgroup and "/system.slice/sglang.service" in cgroup:
                pids.append(int(entry))
    return pids


def schedulers(vmid: int) -> dict:
    """{host pid: RssShmem+RssAnon bytes} of the unit's scheduler processes."""
    out = {}
    for pid in unit_pids(vmid):
        try:
            with open(f"/proc/{pid}/cmdline") as f:
                if not f.read().startswith("sglang::scheduler"):
                    continue
            with open(f"/proc/{pid}/status") as f:
                st = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        out[pid] = sum(int(st.get(k, "0 kB").split()[0]) * 1024 for k in ("RssShmem", "RssAnon"))
    return out


def in_ct(pid: int, vmid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            return f"/lxc/{vmid}/" in f.read()
    except OSError:
        return False


def gpu_apps(name: str) -> list:
    """(host pid, GPU index, MiB) of every compute process nvidia-smi shows on the node."""
    index = {r.split(",")[1].strip(): int(r.split(",")[0]) for r in
             node(name, "nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader").splitlines() if r.strip()}
    rows = node(name, "nvidia-smi", "--query-compute-apps=pid,gpu_bus_id,used_memory", "--format=csv,noheader,nounits")
    return [(int(r.split(",")[0]), index[r.split(",")[1].strip()], int(r.split(",")[2])) for r in rows.splitlines() if r.strip()]


def bystander() -> dict:
    status = subprocess.run([f"{ROOT}/tests/lab/labctl", "status"], capture_output=True, text=True, check=True).stdout
    line = [x for x in status.splitlines() if "bystanderd host pid" in x]
    return {"pid": line[0].split("bystanderd host pid")[1].split()[0] if line else None,
            "conf": open(f"/etc/pve/lxc/{BYSTANDER}.conf").read(),
            "gpu": sorted((g, mib) for pid, g, mib in gpu_apps("pve1") if in_ct(pid, BYSTANDER))}


def wait(predicate, timeout_s: float, step_s: float = 1.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(step_s)
    return predicate()


def test_each_container_on_its_node_with_its_nodes_gpus():
    for vmid, ct in CTS.items():
        conf_path = f"/etc/pve/nodes/{ct['node']}/lxc/{vmid}.conf"
        with open(conf_path) as f:
            conf = f.read()
        devs = [line.split(": ", 1)[1].split(",")[0] for line in conf.splitlines() if line.startswith("dev")]
        assert "/dev/nvidia0" in devs and "/dev/nvidia1" in devs and "/dev/nvidia2" not in devs, (vmid, devs)
        assert "memory: 14336" in conf
        assert "status: running" in node(ct["node"], "pct", "status", str(vmid))
        other = "pve2" if ct["node"] == "pve1" else "pve1"
        assert not os.path.exists(f"/etc/pve/nodes/{other}/lxc/{vmid}.conf")


def test_rendezvous_in_each_units_argv_and_environment():
    for vmid, ct in CTS.items():
        args = argv(vmid)
        for flag, value in (("--tp-size", "4"), ("--nnodes", "2"), ("--node-rank", str(ct["rank"])),
                            ("--dist-init-addr", "10.77.0.129:50000"), ("--hicache-size", "1")):
            assert args.count(flag) == 1 and args[args.index(flag) + 1] == value, (vmid, flag, args)
        environ = pct(vmid, "cat", f"/proc/{main_pid(vmid)}/environ").split("\0")
        assert "NCCL_SOCKET_IFNAME=eth0" in environ and "GLOO_SOCKET_IFNAME=eth0" in environ, (vmid, environ)


def test_two_ranks_on_each_node_each_pinning_the_plan():
    for vmid in CTS:
        launch = json.loads(pct(vmid, "cat", "/etc/sglang/launch.json"))
        planned = launch["plan"]["pinned_per_rank_bytes"]
        ranks = schedulers(vmid)
        assert len(ranks) == 2, (vmid, ranks)
        for held in ranks.values():
            assert 0.9 * planned <= held <= planned + 0.5 * GB, (vmid, held, planned)


def test_each_nodes_driver_holds_its_containers_ranks_only():
    for vmid, ct in CTS.items():
        apps = gpu_apps(ct["node"])
        mine = [(pid, g, mib) for pid, g, mib in apps if in_ct(pid, vmid)]
        assert sorted({g for _p, g, _m in mine}) == [0, 1], (vmid, apps)
        assert all(mib > 0 for _p, _g, mib in mine)
        assert set(p for p, _g, _m in mine) <= set(schedulers(vmid)), (vmid, mine)
        other = 229 if vmid == 129 else 129
        assert not [a for a in apps if in_ct(a[0], other)], (ct["node"], "shows", other, apps)


def test_rank_0_serves_the_whole_server():
    assert health() == 200
    info = server_info()
    assert info["tp_size"] == 4 and info["nnodes"] == 2 and info["node_rank"] == 0
    assert info["dist_init_addr"] == "10.77.0.129:50000" and info["hicache_size"] == 1
    # Node rank 1 serves no API: its port answers only SGLang's dummy health check.
    req = urllib.request.Request("http://10.77.0.229:30000/server_info", headers={"Authorization": "Bearer " + api_key()})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            code = r.status
    except urllib.error.HTTPError as e:
        code = e.code
    assert code != 200


def test_each_report_names_both_nodes():
    for vmid, ct in CTS.items():
        with open(os.path.join(ROOT, "reports", f"ct{vmid}", "deploy.txt")) as f:
            text = f.read()
        assert (f"node rank {ct['rank']} of 2 of the server lab_tp4: ct129 (CT 129) on pve1, ct229 (CT 229) on pve2; "
                "the API on node rank 0") in text, text


def test_api_answers_only_once_both_nodes_joined():
    pct(229, "systemctl", "stop", "sglang.service")
    pct(129, "systemctl", "stop", "sglang.service")
    pct(129, "systemctl", "start", "sglang.service")
    # Rank 0 alone: its schedulers wait in the rendezvous, so /health never answers 200.
    waited = [health() for _ in range(10) if time.sleep(1) is None]
    assert 200 not in waited, waited
    assert pct(129, "systemctl", "is-active", "sglang.service").strip() == "active"
    pct(229, "systemctl", "start", "sglang.service")
    assert wait(lambda: health() == 200, 120), "rank 0's /health not 200 within 120 s after node rank 1 started"
    assert server_info()["nnodes"] == 2
    assert len(schedulers(129)) == 2 and len(schedulers(229)) == 2


def test_one_nodes_ranks_killed_then_the_server_recovered_whole():
    before = {"bystander": bystander(), "main": {v: main_pid(v) for v in CTS}, "argv": {v: argv(v) for v in CTS}}
    for pid in schedulers(229):
        os.kill(pid, signal.SIGKILL)
    # A dead peer fails the server on the other node too (its Gloo link closes): rank 0's API goes down.
    assert wait(lambda: health() != 200, 60), "rank 0 still healthy 60 s after node rank 1's ranks were killed"

    for vmid, ct in CTS.items():
        path = os.path.join(ROOT, "reports", ct["node"], f"recover-{vmid}.json")
        if os.path.exists(path):
            os.unlink(path)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_VAULT_PASSWORD_FILE=f"{LAB}/vault-pass", ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".collections"),
               INFEROPS_REPORT_DIR=os.path.join(ROOT, "reports"))

    def recover(*extra: str) -> float:
        start = time.monotonic()
        run = subprocess.run([os.path.join(ROOT, ".venv", "bin", "ansible-playbook"), "-i", INVENTORY,
                              os.path.join(ROOT, "playbooks", "recover.yml"), "-e", "recover_vmid=229", *extra],
                             capture_output=True, text=True, cwd=ROOT, env=env, timeout=1200)
        assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
        return time.monotonic() - start

    # The ladder alone first, and the world read before anything is started again: no unit process and no rank left
    # in either container, and each node's driver shows its two GPUs with no process of that container and idle
    # memory (the gate's 16 MiB), whatever the reports say.
    ladder_seconds = recover()
    for vmid, ct in CTS.items():
        assert unit_pids(vmid) == [] and schedulers(vmid) == {}, vmid
        assert not [a for a in gpu_apps(ct["node"]) if in_ct(a[0], vmid)], (vmid, gpu_apps(ct["node"]))
        rows = node(ct["node"], "nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits")
        used = {int(r.split(",")[0]): int(r.split(",")[1]) for r in rows.splitlines() if r.strip()}
        assert all(used[g] <= 16 for g in (0, 1)), (vmid, used)
    seconds = ladder_seconds + recover("-e", "recover_relaunch=true")

    reports = {}
    for vmid, ct in CTS.items():
        with open(os.path.join(ROOT, "reports", ct["node"], f"recover-{vmid}.json")) as f:
            reports[vmid] = json.load(f)
        assert reports[vmid]["verdict"] == "Clean", (vmid, reports[vmid])
    # Both halves relaunched (new main processes), with the arguments they had, and the server whole again.
    assert wait(lambda: health() == 200, 120)
    for vmid in CTS:
        assert main_pid(vmid) not in (0, before["main"][vmid]), vmid
        assert argv(vmid) == before["argv"][vmid], vmid
        assert len(schedulers(vmid)) == 2, vmid
    assert server_info()["nnodes"] == 2
    # Each node's ladder stayed on its own container: the bystander on pve1 kept its process, config and GPU memory.
    assert bystander() == before["bystander"]
    os.makedirs(os.path.join(ROOT, "reports"), exist_ok=True)
    with open(os.path.join(ROOT, "reports", "multinode-recover.json"), "w") as f:
        json.dump({"recover_seconds": round(seconds, 1),
                   "per_node": {v: {"verdict": r["verdict"], "cleared_by_rung": r.get("cleared_by_rung"),
                                    "rungs": [x.get("rung") for x in r.get("rungs", [])], "seconds": r.get("seconds")}
                                for v, r in reports.items()}}, f, indent=2)


def test_a_change_on_one_node_restarts_the_whole_server(tmp_path):
    # An inventory where only CT 229's unit environment differs: its unit restarts, and CT 129's with it, stopped and
    # started by the same run (sglang_server/tasks/configure.yml), not by systemd's Restart= after its peer died.
    inv = tmp_path / "inventory"
    shutil.copytree(os.path.join(ROOT, "inventories", "lab-multinode"), inv, symlinks=False)
    (inv / "host_vars").mkdir(exist_ok=True)
    (inv / "host_vars" / "ct229.yml").write_text(
        "---\nsglang_server_environment:\n  NCCL_SOCKET_IFNAME: eth0\n  GLOO_SOCKET_IFNAME: eth0\n  NCCL_DEBUG: WARN\n")
    before = {v: main_pid(v) for v in CTS}
    since = int(time.time())
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_VAULT_PASSWORD_FILE=f"{LAB}/vault-pass", ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".collections"),
               INFEROPS_REPORT_DIR=str(tmp_path / "reports"))
    run = subprocess.run([os.path.join(ROOT, ".venv", "bin", "ansible-playbook"), "-i", str(inv / "hosts.yml"),
                          os.path.join(ROOT, "playbooks", "deploy.yml")], capture_output=True, text=True, cwd=ROOT,
                         env=env, timeout=1200)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert "NCCL_DEBUG=WARN" in pct(229, "cat", f"/proc/{main_pid(229)}/environ").split("\0")
    assert "NCCL_DEBUG=WARN" not in pct(129, "cat", f"/proc/{main_pid(129)}/environ").split("\0")
    for vmid in CTS:
        assert main_pid(vmid) not in (0, before[vmid]), vmid
        assert len(schedulers(vmid)) == 2, vmid
    journal = pct(129, "journalctl", "-u", "sglang.service", "--no-pager", "-o", "cat", "--since", f"@{since}")
    assert "Scheduled restart job" not in journal, journal[-3000:]
    assert health() == 200 and server_info()["nnodes"] == 2
