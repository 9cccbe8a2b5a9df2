#!/usr/bin/env python3
"""Self-check of dynamo_probe.py against a Python publisher (kvpub.py), no Rust involved.

    $(tests/interop/setup_venv.sh | tail -1) tests/interop/selfcheck.py

Binds two PUB sockets first (as an engine would), starts the probe (which starts the indexer),
publishes vLLM-style map events and checks the overlaps the indexer reports. Prints PASS/FAIL
lines and exits non-zero on any failure. Also a reference client for the Rust test.
"""
import json
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from kvpub import Publisher, all_blocks_cleared, block_removed, block_stored, mm_info  # noqa: E402

B = 4
failures = 0


def check(name, got, want):
    global failures
    ok = got == want
    failures += not ok
    print(f"{'PASS' if ok else 'FAIL'} {name}: got {got}" + ("" if ok else f", want {want}"), flush=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Probe:
    def __init__(self, workers):
        self.p = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "dynamo_probe.py"), "--block-size", str(B),
             "--workers", workers, "--indexer-log", "/dev/null"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.ready = json.loads(self.p.stdout.readline())
        assert self.ready.get("ready"), self.ready

    def __call__(self, **cmd):
        self.p.stdin.write(json.dumps(cmd) + "\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())

    def close(self):
        r = self(op="quit")
        self.p.wait(timeout=10)
        return r


def main():
    e1, e2 = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    p1, p2 = Publisher(e1), Publisher(e2)  # bind before the indexer connects: no join delay
    t0 = time.time()
    probe = Probe(f"1={e1},2={e2}")
    print(f"ready: {probe.ready} ({time.time() - t0:.2f}s)")
    applied = {"stored": 0, "removed": 0, "cleared": 0}

    def settle(**inc):
        for k, v in inc.items():
            applied[k] += v
        r = probe(op="wait_applied", timeout_s=10, **applied)
        assert r.get("ok"), r

    toks = list(range(100, 100 + 4 * B))
    h = probe(op="hash", tokens=toks, block_size=B)["hashes"]
    check("hash count", len(h), 4)
    # worker 1 holds 4 blocks in two chained events; worker 2 the first 2 blocks.
    # Engine block hashes must be content-addressed ACROSS workers: worker 2 uses 11, 12 too.
    p1.send([block_stored([11, 12], None, toks[:2 * B], B)])
    p1.send([block_stored([13, 14], 12, toks[2 * B:], B)])
    p2.send([block_stored([11, 12], None, toks[:2 * B], B)])
    settle(stored=3)
    check("text overlap", probe(op="query", block_hashes=h)["scores"], {"1": 16, "2": 8})
    check("query_tokens", probe(op="query_tokens", token_ids=toks)["scores"], {"1": 16, "2": 8})
    # u64 engine hashes above i64::MAX are accepted on the wire
    p2.send([block_stored([(1 << 64) - 3], 12, toks[2 * B:3 * B], B)])
    settle(stored=1)
    check("u64 engine hash", probe(op="query", block_hashes=h)["scores"], {"1": 16, "2": 12})
    # quirk: same content under a different engine hash on another worker -> its children are lost
    t2 = list(range(500, 500 + 2 * B))
    h2 = probe(op="hash", tokens=t2, block_size=B)["hashes"]
    p1.send([block_stored([51], None, t2[:B], B)])
    p2.send([block_stored([61], None, t2[:B], B)])
    settle(stored=2)
    p2.send([block_stored([62], 61, t2[B:], B)])
    time.sleep(0.3)
    m = probe(op="metrics")["applied"]
    check("quirk: parent known only under worker 1's hash -> parent_block_not_found",
          (m.get("stored/parent_block_not_found"), probe(op="query", block_hashes=h2)["scores"]),
          (1, {"1": 4, "2": 4}))
    # removal
    p1.send([block_removed([13])])  # prefix match stops at the hole
    settle(removed=1)
    check("after removing block 3 of worker 1", probe(op="query", block_hashes=h)["scores"], {"1": 8, "2": 12})
    # images: same placeholder tokens, different mm_hash
    img = [151655] * (2 * B)
    a, b = mm_info((0xA1A1A1A1A1A1A1A1, [(0, B)])), mm_info((0xB2, [(0, 2), (2, B)]))
    p1.send([block_stored([31, 32], None, img, B, block_mm_infos=[a, a])])
    p2.send([block_stored([41, 42], None, img, B, block_mm_infos=[b, None])])
    settle(stored=2)
    ha = probe(op="hash", tokens=img, block_size=B, block_mm_infos=[a, a])["hashes"]
    hb = probe(op="hash", tokens=img, block_size=B, block_mm_infos=[b, None])["hashes"]
    ht = probe(op="hash", tokens=img, block_size=B)["hashes"]
    check("image A", probe(op="query", block_hashes=ha)["scores"], {"1": 8})
    check("image B (2nd block text)", probe(op="query", block_hashes=hb)["scores"], {"2": 8})
    check("image tokens as text", probe(op="query", block_hashes=ht)["scores"], {})
    # all cleared on worker 2
    p2.send([all_blocks_cleared()])
    settle(cleared=1)
    check("after AllBlocksCleared on worker 2", probe(op="query", block_hashes=h)["scores"], {"1": 8})
    check("error answer", "error" in probe(op="nope"), True)
    check("quit", probe.close(), {"ok": True})
    p1.close()
    p2.close()
    print("ALL PASS" if not failures else f"{failures} FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
