#!/usr/bin/env python3
"""JSON-lines front end to NVIDIA Dynamo's standalone KV indexer (ai-dynamo-runtime 1.6.1).

Run with the python of the venv made by setup_venv.sh:

    python dynamo_probe.py --block-size 32 --workers "1=tcp://127.0.0.1:5557,2=tcp://127.0.0.1:5558"
                           [--port 0] [--model-name default] [--threads 1]
                           [--ready-timeout 30] [--indexer-log FILE]

It starts `python -m dynamo.indexer` as a child process, waits for `GET /health` to answer 200,
prints one line `{"ready": true, "port": P, "pid": N, "startup_s": S}` on stdout, then reads one
JSON command per line on stdin and writes exactly one JSON line on stdout per command:

  {"op":"hash","tokens":[...],"block_size":B,"block_mm_infos":[null|{"mm_objects":[{"mm_hash":u64,"offsets":[[s,e]]}]}],
   "lora_name":null}                          -> {"hashes":[u64...]}
  {"op":"query","block_hashes":[...]}         -> {"scores":{"<worker>":tokens}, "scores_dp":{"<worker>":{"<dp>":tokens}},
                                                  "raw":<indexer response>}
  {"op":"query_tokens","token_ids":[...]}     -> same as query, through POST /query (indexer hashes the tokens)
  {"op":"metrics"}                            -> {"applied":{"stored/ok":n,...}, "warnings":{...}}
  {"op":"wait_applied","stored":n,"removed":n,"cleared":n,"timeout_s":10}
                                              -> {"ok":true,"applied":{...}} once the indexer counted at least
                                                 that many applied events with status ok (else {"error":...})
  {"op":"workers"} / {"op":"dump"}            -> the indexer's GET /workers, GET /dump
  {"op":"ping"}                               -> {"ok":true}
  {"op":"quit"}                               -> {"ok":true}, then the indexer is stopped and we exit 0

Every failure answers {"error":"..."} (and logs to stderr); the loop goes on. u64 hashes are turned
into the i64 two's-complement values /query_by_hash requires. EOF on stdin, SIGTERM and SIGINT
stop the indexer too. Scores are in tokens (matched blocks * block size), as the indexer reports them.
"""
import argparse
import atexit
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

U64 = 1 << 64
I64_MAX = (1 << 63) - 1

_child = None


def log(msg):
    print(f"[dynamo_probe] {msg}", file=sys.stderr, flush=True)


