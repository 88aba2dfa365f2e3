"""The SGLang stand-in run for real on the node: wheels installed into throwaway venvs, a fake GPU
driver daemon (NVLAB_DRIVER_SOCK / NVLAB_DEV_DIR), real processes and really committed host memory.

Expected values are computed here from sglang-hicache.md, independently of the stand-in's code.
"""

import json
import os
import re
import signal
import subprocess
import time
import zipfile

import pytest

from sglang_standin import harness


GIB = 1024 ** 3
RESERVE = 10 * GIB  # SGLang's 10 GiB host reserve (section 2.4)
REQUIRED = ["0.5.4", "0.5.5", "0.5.9", "0.5.14", "0.5.15", "0.5.19", "0.5.21"]
TINY_BPT_TP2 = 128 * 4 * 2 * 2 * 2  # head_dim x (8 kv heads // tp 2) x 2 layers x bf16 x (K and V)
TINY_BPT_TP1 = 128 * 8 * 2 * 2 * 2


@pytest.fixture(scope="session")
def wheels(tmp_path_factory):
    return harness.Wheels(str(tmp_path_factory.mktemp("sglang-wheels"))).build()


@pytest.fixture(scope="session")
def driver(tmp_path_factory):
    d = harness.FakeDriver(str(tmp_path_factory.mktemp("nvlab")), gpus=8, mib=40960)
    yield d
    d.stop()


@pytest.fixture(scope="session")
def model(tmp_path_factory):
    return harness.write_tiny_model(str(tmp_path_factory.mktemp("model") / "tiny"))


@pytest.fixture
def run(wheels, driver, model, tmp_path):
    """run(version, *args, env=...) -> Server; every server is killed at the end of the test."""
    servers = []
    faults = tmp_path / "faults.json"

    def _run(version, *args, env=None, model_path=None):
        e = {"NVLAB_DRIVER_SOCK": driver.sock, "NVLAB_DEV_DIR": driver.dev, "SGLANG_STANDIN_WARMUP_SECONDS": "0.3",
             "SGLANG_STANDIN_FAULTS_FILE": str(faults), "SGLANG_HEALTH_CHECK_TIMEOUT": "1"}
        e.update(env or {})
        argv = ["--model-path", model_path or model] + list(args)
        s = harness.Server(wheels.venv(version), argv, env=e, log_path=str(tmp_path / ("server-%d.log" % len(servers))))
        servers.append(s)
        return s

    _run.faults = faults
    yield _run
    for s in servers:
        s.kill()
    # The driver frees a killed process's GPU memory once the process is gone (the fake driver's reaper): the next
    # test starts on free GPUs, not on what a dying rank of this one still holds.
    deadline = time.time() + 30
    while driver.allocs() and time.time() < deadline:
        time.sleep(0.2)


