"""The HTTP server (stdlib ThreadingHTTPServer in place of FastAPI/uvicorn).

Routes by version as in SGLang's entrypoints/http_server.py (sglang-hicache.md section 5.1).
"""

import json
import os
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sglang.srt import utils
from sglang.srt.server_args import public
from sglang.version import parse


class ServerState:
    def __init__(self, args, version, model, rank_infos):
        self.args = args
        self.version = version
        self.vt = parse(version)
        self.model = model
        self.ranks = rank_infos
        self.status = "Starting"  # ServerStatus.Starting -> Up; Exiting on SIGTERM
        self.created = int(time.time())
        first = rank_infos[0] if rank_infos else {}
        self.scheduler_info = {
            "status": "ready",
            "max_total_num_tokens": first.get("max_total_num_tokens", 0),
            "max_req_input_len": first.get("max_req_input_len", 0),
        }
        self.lock = threading.Lock()

    def ranks_alive(self) -> bool:
        from sglang.srt.utils import pid_alive

        return all(pid_alive(r["pid"]) for r in self.ranks)


def warmup(state: ServerState, log):
    """_wait_and_warmup: the server stays `Starting` (health 503) until the warm-up request is done."""
    if not state.args.get("skip_server_warmup"):
        time.sleep(utils.env_float("SGLANG_STANDIN_WARMUP_SECONDS", 1.0))
    if state.status == "Starting":
        state.status = "Up"
        log.info("The server is fired up and ready to roll!")


def _metrics_text(state: ServerState) -> str:
    name = state.args["served_model_name"]
    lines = []

    def gauge(metric, help_text, values):
        lines.append("# HELP sglang:%s %s" % (metric, help_text))
        lines.append("# TYPE sglang:%s gauge" % metric)
        for labels, value in values:
            lab = ",".join('%s="%s"' % kv for kv in labels.items())
            lines.append("sglang:%s{%s} %s" % (metric, lab, float(value)))

    # like SGLang without --enable-metrics-for-all-schedulers: attention-TP rank 0 of each group reports
    reporting = [r for r in state.ranks if r["tp_rank"] % max(1, _attn_tp(state.args)) == 0] or state.ranks[:1]

    def labels(r):
        d = {"model_name": name, "engine_type": "unified", "tp_rank": str(r["tp_rank"]), "pp_rank": str(r["pp_rank"])}
        if r.get("dp_rank") is not None:
            d["dp_rank"] = str(r["dp_rank"])
        return d

    gauge("max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.",
          [(labels(r), r["max_total_num_tokens"]) for r in reporting])
    gauge("num_running_reqs", "The number of running requests.", [(labels(r), 0) for r in reporting])
    gauge("num_used_tokens", "The number of used tokens.", [(labels(r), 0) for r in reporting])
    gauge("token_usage", "The token usage.", [(labels(r), 0) for r in reporting])
    gauge("cache_hit_rate", "The prefix cache hit rate.", [(labels(r), 0) for r in reporting])
    gauge("num_queue_reqs", "The number of requests in the waiting queue.", [(labels(r), 0) for r in reporting])
    if state.args["enable_hierarchical_cache"] and state.vt >= (0, 5, 10):
        gauge("hicache_host_total_tokens", "Total capacity of the HiCache host KV pool in tokens.",
              [(labels(r), r["hicache_host_tokens"]) for r in reporting])
        gauge("hicache_host_used_tokens", "Used tokens in the HiCache host KV pool.",
              [(labels(r), 0) for r in reporting])
    return "\n".join(lines) + "\n"


def _attn_tp(args):
    from sglang.srt.server_args import attn_tp_size

    return attn_tp_size(args)


