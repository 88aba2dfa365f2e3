"""Build the SGLang stand-in's wheels, a PEP 503 simple index and tiny fake model directories.

    python3 tests/lab/sglang_standin/build_wheels.py --out /var/lib/inferops-lab/packages

Writes, without network or build backends (a wheel is a zip with METADATA, WHEEL and RECORD):

    OUT/sglang-<ver>-py3-none-any.whl         one per version in VERSIONS
    OUT/setproctitle-*.whl                     cp311/cp312/cp313 manylinux x86_64 (pip download, cached)
    OUT/simple/index.html, OUT/simple/<name>/index.html    PEP 503 index
    OUT/models/kimi-k2-tiny/, OUT/models/llama-3-70b-tiny/ config.json + model.safetensors.index.json

Both `pip install --no-index --find-links OUT sglang==0.5.9` and
`pip install --index-url file://OUT/simple sglang==0.5.9` work offline.  Idempotent: same inputs,
same bytes.
"""

import argparse
import base64
import glob
import hashlib
import html
import io
import json
import os
import re
import subprocess
import sys
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "src")

VERSIONS = [
    "0.5.2", "0.5.4", "0.5.5", "0.5.6", "0.5.9", "0.5.10", "0.5.12", "0.5.14",
    "0.5.15", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.23",
]
SETPROCTITLE = "setproctitle==1.3.8"
ZIP_DATE = (2025, 1, 1, 0, 0, 0)

# Tiny fake models: real geometry (sglang-hicache.md section 7), no weights; total_size drives the
# GPU memory a rank registers for its weight share.
MODELS = {
    "kimi-k2-tiny": {
        "config": {
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "kimi_k2",
            "num_hidden_layers": 61,
            "hidden_size": 7168,
            "num_attention_heads": 64,
            "num_key_value_heads": 64,
            "kv_lora_rank": 512,
            "q_lora_rank": 1536,
            "qk_rope_head_dim": 64,
            "qk_nope_head_dim": 128,
            "v_head_dim": 128,
            "n_routed_experts": 384,
            "num_experts_per_tok": 8,
            "max_position_embeddings": 131072,
            "vocab_size": 163840,
            "torch_dtype": "bfloat16",
        },
        # scaled down so that a rank's share fits a lab GPU: 8 x 16 GiB (the real checkpoint is ~1 TB)
        "total_size": 8 * 16 * 1024 ** 3,
    },
    "llama-3-70b-tiny": {
        "config": {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "num_hidden_layers": 80,
            "hidden_size": 8192,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "intermediate_size": 28672,
            "max_position_embeddings": 8192,
            "vocab_size": 128256,
            "rope_theta": 500000.0,
            "torch_dtype": "bfloat16",
        },
        "total_size": 141107412992,  # Llama-3-70B bf16
    },
}


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _source_files():
    out = []
    pkg = os.path.join(SRC, "sglang")
    for root, dirs, files in os.walk(pkg):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                full = os.path.join(root, name)
                out.append((os.path.relpath(full, SRC).replace(os.sep, "/"), full))
    return out


def build_wheel(version: str, out_dir: str, with_setproctitle: bool) -> str:
    dist_info = "sglang-%s.dist-info" % version
    files = []
    for arc, full in _source_files():
        with open(full, "rb") as f:
            files.append((arc, f.read()))
    meta = [
        "Metadata-Version: 2.1",
        "Name: sglang",
        "Version: %s" % version,
        "Summary: SGLang stand-in for the inferops lab (not SGLang): arguments, processes and host memory",
        "License: Apache-2.0",
        "Requires-Python: >=3.9",
    ]
    if with_setproctitle:
        meta.append("Requires-Dist: setproctitle")
    files.append((dist_info + "/METADATA", ("\n".join(meta) + "\n\n").encode()))
    files.append((dist_info + "/WHEEL", b"Wheel-Version: 1.0\nGenerator: inferops-lab build_wheels.py\n"
                                        b"Root-Is-Purelib: true\nTag: py3-none-any\n"))
    files.append((dist_info + "/top_level.txt", b"sglang\n"))
    if tuple(int(x) for x in version.split(".")) >= (0, 5, 9):
        files.append((dist_info + "/entry_points.txt", b"[console_scripts]\nsglang = sglang.cli.main:main\n"))
    record = "".join("%s,%s,%d\n" % (arc, _hash(data), len(data)) for arc, data in files)
    record += dist_info + "/RECORD,,\n"
    files.append((dist_info + "/RECORD", record.encode()))

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in files:
            info = zipfile.ZipInfo(arc, date_time=ZIP_DATE)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    path = os.path.join(out_dir, "sglang-%s-py3-none-any.whl" % version)
    _write_if_changed(path, buf.getvalue())
    return path