def host_tokens(h_gb, bpt, version, page=1):
    t = int(h_gb * 1e9 // bpt)
    if version <= (0, 5, 5):
        return t - t % page
    return (t // page + 1) * page


def titles(server):
    return sorted(args for pid, args in server.tree()[1:])


def rank_pids(server):
    return [pid for pid, args in server.tree() if args.startswith("sglang::scheduler")]


def need_available(nbytes):
    if harness.mem_available() < nbytes:
        pytest.skip("needs %.1f GB of MemAvailable on the node" % (nbytes / 1e9))


# ---------------------------------------------------------------------------------------------
def test_build_outputs(wheels, tmp_path):
    files = harness.wheel_files(wheels.out)
    for v in REQUIRED:
        assert "sglang-%s-py3-none-any.whl" % v in files
    for name in ("sglang", "setproctitle"):
        assert os.path.isfile(os.path.join(wheels.out, "simple", name, "index.html")), name
    assert any(f.startswith("setproctitle-") and "cp311" in f for f in files)
    assert any(f.startswith("setproctitle-") and "cp312" in f for f in files)
    assert any(f.startswith("setproctitle-") and "cp313" in f for f in files)  # Debian 13, the lab's template
    for m in ("kimi-k2-tiny", "llama-3-70b-tiny"):
        with open(os.path.join(wheels.out, "models", m, "model.safetensors.index.json")) as f:
            assert json.load(f)["metadata"]["total_size"] > 0
    with zipfile.ZipFile(os.path.join(wheels.out, "sglang-0.5.9-py3-none-any.whl")) as z:
        names = z.namelist()
        assert "sglang/launch_server.py" in names
        meta = z.read("sglang-0.5.9.dist-info/METADATA").decode()
        assert "Version: 0.5.9" in meta and "Requires-Dist: setproctitle" in meta
        assert "sglang-0.5.9.dist-info/RECORD" in names
    # the PEP 503 index works as an --index-url, offline
    venv = str(tmp_path / "v")
    subprocess.run([harness.base_python(), "-m", "venv", "--without-pip", venv], check=True)
    r = subprocess.run([harness._pip_python(), "-m", "pip", "--python", venv + "/bin/python", "install", "-q",
                        "--index-url", "file://" + wheels.out + "/simple", "sglang==0.5.21"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = subprocess.run([venv + "/bin/python", "-c", "import sglang; print(sglang.__version__)"],
                         capture_output=True, text=True)
    assert out.stdout.strip() == "0.5.21"


def test_argument_errors(run):
    s = run("0.5.9", "--enable-hierarchical-cache", "--hicache-size", "8.5")
    assert s.wait(30) == 2
    assert "invalid int value: '8.5'" in s.output()
    s = run("0.5.9", "--no-such-argument")
    assert s.wait(30) == 2
    s = run("0.5.9", "--enable-hierarchical-cache", "--disable-radix-cache")
    assert s.wait(30) == 1
    assert ("ValueError: The arguments enable-hierarchical-cache and disable-radix-cache are mutually exclusive "
            "and cannot be used at the same time. Please use only one of them.") in s.output()


@pytest.mark.parametrize("version,args", [
    ("0.5.9", ["--load-format", "runai_streamer"]),         # from 0.5.10
    ("0.5.9", ["--quantization", "int4"]),
    ("0.5.20", ["--quantization", "marlin"]),               # dropped in 0.5.20
    ("0.5.2", ["--attention-backend", "fa4"]),              # from 0.5.4
    ("0.5.9", ["--decode-attention-backend", "nope"]),
    ("0.5.2", ["--schedule-policy", "priority"]),           # from 0.5.4
    ("0.5.9", ["--enable-hierarchical-cache", "--hicache-storage-backend", "s3"]),
])
def test_choice_lists_exit_2(run, version, args):
    """Values outside the release's argparse choices (server_args_choices.py) exit 2 before anything starts."""
    s = run(version, *args)
    assert s.wait(30) == 2
    assert "invalid choice: '%s'" % args[-1] in s.output()


def test_no_driver_fails_like_cuda(run):
    s = run("0.5.9", "--tp", "2", env={"NVLAB_DRIVER_SOCK": "/nonexistent/driver.sock"})
    rc = s.wait(60)
    assert rc != 0
    out = s.output()
    assert "Scheduler hit an exception" in out
    assert "RuntimeError: Found no NVIDIA driver on your system" in out
    assert harness.wait_gone([p for p, _ in s.tree()])


def test_tp2_hicache_059(run, driver):
    need_available(RESERVE + 3e9)
    s = run("0.5.9", "--tp", "2", "--enable-hierarchical-cache", "--hicache-size", "1", "--max-total-tokens", "100000",
            env={"SGLANG_STANDIN_WARMUP_SECONDS": "2"})
    seen = s.wait_healthy()
    assert 503 in seen and seen[-1] == 200, seen
    assert titles(s) == ["sglang::detokenizer", "sglang::scheduler_TP0", "sglang::scheduler_TP1"]
    ranks = rank_pids(s)
    assert sorted(harness.pgrep("sglang::scheduler")) == sorted(ranks)
    expected = host_tokens(1, TINY_BPT_TP2, (0, 5, 9)) * TINY_BPT_TP2
    assert expected == 1000001536
    for pid in ranks:
        st = harness.proc_status(pid)
        assert expected <= st["RssAnon"] < expected + 64 * 2 ** 20, st
        fds = {os.readlink("/proc/%d/fd/%s" % (pid, fd)) for fd in os.listdir("/proc/%d/fd" % pid)}
        assert os.path.join(driver.dev, "nvidiactl") in fds and os.path.join(driver.dev, "nvidia-uvm") in fds
    gpus = {}
    for a in driver.allocs():
        gpus.setdefault(a["pid"], set()).add((a["gpu"], a["tag"]))
    assert gpus[ranks[0]] | gpus[ranks[1]] == {(g, t) for g in (0, 1) for t in ("context", "weights", "kv")}
    out = s.output()
    assert re.search(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d TP0\] Allocating 1\.00 GB host memory for hierarchical KV cache\.", out)
    assert re.search(r"\[[^\]]* TP1\] Allocating 1\.00 GB host memory for hierarchical KV cache\.", out)

    info = s.json("/server_info")
    assert info == s.json("/get_server_info")
    for k, v in {"hicache_size": 1, "hicache_ratio": 2.0, "tp_size": 2, "dp_size": 1, "pp_size": 1,
                 "enable_dp_attention": False, "nnodes": 1, "node_rank": 0, "enable_hierarchical_cache": True,
                 "max_total_tokens": 100000, "port": s.port, "version": "0.5.9",
                 "max_total_num_tokens": 100000}.items():
        assert info[k] == v, k
    assert s.json("/v1/models")["data"][0]["id"] == s.args[1]
    assert s.get("/metrics")[0] == 404

    t0 = time.time()
    assert s.terminate() == 0
    assert time.time() - t0 < 10
    assert harness.wait_gone(ranks, 5)
    time.sleep(0.5)
    assert not [a for a in driver.allocs() if a["pid"] in ranks]
    assert "releasing the host pool" in s.output()


def test_power_of_two_commit_054(run):
    need_available(RESERVE + 4.5 * GIB)
    s = run("0.5.4", "--enable-hierarchical-cache", "--hicache-size", "3", "--max-total-tokens", "100000")
    s.wait_healthy()
    assert titles(s) == ["sglang::detokenizer", "sglang::scheduler"]  # tp 1: no TP suffix, as SGLang
    requested = host_tokens(3, TINY_BPT_TP1, (0, 5, 4)) * TINY_BPT_TP1
    assert requested == 2999992320
    st = harness.proc_status(rank_pids(s)[0])
    assert 2 ** 32 <= st["RssShmem"] < 2 ** 32 + 16 * 2 ** 20, st  # next power of two: 4 GiB
    assert "Allocating 3.00 GB host memory for hierarchical KV cache." in s.output()
    assert s.get("/server_info")[0] == 404 and s.get("/get_server_info")[0] == 200  # /server_info from 0.5.6
    assert s.terminate() == 0


def test_shmem_metrics_api_key_0515(run):
    need_available(RESERVE + 3e9)
    s = run("0.5.15", "--tp", "2", "--enable-hierarchical-cache", "--hicache-size", "1", "--max-total-tokens", "100000",
            "--enable-metrics", "--api-key", "sekret")
    s.wait_healthy()
    expected = host_tokens(1, TINY_BPT_TP2, (0, 5, 15)) * TINY_BPT_TP2
    for pid in rank_pids(s):
        st = harness.proc_status(pid)
        assert expected <= st["RssShmem"] < expected + 16 * 2 ** 20, st
        assert st["RssAnon"] < 64 * 2 ** 20
    # add_api_key_middleware: /health* and /metrics are exempt, the rest needs the bearer token
    assert s.get("/health")[0] == 200 and s.get("/health_generate")[0] == 200
    code, body = s.get("/server_info")
    assert code == 401 and json.loads(body) == {"error": "Unauthorized"}
    assert s.get("/v1/models")[0] == 401
    info = s.json("/server_info", headers={"Authorization": "Bearer sekret"})
    assert info["api_key"] == "sekret" and info["hicache_mem_layout"] == "page_first"
    code, body = s.get("/metrics")
    text = body.decode()
    assert code == 200
    assert re.search(r'^sglang:max_total_num_tokens\{[^}]*tp_rank="0"[^}]*\} 100000\.0$', text, re.M), text
    host = host_tokens(1, TINY_BPT_TP2, (0, 5, 15))
    assert re.search(r"^sglang:hicache_host_total_tokens\{[^}]*\} %d\.0$" % host, text, re.M), text
    assert s.terminate() == 0


def test_metrics_without_hicache_tokens_before_0510(run):
    s = run("0.5.9", "--enable-metrics", "--max-total-tokens", "1000", "--enable-hierarchical-cache", "--hicache-ratio", "2")
    s.wait_healthy()
    text = s.get("/metrics")[1].decode()
    assert "sglang:max_total_num_tokens{" in text and "hicache_host_total_tokens" not in text
    assert s.terminate() == 0


def test_startup_check_rejects_oversized_059(run, driver):
    s = run("0.5.9", "--tp", "2", "--enable-hierarchical-cache", "--hicache-size", "1000")
    avail = harness.mem_available()
    rc = s.wait(60)
    assert rc != 0
    out = s.output()
    requested = host_tokens(1000, TINY_BPT_TP2, (0, 5, 9)) * TINY_BPT_TP2
    m = re.search(r"ValueError: Not enough host memory available\. Requesting (\d+\.\d\d) GB but only have "
                  r"(-?\d+\.\d\d) GB free\. Please reduce the size of the hierarchical cache\.", out)
    assert m, out
    assert m.group(1) == "%.2f" % (requested / 1e9)
    assert abs(float(m.group(2)) - (avail - RESERVE) / 1e9) < 2.0  # per rank against the whole host (<= 0.5.18)
    assert "Scheduler hit an exception" in out
    pids = [p for p, _ in s.tree()]
    assert harness.wait_gone(pids)
    time.sleep(0.5)
    assert not driver.allocs()


def test_assertion_until_0514_warning_from_0515(run):
    s = run("0.5.14", "--tp", "2", "--enable-hierarchical-cache", "--hicache-size", "1")
    assert s.wait(60) != 0
    assert ("AssertionError: The host memory should be larger than the device memory with the current protocol"
            in s.output())
    need_available(RESERVE + 3e9)
    s = run("0.5.15", "--tp", "2", "--enable-hierarchical-cache", "--hicache-size", "1")
    s.wait_healthy()
    host = host_tokens(1, TINY_BPT_TP2, (0, 5, 15))
    assert re.search(r"HiCache host KV pool \(%d tokens\) is smaller than the device pool \(\d+ tokens\);"
                     r"L2 cache effectiveness is reduced\. Consider increasing --hicache-ratio \(or --hicache-size\)"
                     % host, s.output())
    assert s.terminate() == 0


def test_check_divides_by_ranks_from_0519(run):
    budget = harness.mem_available() - RESERVE
    h = int(budget / 1e9 / 2)  # passes the <= 0.5.18 per-rank check, fails a quarter share
    if h < 2:
        pytest.skip("not enough MemAvailable on the node")
    s = run("0.5.19", "--tp", "4", "--enable-hierarchical-cache", "--hicache-size", str(h))
    assert s.wait(60) != 0
    m = re.search(r"Not enough host memory available\. Requesting [\d.]+ GB but only have ([\d.]+) GB free", s.output())
    assert m, s.output()
    assert abs(float(m.group(1)) - budget / 4 / 1e9) < 1.0


def _fake_cgroup(tmp_path, max_bytes, current):
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "memory.max").write_text("%d\n" % max_bytes)
    (root / "memory.high").write_text("max\n")
    (root / "memory.current").write_text("%d\n" % current)
    (root / "memory.stat").write_text("anon %d\nfile 0\nshmem 0\n" % current)
    return str(root)


def test_cgroup_bound_and_auto_size_0521(run, driver, tmp_path):
    cg = _fake_cgroup(tmp_path, 12 * GIB, 1 * GIB)  # headroom 11 GiB -> 1 GiB after the reserve
    env = {"SGLANG_STANDIN_CGROUP_ROOT": cg}
    s = run("0.5.21", "--tp", "2", "--enable-hierarchical-cache", "--hicache-size", "1", env=env)
    assert s.wait(60) != 0
    assert re.search(r"Requesting 1\.00 GB but only have %.2f GB free" % (GIB // 2 / 1e9), s.output()), s.output()
    # The refused server's ranks hold GPU memory until the driver reaps them (a rank may outlive the launcher by a
    # moment): the next server starts on free GPUs, as the fixture's teardown waits between tests.
    deadline = time.time() + 30
    while driver.allocs() and time.time() < deadline:
        time.sleep(0.2)
    assert not driver.allocs(), driver.allocs()
    # auto-size: neither size nor ratio -> ratio 2.0 reduced until the pools fit 0.8 x the budget
    s = run("0.5.21", "--tp", "2", "--enable-hierarchical-cache", "--max-total-tokens", "200000", env=env)
    s.wait_healthy()
    budget = int(GIB * 0.8) // 2
    ranks = s.json("/_standin/ranks")
    assert [r["hicache_host_tokens"] for r in ranks] == [budget // TINY_BPT_TP2] * 2
    assert s.json("/server_info")["hicache_host_memory_fraction"] == 0.8
    assert s.terminate() == 0
    # with room, the default ratio stands: 2 x device tokens, plus one page
    s = run("0.5.21", "--tp", "2", "--enable-hierarchical-cache", "--max-total-tokens", "1000")
    s.wait_healthy()
    assert [r["hicache_host_tokens"] for r in s.json("/_standin/ranks")] == [2001, 2001]
    assert s.terminate() == 0


def test_ignore_sigterm_fault_and_pdeathsig(run, driver):
    s = run("0.5.9", "--tp", "2")
    s.wait_healthy()
    tree = [p for p, _ in s.tree()]
    run.faults.write_text(json.dumps({"ignore_sigterm": True}))
    os.kill(s.pid, signal.SIGTERM)
    for pid in rank_pids(s):
        os.kill(pid, signal.SIGTERM)
    time.sleep(1.5)
    assert all(harness.alive(p) for p in tree)
    assert s.get("/health")[0] == 200
    run.faults.write_text("{}")
    os.kill(s.pid, signal.SIGKILL)  # SIGKILL still works; children die with their parent
    assert harness.wait_gone(tree, 10)
    time.sleep(0.6)
    assert not [a for a in driver.allocs() if a["pid"] in tree]


def test_rank_failure_kills_the_server(run, driver):
    grab = driver.request({"op": "alloc", "gpu": 1, "bytes": 40 * GIB, "tag": "other"})  # GPU 1 is full
    try:
        s = run("0.5.9", "--tp", "2")
        rc = s.wait(60)
        assert rc != 0
        out = s.output()
        assert "CUDA out of memory" in out and "Scheduler hit an exception" in out
        assert harness.wait_gone([p for p, _ in s.tree()])
        # The server has exited, but its rank on GPU 0 may still be dying with its allocations (the driver frees a
        # dead process's memory, as the fake driver's reaper does): the next test needs GPU 0 free again.
        deadline = time.time() + 30
        while [a for a in driver.allocs() if a["handle"] != grab["handle"]] and time.time() < deadline:
            time.sleep(0.2)
        assert not [a for a in driver.allocs() if a["handle"] != grab["handle"]]
    finally:
        driver.request({"op": "free", "handle": grab["handle"]})


def test_dp_controller_dead_rank_and_rss(run):
    s = run("0.5.9", "--dp", "2", "--tp", "2")
    s.wait_healthy()
    tree = s.tree()
    assert sorted(a for _, a in tree[1:]) == [
        "sglang::data_parallel_controller", "sglang::detokenizer", "sglang::scheduler_DP0_TP0",
        "sglang::scheduler_DP0_TP1", "sglang::scheduler_DP1_TP0", "sglang::scheduler_DP1_TP1"]
    ctrl = [p for p, a in tree if a == "sglang::data_parallel_controller"][0]
    for pid in rank_pids(s):
        assert harness.cmdline(int(open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[1])) \
            == "sglang::data_parallel_controller"
        assert harness.proc_status(pid)["VmRSS"] < 48 * 2 ** 20  # small per-rank overhead
    info = s.json("/server_info")
    assert info["dp_size"] == 2 and len(info["internal_states"]) == 2
    # a scheduler that dies after start-up: the server stays up, /health fails (as SGLang's timeout)
    os.kill(rank_pids(s)[-1], signal.SIGKILL)
    time.sleep(0.5)
    assert s.get("/health")[0] == 503
    assert harness.alive(s.pid) and harness.alive(ctrl)
    assert s.terminate() == 0


def test_dp_attention_and_multinode(run):
    s = run("0.5.9", "--dp", "2", "--tp", "2", "--enable-dp-attention")
    s.wait_healthy()
    assert titles(s) == ["sglang::data_parallel_controller", "sglang::detokenizer",
                         "sglang::scheduler_DP0_TP0", "sglang::scheduler_DP1_TP1"]
    assert s.terminate() == 0


def _free_port():
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _gone(server, timeout=30):
    try:
        return server.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def test_multinode_rendezvous_and_a_dead_peer(run):
    # Two "nodes" on this host (the same code path as two containers): node rank 1 first. Its schedulers wait in the
    # rendezvous (global rank 0's store on --dist-init-addr), so it answers nothing; node rank 0's front end answers
    # only once every rank joined (SGLang: the HTTP server starts after the schedulers report ready).
    dist = "127.0.0.1:%d" % _free_port()
    common = ("--tp", "4", "--nnodes", "2", "--dist-init-addr", dist)
    one = run("0.5.9", *common, "--node-rank", "1", "--base-gpu-id", "2")  # its own GPUs of the fake driver
    time.sleep(3)
    with pytest.raises((OSError, ConnectionError)):
        one.get("/health", timeout=2)
    assert titles(one) == ["sglang::scheduler_TP2", "sglang::scheduler_TP3"]  # no detokenizer on node rank 1
    zero = run("0.5.9", *common, "--node-rank", "0")
    assert zero.wait_healthy()[-1] == 200 and one.wait_healthy()[-1] == 200
    assert titles(zero) == ["sglang::detokenizer", "sglang::scheduler_TP0", "sglang::scheduler_TP1"]
    assert one.get("/health_generate")[0] == 200 and one.get("/ping")[0] == 200
    assert one.get("/server_info")[0] == 404 and zero.get("/server_info")[0] == 200
    # One rank of node 1 dies: the broadcast of the next scheduler loop fails on node 0 (Gloo), whose ranks SIGQUIT
    # their parent; then node 1's remaining rank loses node 0. Both servers go down: half a server is no server.
    os.kill(rank_pids(one)[-1], signal.SIGKILL)
    assert _gone(zero) is not None and _gone(one) is not None
    assert "Connection closed by peer" in zero.output() and "Scheduler hit an exception" in zero.output()
    assert "Connection closed by peer" in one.output()


def test_multinode_node_whose_ranks_all_died_ends_its_launcher(run):
    # Every scheduler of node rank 1 SIGKILLed at once (none can SIGQUIT its parent): the launcher joins them in
    # order, logs each end, then fails to bind the port its dummy health server holds, and exits 1 (engine.py
    # _launch_subprocesses and http_server.launch_server, 0.5.9); node rank 0 fails on its dead peer.
    dist = "127.0.0.1:%d" % _free_port()
    common = ("--tp", "4", "--nnodes", "2", "--dist-init-addr", dist)
    zero = run("0.5.9", *common, "--node-rank", "0")
    one = run("0.5.9", *common, "--node-rank", "1", "--base-gpu-id", "2")
    assert zero.wait_healthy()[-1] == 200 and one.wait_healthy()[-1] == 200
    ranks = rank_pids(one)
    for pid in ranks:
        os.kill(pid, signal.SIGKILL)
    assert _gone(one) == 1 and _gone(zero) is not None
    out = one.output()
    for pid in ranks:
        assert "Scheduler or DataParallelController %d terminated with -9" % pid in out
    assert "address already in use" in out
    assert "Connection closed by peer" in zero.output()


def test_multinode_rendezvous_times_out_as_torch_does(run):
    dist_port = _free_port()
    common = ("--tp", "4", "--nnodes", "2", "--dist-init-addr", "127.0.0.1:%d" % dist_port, "--dist-timeout", "2")
    alone = run("0.5.9", *common, "--node-rank", "1")
    assert _gone(alone) not in (None, 0)
    assert "The client socket has timed out after 2s while trying to connect to (127.0.0.1, %d)." % dist_port in alone.output()
    head = run("0.5.9", *common, "--node-rank", "0")
    assert _gone(head) not in (None, 0)
    # its own second rank joined; node 1's two never came
    assert "Timed out after 3 seconds waiting for clients. 2/4 clients joined." in head.output()