def make_handler(state: ServerState, dummy: bool):
    args = state.args
    api_key = args.get("api_key")
    vt = state.vt
    access_log = utils.Logger("", args.get("log_level_http") or args.get("log_level", "info"))

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "uvicorn"
        sys_version = ""

        def log_message(self, fmt, *a):  # uvicorn's access log format
            pass

        def _send(self, code, body=b"", ctype="application/json"):
            if isinstance(body, (dict, list)):
                body = json.dumps(body).encode()
            elif isinstance(body, str):
                body = body.encode()
            self.send_response(code)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            if access_log.level <= 20:
                try:
                    sys.stderr.write('INFO:     %s:%d - "%s %s HTTP/1.1" %d\n'
                                     % (self.client_address[0], self.client_address[1], self.command, self.path, code))
                except (OSError, ValueError, IndexError, TypeError):
                    pass

        def _body(self):
            n = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(n) if n else b""
            try:
                return json.loads(raw) if raw else {}
            except ValueError:
                return {}

        def _health(self):
            if state.status != "Up":
                return self._send(503, b"")
            if not state.ranks_alive():
                # a dead scheduler never answers the health request: 503 after the timeout
                time.sleep(utils.env_float("SGLANG_HEALTH_CHECK_TIMEOUT", 20))
                return self._send(503, b"")
            return self._send(200, b"")

        def _route(self, method):
            path = self.path.split("?", 1)[0]
            if dummy:
                # launch_dummy_health_check_server (node ranks >= 1)
                if path in ("/health", "/health_generate", "/ping"):
                    return self._send(200, b"")
                if path == "/metrics" and args["enable_metrics"]:
                    return self._send(200, _metrics_text(state), "text/plain; version=0.0.4; charset=utf-8")
                return self._send(404, {"detail": "Not Found"})
            # add_api_key_middleware: /health* and /metrics are exempt
            if api_key and method != "OPTIONS" and not path.startswith("/health") and not path.startswith("/metrics"):
                if self.headers.get("Authorization") != "Bearer " + api_key:
                    return self._send(401, {"error": "Unauthorized"})
            if path == "/health" and vt >= (0, 5, 6) and \
                    os.environ.get("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "true").lower() in ("0", "false", "no"):
                return self._send(200, b"")  # plain 200 (section 5.1)
            if path in ("/health", "/health_generate"):
                return self._health()
            if path == "/ready" and vt >= (0, 5, 23):
                return self._send(200 if state.status == "Up" else 503, b"")
            if path == "/metrics" and args["enable_metrics"]:
                return self._send(200, _metrics_text(state), "text/plain; version=0.0.4; charset=utf-8")
            if path == "/get_server_info" or (path == "/server_info" and vt >= (0, 5, 6)):
                return self._send(200, self.server_info())
            if path == "/get_model_info" or (path == "/model_info" and vt >= (0, 5, 6)):
                return self._send(200, self.model_info())
            if path == "/v1/models":
                return self._send(200, {"object": "list", "data": [self.model_card()]})
            if path.startswith("/v1/models/"):
                if path[len("/v1/models/"):] == args["served_model_name"]:
                    return self._send(200, self.model_card())
                return self._send(404, {"detail": "Not Found"})
            if path == "/get_load":
                return self._send(200, [{"dp_rank": d, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}
                                        for d in range(args["dp_size"])])
            if path == "/flush_cache" and method in ("POST", "GET"):
                return self._send(200, "Cache flushed.\nPlease check backend logs for more details. "
                                       "(When there are running or waiting requests, the operation will not be performed.)\n",
                                  "text/plain")
            if path == "/generate" and method in ("POST", "PUT"):
                return self._send(200, {"text": "", "output_ids": [], "meta_info": {
                    "id": "standin", "finish_reason": {"type": "length", "length": 0},
                    "prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0}})
            if path in ("/v1/completions", "/v1/chat/completions") and method == "POST":
                req = self._body()
                chat = path.endswith("chat/completions")
                choice = {"index": 0, "finish_reason": "length"}
                if chat:
                    choice["message"] = {"role": "assistant", "content": ""}
                else:
                    choice["text"] = ""
                return self._send(200, {"id": "standin", "object": "chat.completion" if chat else "text_completion",
                                        "created": int(time.time()), "model": req.get("model", args["served_model_name"]),
                                        "choices": [choice],
                                        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}})
            if path == "/_standin/ranks":  # lab-only: per-rank facts (not in SGLang)
                return self._send(200, state.ranks)
            return self._send(404, {"detail": "Not Found"})

        def server_info(self):
            return {
                **public(args),
                **state.scheduler_info,
                "internal_states": [
                    {
                        "last_gen_throughput": 0.0,
                        "memory_usage": {
                            "weight": round(state.model.weights_bytes / max(1, args["tp_size"] * args["pp_size"]) / 2 ** 30, 2),
                            "kvcache": round(state.scheduler_info["max_total_num_tokens"] * state.ranks[0]["bytes_per_token"] / 2 ** 30, 2),
                            "token_capacity": state.scheduler_info["max_total_num_tokens"],
                        },
                    }
                    for _ in range(args["dp_size"])
                ],
                "version": state.version,
            }

        def model_info(self):
            info = {
                "model_path": args["model_path"],
                "tokenizer_path": args["tokenizer_path"],
                "is_generation": True,
            }
            if vt >= (0, 5, 6):
                info.update({"preferred_sampling_params": None, "weight_version": "default",
                             "has_image_understanding": False, "has_audio_understanding": False,
                             "model_type": state.model.model_type, "architectures": state.model.architectures})
            return info

        def model_card(self):
            name = args["served_model_name"]
            return {"id": name, "object": "model", "created": state.created, "owned_by": "sglang", "root": name,
                    "parent": None, "max_model_len": args.get("context_length") or state.model.context_len}

        def do_GET(self):
            self._route("GET")

        def do_POST(self):
            self._route("POST")

        def do_PUT(self):
            self._route("PUT")

        def do_HEAD(self):
            self._route("HEAD")

        def do_OPTIONS(self):
            self._route("OPTIONS")

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class _Server6(_Server):
    address_family = socket.AF_INET6


def make_server(state: ServerState, dummy: bool = False):
    host = state.args["host"]
    cls = _Server6 if ":" in host else _Server
    return cls((host, state.args["port"]), make_handler(state, dummy))