def _write_if_changed(path: str, data: bytes):
    try:
        with open(path, "rb") as f:
            if f.read() == data:
                return
    except OSError:
        pass
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def fetch_setproctitle(out_dir: str) -> bool:
    """pip download setproctitle's cp311, cp312 and cp313 manylinux x86_64 wheels into out_dir, once (3.11: Debian 12
    containers; 3.13: Debian 13, the lab's template; 3.12: the controller's)."""
    ok = True
    for py in ("311", "312", "313"):
        if glob.glob(os.path.join(out_dir, "setproctitle-*-cp%s-cp%s-*x86_64*.whl" % (py, py))):
            continue
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
               "--only-binary=:all:", "--no-deps", "--implementation", "cp", "--python-version", py[0] + "." + py[1:],
               "--abi", "cp" + py, "-d", out_dir]
        for plat in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_5_x86_64",
                     "manylinux1_x86_64"):
            cmd += ["--platform", plat]
        cmd.append(SETPROCTITLE)
        try:
            rc = subprocess.call(cmd, timeout=300)
        except (OSError, subprocess.TimeoutExpired):
            rc = 1
        if rc != 0:
            print("warning: could not download %s for cp%s" % (SETPROCTITLE, py), file=sys.stderr)
            ok = False
    return ok and bool(glob.glob(os.path.join(out_dir, "setproctitle-*.whl")))


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def write_index(out_dir: str):
    """PEP 503 simple index over the wheels in out_dir."""
    projects = {}
    for path in sorted(glob.glob(os.path.join(out_dir, "*.whl"))):
        fname = os.path.basename(path)
        projects.setdefault(_normalize(fname.split("-")[0]), []).append(path)
    simple = os.path.join(out_dir, "simple")
    os.makedirs(simple, exist_ok=True)
    root = ["<!DOCTYPE html>", "<html><head><title>Simple index</title></head><body>"]
    for name in sorted(projects):
        root.append('<a href="%s/">%s</a><br/>' % (name, name))
        page = ["<!DOCTYPE html>", "<html><head><title>Links for %s</title></head><body>" % name,
                "<h1>Links for %s</h1>" % name]
        for path in projects[name]:
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            fname = os.path.basename(path)
            page.append('<a href="../../%s#sha256=%s">%s</a><br/>' % (html.escape(fname), digest, html.escape(fname)))
        page.append("</body></html>")
        os.makedirs(os.path.join(simple, name), exist_ok=True)
        _write_if_changed(os.path.join(simple, name, "index.html"), ("\n".join(page) + "\n").encode())
    root.append("</body></html>")
    _write_if_changed(os.path.join(simple, "index.html"), ("\n".join(root) + "\n").encode())


def write_model(directory: str, config: dict, total_size: int):
    """A fake model directory: config.json and model.safetensors.index.json (no weights)."""
    os.makedirs(directory, exist_ok=True)
    _write_if_changed(os.path.join(directory, "config.json"), (json.dumps(config, indent=2, sort_keys=True) + "\n").encode())
    index = {"metadata": {"total_size": int(total_size)},
             "weight_map": {"model.embed_tokens.weight": "model-00001-of-00001.safetensors"}}
    _write_if_changed(os.path.join(directory, "model.safetensors.index.json"),
                      (json.dumps(index, indent=2, sort_keys=True) + "\n").encode())


def write_models(out_dir: str):
    for name, spec in MODELS.items():
        write_model(os.path.join(out_dir, "models", name), spec["config"], spec["total_size"])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="package folder (e.g. /var/lib/inferops-lab/packages)")
    p.add_argument("--versions", default=",".join(VERSIONS), help="comma-separated sglang versions")
    p.add_argument("--no-setproctitle", action="store_true",
                   help="do not download setproctitle nor declare it (titles then set via /proc/self/mem)")
    a = p.parse_args(argv)
    out = os.path.abspath(a.out)
    os.makedirs(out, exist_ok=True)
    with_spt = False
    if not a.no_setproctitle:
        with_spt = fetch_setproctitle(out)
        if not with_spt:
            print("warning: building sglang wheels without Requires-Dist: setproctitle", file=sys.stderr)
    for v in [x.strip() for x in a.versions.split(",") if x.strip()]:
        build_wheel(v, out, with_spt)
    write_index(out)
    write_models(out)
    print("wrote %d sglang wheels, index and models to %s" % (len(a.versions.split(",")), out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
