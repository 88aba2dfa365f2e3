"""torch.distributed as SGLang's scheduler processes meet it when a server spans several nodes (--nnodes > 1).

SGLang 0.5.9 `model_executor/model_runner.py` `init_torch_distributed` (right after the rank's CUDA device is set,
before the weights): `init_distributed_environment(world_size=tp_size * pp_size, rank=tp_size * pp_rank + tp_rank,
distributed_init_method="tcp://<--dist-init-addr>", timeout=--dist-timeout)`; without --dist-init-addr it is
`tcp://127.0.0.1:<nccl_port>`, a free local port (`PortArgs.init_new`), so ranks on other nodes never meet.
torch's TCP rendezvous: global rank 0 runs the store's server on that port (listening on every local address);
every other rank connects to it, retrying until the timeout; start-up goes on only when all world_size ranks joined.
Without --dist-timeout the NCCL backend's default applies, `default_pg_nccl_timeout` = 10 min
(torch/distributed/constants.py). Errors as torch words them (pytorch/pytorch PR #111805 and the reports it made
common: "Timed out after 601 seconds waiting for clients. 1/2 clients joined."; "The client socket has timed out
after 1800s while trying to connect to (127.0.0.1, 48391).").

After start-up every scheduler loop broadcasts its requests over the TP group's CPU (Gloo) group
(`Scheduler.recv_requests` -> `broadcast_pyobj`), idle or not; a peer that died makes that broadcast raise
"[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [addr]:port", the scheduler logs
"Scheduler hit an exception" and SIGQUITs its parent, which kills its process tree (sgl-project/sglang#3685, #7458).
So one node's ranks dying fails the server on every node.

Deviation: the stand-in's links form a star around global rank 0 (Gloo pairs every two ranks), so a rank on node B
learns of a dead rank on node B or C through rank 0's failure rather than directly; the end state is the same, every
node's server down.
"""

import select
import socket
import time

# torch/distributed/constants.py default_pg_nccl_timeout (init_process_group with timeout None, backend nccl)
DEFAULT_TIMEOUT_S = 600
_TICK = b"."


class DistError(RuntimeError):
    pass


class Stopped(Exception):
    """SIGTERM reached the scheduler while it waited for the other ranks: a graceful stop, not a failure."""


def _addr(args: dict):
    text = args.get("dist_init_addr")
    if not text:
        # PortArgs.init_new: nccl_port = get_free_port(), used as tcp://127.0.0.1:<nccl_port>
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        return "127.0.0.1", port
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


class World:
    """One scheduler's place in the world of tp_size x pp_size ranks (only when nnodes > 1)."""

    def __init__(self, args: dict, rank: dict, log, stopped):
        self.size = args["tp_size"] * args["pp_size"]
        self.rank = args["tp_size"] * rank["pp_rank"] + rank["tp_rank"]
        self.host, self.port = _addr(args)
        self.timeout_s = int(args.get("dist_timeout") or DEFAULT_TIMEOUT_S)
        self.log = log
        self.stopped = stopped  # () -> bool: SIGTERM during the wait
        self.server = None
        self.peers = []  # [(socket, (addr, port))]

    # -- rendezvous -------------------------------------------------------------------------------
    def join(self):
        self.log.info("init_distributed_environment world_size=%d rank=%d distributed_init_method=tcp://%s:%d"
                      % (self.size, self.rank, self.host, self.port))
        start = time.time()
        if self.rank == 0:
            self._serve(start)
        else:
            self._connect(start)

    def _serve(self, start):
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            srv.bind(("0.0.0.0", self.port))
        except OSError:
            srv.close()
            raise DistError("The server socket has failed to listen on any local network address. port: %d, useIpv6: 0, "
                            "code: -98, name: EADDRINUSE, message: address already in use" % self.port)
        srv.listen(64)
        self.server = srv
        joined = {}
        while len(joined) < self.size - 1:
            if self.stopped():
                raise Stopped()
            waited = time.time() - start
            if waited > self.timeout_s:
                raise DistError("Timed out after %d seconds waiting for clients. %d/%d clients joined."
                                % (self.timeout_s + 1, len(joined) + 1, self.size))
            # TCPStore::waitForWorkers polls its count every 10 ms: the timeout is seen when it falls, not a tick later
            ready, _, _ = select.select([srv], [], [], min(0.2, max(0.01, self.timeout_s - waited)))
            if not ready:
                continue
            conn, peer = srv.accept()
            conn.settimeout(5)
            try:
                line = conn.makefile("rb").readline()
                joined[int(line.strip())] = (conn, peer)
            except (OSError, ValueError):
                conn.close()
        for conn, _peer in joined.values():
            conn.sendall(b"go\n")
            conn.settimeout(None)
        self.peers = list(joined.values())

    def _connect(self, start):
        while True:
            if self.stopped():
                raise Stopped()
            if time.time() - start > self.timeout_s:
                raise DistError("The client socket has timed out after %ds while trying to connect to (%s, %d)."
                                % (self.timeout_s, self.host, self.port))
            try:
                conn = socket.create_connection((self.host, self.port), timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        conn.sendall(b"%d\n" % self.rank)
        # Only the store's server waits for the workers (TCPStore::waitForWorkers, `if (server_)`); a client's
        # later waits are store operations, each with the timeout counted from when it begins, so after the
        # connection. So global rank 0, whose clock started before any client could connect, times out first.
        start = time.time()
        conn.settimeout(0.2)
        buf = b""
        while not buf.endswith(b"\n"):
            if self.stopped():
                raise Stopped()
            if time.time() - start > self.timeout_s:
                raise DistError("Timed out after %d seconds waiting for the other ranks (store %s:%d)"
                                % (self.timeout_s + 1, self.host, self.port))
            try:
                chunk = conn.recv(16)
            except socket.timeout:
                continue
            if not chunk:
                raise DistError("Connection closed by peer [%s]:%d" % (self.host, self.port))
            buf += chunk
        conn.settimeout(None)
        self.peers = [(conn, (self.host, self.port))]

    # -- after start-up: the scheduler loop's broadcast ------------------------------------------------
    def check(self):
        """Called once per idle loop (SGLang broadcasts every iteration): rank 0 sends, the others read; a peer
        whose socket closed raises as Gloo does."""
        for conn, peer in self.peers:
            try:
                if self.rank == 0:
                    conn.sendall(_TICK)
                ready, _, _ = select.select([conn], [], [], 0)
                if ready and not conn.recv(4096):
                    raise OSError("closed")
            except OSError:
                raise DistError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [%s]:%d"
                                % (peer[0], peer[1])) from None

    def close(self):
        for conn, _peer in self.peers:
            try:
                conn.close()
            except OSError:
                pass
        self.peers = []
        if self.server is not None:
            self.server.close()
            self.server = None
