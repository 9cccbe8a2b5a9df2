#!/usr/bin/env python3
"""The fleet's router process: Dynamo 1.6.1's `KvRouter`, discovery through etcd, KV events
through NATS (ETCD_ENDPOINTS, NATS_SERVER from the environment), on the workers'
`<namespace>.worker.generate` endpoint.

    python dynamo_router.py --block-size 32 [--namespace kvcore]

First stdout line: {"ready": true, "pid": n}. Then one JSON command per line on stdin, one JSON
line out:

  {"op":"route","tokens":[..],"block_mm_infos":..,"image":..}
      KvRouter.generate picks the worker and sends the request there; the worker's engine serves
      it. -> {"ordinal": n, "cached": tokens the engine found cached}
  {"op":"route_to","instance_id":N,...}   the same, sent to that worker (round-robin baseline)
  {"op":"overlap","tokens":[..],"block_mm_infos":..}
      -> {"blocks": {"<instance_id>": device blocks}}   (KvRouter.get_overlap_scores)
  {"op":"loads","tokens":[..],"block_mm_infos":..}
      -> {"active_requests": n, "decode_blocks": n}   (KvRouter.get_potential_loads, summed over
      the workers: what the router still counts in flight)
  {"op":"instances"} -> {"instance_ids": [..]}   (the workers discovery lists now)
  {"op":"dump"} -> {"events": [..]}   (KvRouter.dump_events: the indexer's state as events)
  {"op":"ping"} / {"op":"quit"}

Errors answer {"error": "..."}; the loop goes on.
"""
import argparse
import asyncio
import json
import os
import sys

os.environ.setdefault("DYN_SDK_DISABLE_ANSI_LOGGING", "1")
os.environ.setdefault("DYN_LOG", "warn")

from dynamo.llm import KvRouter, KvRouterConfig  # noqa: E402
from dynamo.runtime import DistributedRuntime  # noqa: E402


def say(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--block-size", type=int, required=True)
    ap.add_argument("--namespace", default="kvcore")
    ap.add_argument("--model", default="kvcore")
    args = ap.parse_args()

    loop = asyncio.get_running_loop()
    rt = DistributedRuntime(loop, "etcd", "tcp", event_plane="nats")
    ep = rt.endpoint(f"{args.namespace}.worker.generate")
    router = KvRouter(ep, args.block_size, KvRouterConfig())
    client = await ep.client()
    say({"ready": True, "pid": os.getpid()})

    async def send(cmd, worker_id=None):
        extra = {"image": cmd["image"]} if cmd.get("image") else None
        out = []
        stream = await router.generate(cmd["tokens"], args.model, worker_id=worker_id,
                                       block_mm_infos=cmd.get("block_mm_infos"), extra_args=extra,
                                       stop_conditions={"max_tokens": 1})
        async for item in stream:
            out.extend(item.get("token_ids") or [])
        if len(out) < 2:
            raise RuntimeError(f"worker answered {out!r}")
        return {"ordinal": out[0], "cached": out[1]}

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
            if op == "route":
                say(await send(cmd))
            elif op == "route_to":
                say(await send(cmd, worker_id=cmd["instance_id"]))
            elif op == "overlap":
                raw = await router.get_overlap_scores(cmd["tokens"], block_mm_infos=cmd.get("block_mm_infos"))
                blocks = {}
                for w in raw.get("workers", []):
                    key = str(w["worker_id"])
                    blocks[key] = max(blocks.get(key, 0), w.get("device_blocks", 0))
                say({"blocks": blocks})
            elif op == "loads":
                raw = await router.get_potential_loads(cmd["tokens"], block_mm_infos=cmd.get("block_mm_infos"))
                say({"active_requests": sum(int(r["active_requests"]) for r in raw),
                     "decode_blocks": sum(int(r["potential_decode_blocks"]) for r in raw)})
            elif op == "instances":
                say({"instance_ids": sorted(client.instance_ids())})
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


if __name__ == "__main__":
    asyncio.run(main())
    os._exit(0)
