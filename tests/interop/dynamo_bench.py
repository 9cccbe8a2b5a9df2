#!/usr/bin/env python3
"""Benchmark of NVIDIA Dynamo's KV router core (ai-dynamo-runtime 1.6.1) through its Python API.

Run with the python of the venv made by setup_venv.sh. Prints ONE JSON object on stdout
(progress goes to stderr).

Workload (default: synthetic, from --seed): --sequences sequences of --seq-tokens random token ids
(u32 < 152000), in blocks of --block-size, spread round-robin over --workers workers. Each
sequence is stored as a chain of BlockStored events of --blocks-per-event blocks, parent linked.
Engine block hashes are content-addressed and identical across workers, as Dynamo requires:
    h_i = XXH3_64(h_{i-1} as u64 LE ++ token ids as u32 LE, seed 0), h_{-1} = 0
Each event travels alone in one vLLM-style payload msgpack [ts, [event], 0].

--events-file FILE replays a file instead: concatenated msgpack objects, each either
    {"worker_id": int, "payload": bin}   (payload = the 3rd ZMQ frame: msgpack [ts, events, dp_rank])
or a bare payload array [ts, events, dp_rank] (attributed to --file-worker).
Map events ({"type": ...}) and positional arrays (["BlockStored", ...]) are both accepted.
--write-events FILE writes the synthetic workload in the first form, so another implementation
can replay the very same events.

Measured (one thread, wall clock, time.perf_counter_ns):
  convert      vLLM event -> Dynamo KvCacheEvent JSON bytes, including the router's per-block
               key (compute_block_hash_for_seq on the event's token_ids): what Dynamo's listener
               does before applying. Reported separately, not part of apply.
  apply        RadixTree.apply_event(worker_id, json_bytes) for every stored event, then one
               find_matches as a barrier (the tree runs on its own thread). Also as CPU time of
               the whole process (time.process_time: every thread, so the tree's thread too),
               for a per-core figure: stored_blocks_per_cpu_s.
  hash         compute_block_hash_for_seq(<--request-tokens> tokens, block_size), p50/p99 in us.
  lookup       RadixTree.find_matches(keys) with --lookup-keys keys: the router keys of one stored
               sequence (all of them hit) followed by unseen keys up to --lookup-keys. p50/p99 in us.
  remove       (with --removals) RadixTree.apply_event of one BlockRemoved per stored event.
  warm         (with --removals) apply again, into the tree the removals emptied.
  With --repeats N, apply, remove and warm are each timed N times (apply into a new tree
  each time): the best wall time and the mean CPU time are reported.
  zmq          (with --zmq) the same payloads through the standalone indexer: one bound PUB per
               worker, `python -m dynamo.indexer` subscribed, time from first send until its
               /metrics count all stored events as applied.
"""
import argparse
import json
import os
import random
import re
import socket
import statistics
import struct
import subprocess
import sys
import time
import urllib.request

import msgpack
import xxhash
from dynamo.llm import RadixTree, compute_block_hash_for_seq

U64_MASK = (1 << 64) - 1


def log(msg):
    print(f"[dynamo_bench] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- workload


def engine_hash(parent, tokens):
    return xxhash.xxh3_64_intdigest(struct.pack("<Q", parent & U64_MASK) +
                                    struct.pack(f"<{len(tokens)}I", *tokens), seed=0)


def synth(args):
    rng = random.Random(args.seed)
    B = args.block_size
    nblocks = args.seq_tokens // B
    records, seqs = [], []
    for s in range(args.sequences):
        worker = 1 + s % args.workers
        toks = [rng.randrange(152000) for _ in range(nblocks * B)]
        seqs.append((worker, toks))
        parent = None
        prev = 0
        for b0 in range(0, nblocks, args.blocks_per_event):
            b1 = min(nblocks, b0 + args.blocks_per_event)
            hashes = []
            for b in range(b0, b1):
                prev = engine_hash(prev, toks[b * B:(b + 1) * B])
                hashes.append(prev)
            ev = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
                  "token_ids": toks[b0 * B:b1 * B], "block_size": B, "lora_id": None,
                  "medium": "GPU", "lora_name": None}
            records.append((worker, msgpack.packb([time.time(), [ev], 0])))
            parent = hashes[-1]
    return records, seqs