def to_i64(h):
    h = int(h)
    if h < -(1 << 63) or h >= U64:
        raise ValueError(f"hash {h} does not fit in 64 bits")
    return h - U64 if h > I64_MAX else h


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def stop_child():
    global _child
    p, _child = _child, None
    if p is None or p.poll() is not None:
        return
    try:
        os.killpg(p.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        p.wait(timeout=5)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(timeout=5)


class Indexer:
    def __init__(self, port, http_timeout):
        self.base = f"http://127.0.0.1:{port}"
        self.timeout = http_timeout

    def _req(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                raw = r.read()
                ctype = r.headers.get("content-type", "")
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"{method} {path} -> HTTP {e.code}: {e.read().decode(errors='replace')}")
        if "json" in ctype:
            return json.loads(raw)
        return raw.decode(errors="replace")

    def healthy(self):
        try:
            with urllib.request.urlopen(self.base + "/health", timeout=1) as r:
                return r.status == 200
        except Exception:
            return False

    def metrics(self):
        text = self._req("GET", "/metrics")
        applied, warnings = {}, {}
        for line in text.splitlines():
            m = re.match(r'dynamo_kvrouter_kv_cache_events_applied\{event_type="(\w+)",status="(\w+)"\} (\S+)', line)
            if m:
                applied[f"{m.group(1)}/{m.group(2)}"] = int(float(m.group(3)))
                continue
            m = re.match(r'dynamo_kvrouter_kv_cache_event_warnings\{warning_kind="(\w+)"\} (\S+)', line)
            if m:
                warnings[m.group(1)] = int(float(m.group(2)))
        return {"applied": applied, "warnings": warnings}


def normalise_scores(raw):
    scores, scores_dp = {}, {}
    for worker, ranks in (raw.get("scores") or {}).items():
        if isinstance(ranks, dict):
            scores_dp[str(worker)] = {str(k): int(v) for k, v in ranks.items()}
            scores[str(worker)] = max(int(v) for v in ranks.values()) if ranks else 0
        else:  # not seen with 1.6.1, kept for safety
            scores[str(worker)] = int(ranks)
            scores_dp[str(worker)] = {"0": int(ranks)}
    return {"scores": scores, "scores_dp": scores_dp, "raw": raw}


def handle(cmd, idx, args):
    from dynamo.llm import compute_block_hash_for_seq

    op = cmd.get("op")
    if op == "ping":
        return {"ok": True}
    if op == "hash":
        kw = {}
        if cmd.get("block_mm_infos") is not None:
            kw["block_mm_infos"] = cmd["block_mm_infos"]
        if cmd.get("lora_name") is not None:
            kw["lora_name"] = cmd["lora_name"]
        if cmd.get("cache_namespace") is not None:
            kw["cache_namespace"] = cmd["cache_namespace"]
        bs = int(cmd.get("block_size", args.block_size))
        return {"hashes": [int(h) for h in compute_block_hash_for_seq(list(cmd["tokens"]), bs, **kw)]}
    if op == "query":
        body = {"block_hashes": [to_i64(h) for h in cmd["block_hashes"]],
                "model_name": cmd.get("model_name", args.model_name)}
        if cmd.get("routing_group"):
            body["routing_group"] = cmd["routing_group"]
        return normalise_scores(idx._req("POST", "/query_by_hash", body))
    if op == "query_tokens":
        body = {"token_ids": list(cmd["token_ids"]), "model_name": cmd.get("model_name", args.model_name)}
        for k in ("lora_name", "routing_group"):
            if cmd.get(k) is not None:
                body[k] = cmd[k]
        return normalise_scores(idx._req("POST", "/query", body))
    if op == "metrics":
        return idx.metrics()
    if op == "wait_applied":
        want = {k: int(cmd.get(k, 0)) for k in ("stored", "removed", "cleared")}
        deadline = time.monotonic() + float(cmd.get("timeout_s", 10))
        while True:
            m = idx.metrics()
            have = {k: m["applied"].get(f"{k}/ok", 0) for k in want}
            if all(have[k] >= want[k] for k in want):
                return {"ok": True, **m}
            if time.monotonic() > deadline:
                return {"error": f"timeout waiting for applied events: want {want}, have {have}", **m}
            time.sleep(0.01)
    if op == "workers":
        return {"workers": idx._req("GET", "/workers")}
    if op == "dump":
        return {"dump": idx._req("GET", "/dump")}
    raise ValueError(f"unknown op {op!r}")


def main():
    global _child
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--block-size", type=int, required=True)
    ap.add_argument("--workers", required=True,
                    help='"worker_id[:dp_rank]=zmq_endpoint,..." e.g. "1=tcp://127.0.0.1:5557,1:1=tcp://127.0.0.1:5558"')
    ap.add_argument("--port", type=int, default=0, help="HTTP port of the indexer (0: pick a free one)")
    ap.add_argument("--model-name", default="default")
    ap.add_argument("--threads", type=int, default=None, help="indexer --threads (its default is 4)")
    ap.add_argument("--ready-timeout", type=float, default=30.0)
    ap.add_argument("--http-timeout", type=float, default=10.0)
    ap.add_argument("--indexer-log", default=None, help="file for the indexer's output (default: our stderr)")
    args = ap.parse_args()

    port = args.port or free_port()
    cmd = [sys.executable, "-m", "dynamo.indexer", "--block-size", str(args.block_size),
           "--port", str(port), "--workers", args.workers, "--model-name", args.model_name]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    out = open(args.indexer_log, "ab") if args.indexer_log else sys.stderr
    env = dict(os.environ)
    env.setdefault("DYN_SDK_DISABLE_ANSI_LOGGING", "1")  # plain-text logs
    t0 = time.monotonic()
    log("starting: " + " ".join(cmd))
    _child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env,
                              start_new_session=True)
    atexit.register(stop_child)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: sys.exit(1))

    idx = Indexer(port, args.http_timeout)
    while not idx.healthy():
        if _child.poll() is not None:
            log(f"indexer exited with code {_child.returncode} before becoming ready")
            print(json.dumps({"ready": False, "error": f"indexer exited with {_child.returncode}"}), flush=True)
            return 2
        if time.monotonic() - t0 > args.ready_timeout:
            log(f"indexer not ready after {args.ready_timeout}s")
            print(json.dumps({"ready": False, "error": "ready timeout"}), flush=True)
            return 2
        time.sleep(0.02)
    startup = time.monotonic() - t0
    log(f"indexer ready on port {port} after {startup:.3f}s")
    print(json.dumps({"ready": True, "port": port, "pid": _child.pid, "startup_s": round(startup, 3)}),
          flush=True)

    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            cmd = json.loads(line)
            if cmd.get("op") == "quit":
                print(json.dumps({"ok": True}), flush=True)
                break
            if _child.poll() is not None:
                raise RuntimeError(f"indexer died with code {_child.returncode}")
            resp = handle(cmd, idx, args)
        except Exception as e:  # answer and go on
            log(f"error on {line[:200]!r}: {type(e).__name__}: {e}")
            resp = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(resp), flush=True)
    stop_child()
    return 0


if __name__ == "__main__":
    sys.exit(main())
