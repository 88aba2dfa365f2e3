"""One scheduler process per GPU rank (run_scheduler_process).

    python3 -m sglang.srt.managers.scheduler '<json config>' <ready fd>

Order as in SGLang's Scheduler init (sglang-hicache.md section 2.6): CUDA context on the rank's GPU
-> weights -> device KV pool (mem_fraction_static) -> HiCache host pool (checked, then allocated and
committed).  Then it reports ready on the pipe and idles until SIGTERM (graceful: frees the host pool
and the GPU allocations, exits 0) or SIGKILL.  On an exception it logs "Scheduler hit an exception"
and sends SIGQUIT to its parent, as SGLang does.
"""

import json
import os
import signal
import sys
import time
import traceback

from sglang.srt import utils


class Rank:
    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.args = cfg["server_args"]
        self.rank = cfg["rank"]
        self.version = tuple(cfg["version_tuple"])
        self.log = utils.Logger(self.rank["prefix"], self.args.get("log_level", "info"))
        self.device = None
        self.host_pool = None
        self.world = None
        self.stop = False

    # -- signals -------------------------------------------------------------------------------
    def on_sigterm(self, signum, frame):
        faults = utils.read_faults() if signum == signal.SIGTERM else {}
        if faults.get("ignore_sigterm"):
            self.log.warning("SIGTERM ignored (lab fault ignore_sigterm)")
            return
        stuck = faults.get("read_on_sigterm")
        if isinstance(stuck, str) and stuck:
            # Lab fault stuck-on-stop: a read the FUSE server never answers. It waits; a SIGKILL then leaves this
            # rank in D state (fuse request_wait_answer), its GPU memory held, until the connection is aborted.
            self.log.warning("reading %s on SIGTERM (lab fault stuck-on-stop)" % stuck)
            with open(stuck, "rb") as f:
                f.read(1)
        self.stop = True

    # -- init --------------------------------------------------------------------------------
    def init(self):
        from sglang.srt.cuda import Device
        from sglang.srt.model_config import ModelConfig, pp_layers
        from sglang.srt.server_args import attn_tp_size

        a = self.args
        if self.rank["pp_rank"] >= a["pp_size"]:
            # The launcher's PP range passed the last stage (pp_size does not divide nnodes): the rank
            # is outside the world and SGLang's scheduler fails at distributed init, before any pool.
            raise RuntimeError(
                "pp_rank %d is not a stage of pp_size %d: rank %d is outside world_size %d (unsourced text)"
                % (self.rank["pp_rank"], a["pp_size"], self.rank["pp_rank"] * a["tp_size"] + self.rank["tp_rank"], a["tp_size"] * a["pp_size"])
            )
        mc = ModelConfig(a["model_path"])
        self.device = dev = Device(self.rank["gpu_id"])
        ctx_mib = utils.env_float("SGLANG_STANDIN_CUDA_CONTEXT_MIB", 512)
        if ctx_mib > 0:
            dev.alloc(int(ctx_mib * 1024 * 1024), "context")
        if a.get("nnodes", 1) > 1:
            # ModelRunner.init_torch_distributed: the rendezvous of all tp x pp ranks, before the weights
            # (sglang.srt.distributed, the stand-in's, says what is simulated and its sources)
            from sglang.srt.distributed import World

            self.world = World(a, self.rank, self.log, lambda: self.stop)
            self.world.join()
        avail = dev.free_bytes()
        self.log.info("Load weight begin. avail mem=%.2f GB" % (avail / 2 ** 30))
        load_s = utils.env_float("SGLANG_STANDIN_LOAD_SECONDS", 0)
        if load_s > 0:
            time.sleep(load_s)
        weights = mc.weights_bytes // max(1, a["tp_size"] * a["pp_size"])
        if weights > 0:
            dev.alloc(weights, "weights")
        after = dev.free_bytes()
        self.log.info(
            "Load weight end. type=%s, dtype=%s, avail mem=%.2f GB, mem usage=%.2f GB."
            % ((mc.architectures or ["?"])[0], mc.dtype, after / 2 ** 30, weights / 2 ** 30)
        )

        layers = pp_layers(mc.num_layers, self.rank["pp_rank"], a["pp_size"])
        attn_tp = attn_tp_size(a)
        bpt = mc.bytes_per_token(layers, attn_tp, a["kv_cache_dtype"])
        # ModelRunner.profile_max_num_token: rest = available - total * (1 - mem_fraction_static)
        rest = after - dev.total_bytes * (1 - a["mem_fraction_static"])
        max_tokens = int(rest // bpt) if rest > 0 else 0
        if a.get("max_total_tokens"):
            max_tokens = min(max_tokens, a["max_total_tokens"])
        page = a["page_size"]
        max_tokens = max_tokens // page * page
        if max_tokens <= 0:
            raise RuntimeError("Not enough memory. Please try to increase --mem-fraction-static.")
        dev.alloc(max_tokens * bpt, "kv")
        self.max_total_num_tokens = max_tokens
        self.log.info(
            "KV Cache is allocated. #tokens: %d, KV size: %.2f GB" % (max_tokens, max_tokens * bpt / 2 ** 30)
        )
        self.log.info("Memory pool end. avail mem=%.2f GB" % (dev.free_bytes() / 2 ** 30))

        self.host_tokens = 0
        self.host_bytes = 0
        if a["enable_hierarchical_cache"]:
            self.init_host_pool(mc, a, bpt, max_tokens, attn_tp)

        self.max_req_input_len = max(min(a.get("context_length") or mc.context_len, max_tokens) - 1, 1)
        self.bpt = bpt

    def init_host_pool(self, mc, a, bpt, device_tokens, attn_tp):
        from sglang.srt.mem_cache.memory_pool_host import HostKVCache, host_pool_tokens
        from sglang.srt.model_config import pp_layers
        from sglang.srt.server_args import ranks_per_host

        v = self.version
        rph = ranks_per_host(a)
        override = None
        if v >= (0, 5, 21) and a.get("hicache_host_memory_fraction") is not None and a["hicache_size"] <= 0:
            # auto-size (PR #40135): the default ratio is reduced until the pools of all ranks fit
            try:
                headroom = utils.cgroup_headroom()
            except utils.CgroupDiscoveryError:
                raise RuntimeError(
                    "Cannot automatically size HiCache host memory; set --hicache-size explicitly (GB per rank), "
                    "leaving room for other memory use within the container limit."
                )
            avail = utils.mem_available()
            if headroom is not None:
                avail = min(avail, headroom)
            budget = int((avail - utils.HICACHE_HOST_MEMORY_RESERVE_BYTES) * a["hicache_host_memory_fraction"]) // rph
            tokens = host_pool_tokens(0, a["hicache_ratio"], device_tokens, bpt, a["page_size"], v)
            if tokens * bpt > budget:
                tokens = max(budget // bpt, 0) // a["page_size"] * a["page_size"]
                self.log.info(
                    "HiCache host pool auto-sized to %d tokens (ratio %.3f) to fit %.2f GB per rank."
                    % (tokens, tokens / max(device_tokens, 1), budget / 1e9)
                )
            override = tokens
        elif v >= (0, 5, 15) and a["pp_size"] > 1 and a["hicache_size"] > 0:
            # sync_fixed_hicache_size: MIN token capacity across the PP group
            tokens = []
            for pp_rank in range(a["pp_size"]):
                stage_bpt = mc.bytes_per_token(pp_layers(mc.num_layers, pp_rank, a["pp_size"]), attn_tp, a["kv_cache_dtype"])
                tokens.append(host_pool_tokens(a["hicache_size"], a["hicache_ratio"], device_tokens, stage_bpt, a["page_size"], v))
            override = min(tokens)
        self.host_pool = HostKVCache(a, v, bpt, device_tokens, rph, self.log, size_override_tokens=override)
        self.host_tokens = self.host_pool.size
        self.host_bytes = self.host_pool.committed_bytes

    def teardown(self):
        delay = utils.env_float("SGLANG_STANDIN_TEARDOWN_SECONDS", 0)
        if delay > 0:
            time.sleep(delay)
        if self.host_pool is not None:
            self.host_pool.destroy()
            self.host_pool = None
        if self.device is not None:
            self.device.close()
            self.device = None
        if self.world is not None:
            self.world.close()
            self.world = None


def main(argv):
    cfg = json.loads(argv[0])
    ready_fd = int(argv[1])
    r = Rank(cfg)
    utils.kill_itself_when_parent_died()
    utils.setproctitle(r.rank["title"])
    signal.signal(signal.SIGTERM, r.on_sigterm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the main process, as in SGLang
    parent = os.getppid()
    from sglang.srt.distributed import Stopped

    def failed():
        r.log.error("Scheduler hit an exception: %s" % traceback.format_exc())
        try:
            r.teardown()
        except Exception:
            pass
        try:
            os.kill(parent, signal.SIGQUIT)
        except OSError:
            pass
        return 1

    try:
        r.init()
    except Stopped:
        r.teardown()
        return 0
    except BaseException:
        return failed()
    info = {
        "status": "ready",
        "pid": os.getpid(),
        "max_total_num_tokens": r.max_total_num_tokens,
        "max_req_input_len": r.max_req_input_len,
        "tp_rank": r.rank["tp_rank"],
        "pp_rank": r.rank["pp_rank"],
        "dp_rank": r.rank["dp_rank"],
        "gpu_index": r.device.index,
        "bytes_per_token": r.bpt,
        "hicache_host_tokens": r.host_tokens,
        "hicache_host_bytes": r.host_bytes,
    }
    try:
        os.write(ready_fd, (json.dumps(info) + "\n").encode())
        os.close(ready_fd)
    except OSError:
        pass
    while not r.stop:
        time.sleep(0.2)
        if os.getppid() != parent:  # belt and braces next to PDEATHSIG
            break
        if r.world is not None and not r.stop:
            try:
                r.world.check()  # Scheduler.recv_requests' broadcast over the TP group, every loop
            except Exception:
                return failed()
    r.log.info("Scheduler received SIGTERM; releasing the host pool and GPU memory.")
    r.teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
