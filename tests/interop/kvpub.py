"""Minimal vLLM-style KV event publisher used to exercise Dynamo's indexer.

Binds a ZMQ PUB socket (like an engine does) and sends batches of 3 frames:
    [topic, seq (u64 big-endian), msgpack([ts, events, dp_rank])]
Events are maps ({"type": "BlockStored", ...}), the vLLM >= 0.26 encoding.

Only used by the interop test scripts; needs pyzmq and msgpack.
"""
import struct
import time

import msgpack
import zmq


def block_stored(block_hashes, parent, token_ids, block_size, block_mm_infos=None,
                 lora_name=None, medium="GPU"):
    ev = {
        "type": "BlockStored",
        "block_hashes": list(block_hashes),
        "parent_block_hash": parent,
        "token_ids": list(token_ids),
        "block_size": block_size,
        "lora_id": None,
        "medium": medium,
        "lora_name": lora_name,
    }
    if block_mm_infos is not None:
        ev["block_mm_infos"] = block_mm_infos
    return ev


def block_removed(block_hashes, medium="GPU"):
    return {"type": "BlockRemoved", "block_hashes": list(block_hashes), "medium": medium}


def all_blocks_cleared():
    return {"type": "AllBlocksCleared"}


def mm_info(*objects):
    """One block's entry: mm_info((mm_hash, [(start, end), ...]), ...)."""
    return {"mm_objects": [{"mm_hash": int(h), "offsets": [list(o) for o in offs]}
                           for h, offs in objects]}


def encode_payload(events, dp_rank=0, ts=None):
    return msgpack.packb([time.time() if ts is None else float(ts), events, dp_rank],
                         use_bin_type=True)


class Publisher:
    def __init__(self, endpoint, topic=b"", start_seq=0, ctx=None):
        self.ctx = ctx or zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 1000)
        self.sock.setsockopt(zmq.SNDHWM, 1_000_000)
        self.sock.bind(endpoint)
        self.topic = topic
        self.seq = start_seq

    def send(self, events, dp_rank=0):
        self.send_payload(encode_payload(events, dp_rank))

    def send_payload(self, payload):
        self.sock.send_multipart([self.topic, struct.pack(">Q", self.seq), payload])
        self.seq += 1

    def close(self):
        self.sock.close()