def read_events_file(path, default_worker):
    records = []
    with open(path, "rb") as f:
        for obj in msgpack.Unpacker(f, raw=False, strict_map_key=False):
            if isinstance(obj, dict):
                records.append((int(obj["worker_id"]), bytes(obj["payload"])))
            else:
                records.append((default_worker, msgpack.packb(obj)))
    return records


def write_events_file(path, records):
    with open(path, "wb") as f:
        for worker, payload in records:
            f.write(msgpack.packb({"worker_id": worker, "payload": payload}, use_bin_type=True))


# ---------------------------------------------------------------- vLLM -> Dynamo JSON

POSITIONAL = {
    "BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                    "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
                    "kv_cache_spec_sliding_window"],
    "BlockRemoved": ["block_hashes", "medium", "group_idx"],
    "AllBlocksCleared": [],
}


def as_map(ev):
    if isinstance(ev, dict):
        return ev
    kind = ev[0]
    return {"type": kind, **dict(zip(POSITIONAL.get(kind, []), ev[1:]))}


class Converter:
    def __init__(self, block_size):
        self.B = block_size
        self.next_id = 0

    def convert(self, payload):
        """-> list of (kind, json_bytes, nblocks) for one payload."""
        _ts, events, dp_rank = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        out = []
        for ev in map(as_map, events):
            kind = ev["type"]
            if ev.get("medium") not in (None, "GPU"):
                continue
            if kind == "BlockStored":
                kw = {}
                if ev.get("block_mm_infos") is not None:
                    kw["block_mm_infos"] = ev["block_mm_infos"]
                if ev.get("lora_name"):
                    kw["lora_name"] = ev["lora_name"]
                keys = compute_block_hash_for_seq(ev["token_ids"], self.B, **kw)
                blocks = [{"block_hash": h & U64_MASK, "tokens_hash": k}
                          for h, k in zip(ev["block_hashes"], keys)]
                parent = ev.get("parent_block_hash")
                data = {"stored": {"parent_hash": None if parent is None else parent & U64_MASK,
                                   "blocks": blocks}}
                n = len(blocks)
            elif kind == "BlockRemoved":
                data = {"removed": {"block_hashes": [h & U64_MASK for h in ev["block_hashes"]]}}
                n = len(ev["block_hashes"])
            elif kind == "AllBlocksCleared":
                data, n = "cleared", 0
            else:
                continue
            body = {"event_id": self.next_id, "data": data, "dp_rank": dp_rank or 0}
            self.next_id += 1
            out.append((kind, json.dumps(body, separators=(",", ":")).encode(), n))
        return out


# ---------------------------------------------------------------- helpers


def pct(samples_ns, p):
    s = sorted(samples_ns)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))] / 1000.0


