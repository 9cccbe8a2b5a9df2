"""vLLM 0.33.0's own KV event decoder, run on kvcore's payloads.

The decoder is vLLM's `vllm/distributed/kv_events.py` from the vllm==0.33.0
wheel on PyPI. It is never part of this repository: `fetch` reads that one
member out of the remote wheel with HTTP range requests (the zip directory
and the member only, not the whole wheel) and caches it; `load` runs it with
small stand-ins for the vllm modules it imports (logging, config and network
functions it does not use to decode) and, where pyzmq is missing, for zmq.

Decoding:
- map form: vLLM 0.33's own `KVEventBatch` decoder (its events are tagged
  maps);
- array form: vLLM's event classes declared again `array_like=True` from
  their own field lists, in their own order (the positional layout older
  vLLM published). Nothing of the field list is written here.

Usage (one JSON object per line in, one per line out, until EOF):
    python vllm_decoder.py --cache DIR
    in : {"form": "map" | "array", "payload": "<hex of msgpack payload>"}
    out: {"ok": true, "ts": f, "data_parallel_rank": n, "events": [{"type": ..., field: value, ...}]}
         or {"error": "..."}
    python vllm_decoder.py --cache DIR --fetch-only     # fetch and exit 0
"""
import argparse
import io
import json
import logging
import os
import sys
import types
import urllib.request
import zipfile

VERSION = "0.33.0"
WHEEL = f"vllm-{VERSION}-cp38-abi3-manylinux_2_28_x86_64.whl"
MEMBER = "vllm/distributed/kv_events.py"
SIMPLE = "https://pypi.org/simple/vllm/"


def wheel_url():
    req = urllib.request.Request(SIMPLE, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        index = json.load(r)
    for f in index["files"]:
        if f["filename"] == WHEEL:
            return f["url"]
    raise RuntimeError(f"{WHEEL} is not in the PyPI index")


class RangeFile(io.RawIOBase):
    """A read-only, seekable view of a remote file, read by HTTP range requests."""

    def __init__(self, url):
        self.url = url
        head = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(head, timeout=60) as r:
            self.size = int(r.headers["Content-Length"])
        self.pos = 0
        self.fetched = 0

    def seekable(self):
        return True

    def readable(self):
        return True

    def tell(self):
        return self.pos

    def seek(self, offset, whence=io.SEEK_SET):
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def read(self, n=-1):
        if n is None or n < 0:
            n = self.size - self.pos
        n = min(n, self.size - self.pos)
        if n <= 0:
            return b""
        req = urllib.request.Request(self.url, headers={"Range": f"bytes={self.pos}-{self.pos + n - 1}"})
        with urllib.request.urlopen(req, timeout=120) as r:
            if r.status != 206:
                raise RuntimeError(f"the server ignored the range request (HTTP {r.status})")
            data = r.read()
        self.pos += len(data)
        self.fetched += len(data)
        return data

    def readinto(self, b):
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


def fetch(cache):
    """The cached path of vLLM's kv_events.py, fetched on first use."""
    path = os.path.join(cache, f"vllm-{VERSION}", "kv_events.py")
    if os.path.exists(path):
        return path
    remote = RangeFile(wheel_url())
    with zipfile.ZipFile(io.BufferedReader(remote, buffer_size=1 << 16)) as z:
        source = z.read(MEMBER)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(source)
    os.replace(tmp, path)
    print(f"[vllm_decoder] fetched {MEMBER} ({len(source)} bytes) reading {remote.fetched} of "
          f"{remote.size} wheel bytes", file=sys.stderr)
    return path


def _module(name, **attrs):
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


def load(path):
    """Runs vLLM's kv_events.py as `vllm.distributed.kv_events` with stand-ins
    for the imports that decoding does not need."""
    class KVEventsConfig:
        """Only named in the publisher factory's annotations."""

    def unused(*_a, **_k):
        raise RuntimeError("not available in the decoder-only loader")

    for pkg in ["vllm", "vllm.config", "vllm.distributed", "vllm.utils", "vllm.v1", "vllm.v1.core"]:
        _module(pkg, __path__=[])
    _module("vllm.config.kv_events", KVEventsConfig=KVEventsConfig)
    _module("vllm.logger", init_logger=logging.getLogger)
    _module("vllm.utils.network_utils", get_ip=unused, get_tcp_uri=unused,
            is_valid_ipv6_address=unused, split_zmq_path=unused)
    # vLLM's own alias (vllm/v1/core/kv_cache_utils.py): a block hash is bytes or int.
    _module("vllm.v1.core.kv_cache_utils", ExternalBlockHash=bytes | int)
    try:
        import zmq  # noqa: F401
    except ImportError:
        class Anything:
            def __getattr__(self, _name):
                return Anything()

            def __call__(self, *a, **k):
                return Anything()

        z = _module("zmq")
        z.__getattr__ = lambda _name: Anything()
    mod = types.ModuleType("vllm.distributed.kv_events")
    mod.__file__ = path
    sys.modules[mod.__name__] = mod
    with open(path, encoding="utf-8") as f:
        exec(compile(f.read(), path, "exec"), mod.__dict__)
    return mod


def decoders(kv):
    import msgspec

    maps = msgspec.msgpack.Decoder(kv.KVEventBatch)
    twins = []
    for cls in (kv.BlockStored, kv.BlockRemoved, kv.AllBlocksCleared):
        fields = []
        for f in msgspec.structs.fields(cls):
            if f.required:
                fields.append((f.name, f.type))
            else:
                fields.append((f.name, f.type, f.default))
        twins.append(msgspec.defstruct(cls.__name__, fields, array_like=True, tag=True, omit_defaults=True))
    union = twins[0] | twins[1] | twins[2]
    batch_fields = [(f.name, f.type) if f.required else (f.name, f.type, f.default)
                    for f in msgspec.structs.fields(kv.EventBatch)]
    batch_fields = [(n, list[union], *rest) if n == "events" else (n, t, *rest) for (n, t, *rest) in batch_fields]
    arrays = msgspec.msgpack.Decoder(msgspec.defstruct("KVEventBatch", batch_fields, array_like=True))
    return {"map": maps, "array": arrays}


def plain(v):
    if isinstance(v, bytes):
        return v.hex()
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    return v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", required=True)
    ap.add_argument("--fetch-only", action="store_true")
    args = ap.parse_args()
    path = fetch(args.cache)
    if args.fetch_only:
        return 0
    import msgspec

    kv = load(path)
    dec = decoders(kv)
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
            batch = dec[req["form"]].decode(bytes.fromhex(req["payload"]))
            events = []
            for e in batch.events:
                d = {"type": type(e).__name__}
                d.update(plain(msgspec.structs.asdict(e)))
                events.append(d)
            out = {"ok": True, "ts": batch.ts, "data_parallel_rank": batch.data_parallel_rank, "events": events}
        except Exception as e:  # every failure is an answer, the loop goes on
            out = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
