#!/usr/bin/env python3
"""One fleet worker's Dynamo side (ai-dynamo-runtime 1.6.1): a `DistributedRuntime` with etcd
discovery and the NATS event plane (ETCD_ENDPOINTS, NATS_SERVER from the environment) serves
`<namespace>.worker.generate`, registers the model, and runs Dynamo's own relay
(`KvEventPublisher(zmq_endpoint=...)`) on the kvcore engine's PUB socket. Each request the router
sends here is handed to the engine's control socket (`kvcore fleet-engine`), which admits,
computes and commits it; the answer's `token_ids` are `[ordinal, tokens found cached]`. After
start it asks the engine to publish its whole state, so that an engine that kept its cache while
this process restarted is known again under the new instance.

    python dynamo_worker.py --ordinal 0 --block-size 32 --engine-pub tcp://.. --engine-control tcp://..

First stdout line: {"ready": true, "instance_id": N, "ordinal": n, "pid": n}. Then it serves until
SIGTERM or stdin closes.
"""
import argparse
import asyncio
import json
import os
import sys

os.environ.setdefault("DYN_SDK_DISABLE_ANSI_LOGGING", "1")
os.environ.setdefault("DYN_LOG", "warn")

import zmq  # noqa: E402
import zmq.asyncio  # noqa: E402
from dynamo.llm import (  # noqa: E402
    KvEventPublisher,
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
    ap.add_argument("--ordinal", type=int, required=True)
    ap.add_argument("--block-size", type=int, required=True)
    ap.add_argument("--engine-pub", required=True)
    ap.add_argument("--engine-control", required=True)
    ap.add_argument("--namespace", default="kvcore")
    ap.add_argument("--model", default="kvcore")
    ap.add_argument("--no-local-indexer", action="store_true",
                    help="run the relay without Dynamo's worker-local indexer")
    ap.add_argument("--republish-s", type=float, nargs="*", default=[0.5, 1.0, 2.0, 4.0],
                    help="delays between the engine's state publications after start")
    args = ap.parse_args()

    loop = asyncio.get_running_loop()
    rt = DistributedRuntime(loop, "etcd", "tcp", event_plane="nats")
    ep = rt.endpoint(f"{args.namespace}.worker.generate")
    ctx = zmq.asyncio.Context()
    control = ctx.socket(zmq.REQ)
    control.connect(args.engine_control)
    lock = asyncio.Lock()

    async def engine(cmd):
        async with lock:
            await control.send(json.dumps(cmd).encode())
            return json.loads(await control.recv())

    async def generate(request, _context=None):
        extra = request.get("extra_args") or {}
        answer = await engine({"op": "serve", "tokens": request["token_ids"], "image": extra.get("image")})
        if "error" in answer:
            raise RuntimeError(answer["error"])
        yield {"token_ids": [args.ordinal, answer["cached"]], "finish_reason": "stop"}

    serving = asyncio.ensure_future(ep.serve_endpoint(generate))
    await asyncio.sleep(0.3)
    await register_model(ModelInput.Tokens, ModelType.Completions, ep, args.model, args.model,
                         worker_type=WorkerType.Aggregated, kv_cache_block_size=args.block_size,
                         skip_model_assets=True)
    relay = KvEventPublisher(ep, worker_id=None, kv_block_size=args.block_size,
                             enable_local_indexer=not args.no_local_indexer,
                             zmq_endpoint=args.engine_pub)
    say({"ready": True, "instance_id": ep.connection_id(), "ordinal": args.ordinal, "pid": os.getpid()})

    async def republish():
        # The relay forwards only what the engine publishes from now on, under this (new)
        # instance id: an engine that kept its cache across a restart of this process publishes
        # its whole state again (AllBlocksCleared, then every cached block). The relay's
        # subscription and the router's discovery of this instance both take a moment to form,
        # and a batch sent before either is lost, so the state goes out a few times; each copy
        # replaces the previous one whole.
        for delay in args.republish_s:
            await asyncio.sleep(delay)
            await engine({"op": "republish"})

    republishing = asyncio.ensure_future(republish())

    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while await reader.readline():
        continue
    republishing.cancel()
    del relay
    serving.cancel()


if __name__ == "__main__":
    asyncio.run(main())
    os._exit(0)
