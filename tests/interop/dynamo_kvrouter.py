#!/usr/bin/env python3
"""JSON-lines front end to NVIDIA Dynamo's in-process KV router (ai-dynamo-runtime 1.6.1).

No etcd, no NATS: the wheel's `DistributedRuntime` runs with the in-memory discovery backend
("mem"), the TCP request plane and the ZMQ event plane, all inside this process. One worker is
served on an endpoint and registered as a model (`register_model(..., skip_model_assets=True)`:
without a registered model the router counts no instance and applies none of its events); Dynamo's
own `KvEventPublisher` in relay mode subscribes to a kvcore engine's ZMQ PUB socket, decodes the
stream with Dynamo's parser and forwards it; a `dynamo.llm.KvRouter` on that endpoint indexes it.
One worker per process: the in-memory discovery of one runtime has one instance.

Run with the python of the venv made by setup_venv.sh:

    python dynamo_kvrouter.py --block-size 32 --endpoint tcp://127.0.0.1:5557 [--image-token-id N]

First stdout line: {"ready": true, "worker_id": N}. Then one JSON command per line on stdin, one
JSON line out per command:

  {"op":"overlap","tokens":[...],"lora_name":s|null,"cache_namespace":s|null,"block_mm_infos":[...]|null}
      -> {"device_blocks": d, "host_blocks": h, "disk_blocks": k, "raw": <KvRouter.get_overlap_scores answer>}
         (this worker's device match d, the host-pinned blocks h that continue it,
          `host_pinned_extension_blocks`, and the disk blocks k that continue those,
          `disk_extension_blocks`)
  {"op":"dump"}  -> {"events": [...]}   (KvRouter.dump_events)
  {"op":"ping"}  -> {"ok": true}
  {"op":"quit"}  -> {"ok": true}, then exit 0

Errors answer {"error": "..."}; the loop goes on. EOF stops it too.
"""
import argparse
import asyncio
import json
import os
import sys

os.environ.setdefault("DYN_SDK_DISABLE_ANSI_LOGGING", "1")
os.environ.setdefault("DYN_LOG", "error")

from dynamo.llm import (  # noqa: E402
    KvEventPublisher,
    KvRouter,
    KvRouterConfig,
    ModelInput,
    ModelType,
    WorkerType,
    register_model,
)
from dynamo.runtime import DistributedRuntime  # noqa: E402


def say(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--block-size", type=int, required=True)
    ap.add_argument("--endpoint", required=True, help="the kvcore engine's PUB endpoint")
    ap.add_argument("--topic", default=None)
    ap.add_argument("--image-token-id", type=int, default=None)
    args = ap.parse_args()

    loop = asyncio.get_running_loop()
    rt = DistributedRuntime(loop, "mem", "tcp", event_plane="zmq")
    ep = rt.endpoint("kvcore.worker.generate")

    async def generate(_request, _context=None):
        yield {"token_ids": []}

    serving = asyncio.ensure_future(ep.serve_endpoint(generate))
    await asyncio.sleep(0.3)
    await register_model(ModelInput.Tokens, ModelType.Completions, ep, "kvcore", "kvcore",
                         worker_type=WorkerType.Aggregated, kv_cache_block_size=args.block_size,
                         skip_model_assets=True)
    relay = KvEventPublisher(ep, worker_id=None, kv_block_size=args.block_size,
                             zmq_endpoint=args.endpoint, zmq_topic=args.topic,
                             image_token_id=args.image_token_id)
    router = KvRouter(ep, args.block_size, KvRouterConfig())
    # The worker id is the one the router reports; before any event it lists none.
    say({"ready": True})

    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while True:
        line = await reader.readline()
        if not line:
            break
        line = line.strip()
        if not line:
            continue
        try:
            cmd = json.loads(line)
            op = cmd.get("op")
            if op == "overlap":
                raw = await router.get_overlap_scores(
                    cmd["tokens"], block_mm_infos=cmd.get("block_mm_infos"),
                    lora_name=cmd.get("lora_name"), cache_namespace=cmd.get("cache_namespace"))
                rows = raw.get("workers", [])
                say({"device_blocks": sum(w.get("device_blocks", 0) for w in rows),
                     "host_blocks": sum(w.get("host_pinned_extension_blocks", 0) for w in rows),
                     "disk_blocks": sum(w.get("disk_extension_blocks", 0) for w in rows),
                     "raw": raw})
            elif op == "dump":
                say({"events": json.loads(await router.dump_events())})
            elif op == "ping":
                say({"ok": True})
            elif op == "quit":
                say({"ok": True})
                break
            else:
                say({"error": f"unknown op {op!r}"})
        except Exception as e:  # every failure is an answer
            say({"error": f"{type(e).__name__}: {e}"})
    del relay, router
    serving.cancel()


if __name__ == "__main__":
    asyncio.run(main())
    os._exit(0)