def time_calls(fn, iters, warmup):
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(iters):
        t = time.perf_counter_ns()
        fn()
        out.append(time.perf_counter_ns() - t)
    return out


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def zmq_ingest(args, records, n_stored):
    import zmq

    ctx = zmq.Context()
    workers = sorted({w for w, _ in records})
    socks, spec = {}, []
    for w in workers:
        s = ctx.socket(zmq.PUB)
        s.setsockopt(zmq.SNDHWM, 0)
        s.setsockopt(zmq.LINGER, 0)
        port = s.bind_to_random_port("tcp://127.0.0.1")
        socks[w] = [s, 0]
        spec.append(f"{w}=tcp://127.0.0.1:{port}")
    http = free_port()
    cmd = [sys.executable, "-m", "dynamo.indexer", "--block-size", str(args.block_size),
           "--port", str(http), "--workers", ",".join(spec)]
    if args.zmq_threads:
        cmd += ["--threads", str(args.zmq_threads)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    base = f"http://127.0.0.1:{http}"

    def stored_ok():
        txt = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
        m = re.search(r'kv_cache_events_applied\{event_type="stored",status="ok"\} (\S+)', txt)
        return int(float(m.group(1))) if m else 0

    try:
        t0 = time.monotonic()
        while True:
            try:
                urllib.request.urlopen(base + "/health", timeout=1).read()
                break
            except Exception:
                if proc.poll() is not None or time.monotonic() - t0 > 30:
                    raise RuntimeError("indexer did not start")
                time.sleep(0.02)
        time.sleep(0.3)  # let every SUB finish its connect
        t0 = time.perf_counter()
        for w, payload in records:
            s = socks[w]
            s[0].send_multipart([b"", struct.pack(">Q", s[1]), payload])
            s[1] += 1
        t_sent = time.perf_counter() - t0
        deadline = time.monotonic() + args.zmq_timeout
        while (got := stored_ok()) < n_stored:
            if time.monotonic() > deadline:
                raise RuntimeError(f"zmq: only {got}/{n_stored} stored events applied")
            time.sleep(0.005)
        dt = time.perf_counter() - t0
        return {"zmq_seconds": round(dt, 4), "zmq_send_seconds": round(t_sent, 4),
                "zmq_stored_events_per_s": round(n_stored / dt, 1)}
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=10)
        for s, _ in socks.values():
            s.close()
        ctx.term()


# ---------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description="Dynamo (ai-dynamo-runtime) KV router benchmark")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--seq-tokens", type=int, default=4096)
    ap.add_argument("--sequences", type=int, default=1024)
    ap.add_argument("--blocks-per-event", type=int, default=16)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--events-file", default=None)
    ap.add_argument("--file-worker", type=int, default=1)
    ap.add_argument("--write-events", default=None)
    ap.add_argument("--request-tokens", type=int, default=4096)
    ap.add_argument("--lookup-keys", type=int, default=256)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--removals", action="store_true")
    ap.add_argument("--repeats", type=int, default=1,
                    help="apply (and remove + warm apply) this many times; best wall time, mean CPU time")
    ap.add_argument("--zmq", action="store_true")
    ap.add_argument("--zmq-threads", type=int, default=None)
    ap.add_argument("--zmq-timeout", type=float, default=120)
    args = ap.parse_args()
    B = args.block_size
    res = {"dynamo": "ai-dynamo-runtime 1.6.1", "python": sys.version.split()[0], "cpus": os.cpu_count(),
           "block_size": B}

    t = time.perf_counter()
    if args.events_file:
        records, seqs = read_events_file(args.events_file, args.file_worker), []
        res["source"] = args.events_file
    else:
        records, seqs = synth(args)
        res["source"] = {"seed": args.seed, "sequences": args.sequences, "seq_tokens": args.seq_tokens,
                         "blocks_per_event": args.blocks_per_event, "workers": args.workers}
    log(f"{len(records)} payloads ready in {time.perf_counter() - t:.2f}s")
    if args.write_events:
        write_events_file(args.write_events, records)
        log(f"wrote {args.write_events}")

    conv = Converter(B)
    t = time.perf_counter_ns()
    converted = [(w, item) for w, p in records for item in conv.convert(p)]
    convert_ns = time.perf_counter_ns() - t
    stored = [(w, j, n) for w, (k, j, n) in converted if k == "BlockStored"]
    n_blocks = sum(n for _, _, n in stored)
    res.update(payloads=len(records), events=len(converted), stored_events=len(stored), stored_blocks=n_blocks,
               convert_events_per_s=round(len(converted) / (convert_ns / 1e9), 1),
               convert_blocks_per_s=round(n_blocks / (convert_ns / 1e9), 1))

    # Best wall time and mean CPU time of --repeats applies, each into a new
    # tree (kvcore's route-bench reports its own fresh apply the same way).
    apply_ns, cpu_sum = None, 0
    for _ in range(max(1, args.repeats)):
        tree = RadixTree()
        cpu = time.process_time_ns()
        t = time.perf_counter_ns()
        for w, (k, j, n) in converted:
            tree.apply_event(w, j)
        tree.find_matches([0])  # barrier: the tree works on its own thread
        dt = time.perf_counter_ns() - t
        cpu_sum += time.process_time_ns() - cpu
        apply_ns = dt if apply_ns is None else min(apply_ns, dt)
    apply_cpu_ns = cpu_sum / max(1, args.repeats)
    res.update(repeats=max(1, args.repeats), apply_seconds=round(apply_ns / 1e9, 4),
               apply_cpu_seconds=round(apply_cpu_ns / 1e9, 4),
               stored_events_per_s=round(len(stored) / (apply_ns / 1e9), 1),
               stored_blocks_per_s=round(n_blocks / (apply_ns / 1e9), 1),
               stored_blocks_per_cpu_s=round(n_blocks / (apply_cpu_ns / 1e9), 1))
    if len(stored) != len(converted):
        res["all_events_per_s"] = round(len(converted) / (apply_ns / 1e9), 1)

    # hash of one request
    rng = random.Random(args.seed + 1)
    req = [rng.randrange(152000) for _ in range(args.request_tokens)]
    ns = time_calls(lambda: compute_block_hash_for_seq(req, B), args.iters, 100)
    res.update(hash_tokens=args.request_tokens, hash_p50_us=round(pct(ns, 50), 2), hash_p99_us=round(pct(ns, 99), 2))

    # lookup
    if seqs:
        w0, toks = seqs[0]
        keys = compute_block_hash_for_seq(toks, B)
    else:  # from the file: the first stored event's chain is enough to be a hit
        first = json.loads(stored[0][1]) if stored else None
        keys = [b["tokens_hash"] for b in first["data"]["stored"]["blocks"]] if first else []
    keys = keys[:args.lookup_keys]
    keys += [rng.getrandbits(64) for _ in range(args.lookup_keys - len(keys))]
    scores = tree.find_matches(keys).scores
    ns = time_calls(lambda: tree.find_matches(keys), args.iters, 100)
    res.update(lookup_keys=len(keys), lookup_best_match_blocks=max(scores.values()) if scores else 0,
               lookup_p50_us=round(pct(ns, 50), 2), lookup_p99_us=round(pct(ns, 99), 2))

    if args.removals:
        rem = []
        for w, (k, j, n) in converted:
            if k == "BlockStored":
                ev = json.loads(j)
                hs = [b["block_hash"] for b in ev["data"]["stored"]["blocks"]]
                rem.append((w, json.dumps({"event_id": 0, "data": {"removed": {"block_hashes": hs[::-1]}}}).encode()))
        rem.reverse()
        # Best of --repeats rounds: remove everything, then apply the same
        # stored events again into the tree the removals emptied, whose
        # memory the allocator now reuses (kvcore's "warm tables" figure).
        rem_best = warm_best = None
        warm_cpu_sum = 0
        for _ in range(max(1, args.repeats)):
            t = time.perf_counter_ns()
            for w, j in rem:
                tree.apply_event(w, j)
            tree.find_matches([0])
            dt = (time.perf_counter_ns() - t) / 1e9
            rem_best = dt if rem_best is None else min(rem_best, dt)
            left = len(tree.find_matches(keys).scores)
            cpu = time.process_time_ns()
            t = time.perf_counter_ns()
            for w, (k, j, n) in converted:
                tree.apply_event(w, j)
            tree.find_matches([0])
            dt = (time.perf_counter_ns() - t) / 1e9
            warm_cpu_sum += time.process_time_ns() - cpu
            warm_best = dt if warm_best is None else min(warm_best, dt)
        warm_cpu = warm_cpu_sum / 1e9 / max(1, args.repeats)
        res.update(removed_events_per_s=round(len(rem) / rem_best, 1), removed_blocks_per_s=round(n_blocks / rem_best, 1),
                   lookup_after_removals=left,
                   warm_stored_events_per_s=round(len(stored) / warm_best, 1),
                   warm_stored_blocks_per_s=round(n_blocks / warm_best, 1),
                   warm_stored_blocks_per_cpu_s=round(n_blocks / warm_cpu, 1))

    if args.zmq:
        log("zmq ingest through python -m dynamo.indexer ...")
        res.update(zmq_ingest(args, records, len(stored)))

    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
