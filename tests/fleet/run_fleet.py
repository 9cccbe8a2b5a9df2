#!/usr/bin/env python3
"""A kvcore fleet behind Dynamo 1.6.1's distributed KV router, on loopback, with its faults.

Starts etcd and nats-server, three workers (each a `kvcore fleet-engine` process with its
publisher, and a `dynamo_worker.py` process with Dynamo's runtime and relay) and one router
process (`dynamo_router.py`, Dynamo's `KvRouter`). Then:

  (the uuids phase runs first, on engines that never saw its UUIDs; then routing, then faults)
  routing   a load of text and image prompts (UUIDs, shared prefixes) routed by Dynamo; before
            each request the router's overlap for every worker must equal what that worker's
            engine holds, and the worker Dynamo picks must hold the longest prefix. The same
            load sent round-robin must hit less.
  uuids     an image's UUID given with other pixels on a worker that never saw it: what Dynamo's
            router then believes (docs/deployment.md).
  faults    a worker killed, a worker restarted empty, a worker's Dynamo side restarted while
            its engine kept the cache, the router restarted mid-load, NATS restarted, a relay
            stalled, a worker stalled past its etcd lease, the router stalled: after each, the
            router's view must equal the engines' own answers again, within a bound; each
            recovery is timed.

    python run_fleet.py --kvcore <path to the kvcore binary> [--etcd etcd] [--nats nats-server]
                        [--scenario faults|router-restart-without-local-indexer|uuid-through-kvcore-relay]
                        [--bypass-relay]

The second scenario runs the relays without Dynamo's worker-local indexer and shows that a
restarted router then learns nothing of the engines' caches until the engines publish their state.
The third puts `kvcore relay --resync` between the engines and Dynamo's relays and shows that a UUID
given with other pixels on another worker no longer makes Dynamo's router believe that worker holds
the UUID's image, and that the UUID matches its holder again once the other copy is gone
(`--bypass-relay` points Dynamo's relays at the engines instead, where those checks fail).

Run it with the python of the Dynamo venv (tests/interop/setup_venv.sh). Prints one JSON line per
phase and a summary line {"ok": true, ...}; exits 1 on the first failed check.
"""
import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import zmq

HERE = os.path.dirname(os.path.abspath(__file__))
BLOCK = 32
VISION_START, IMAGE_PAD, VISION_END = 151_652, 151_655, 151_653
# A recovery that takes longer than this fails the run.
RECOVERY_BOUND_S = 30.0
# dynamo_worker.py's default --republish-s add up to 7.5 s.
REPUBLISH_WINDOW_S = 8.0


class Failed(Exception):
    """A check that did not hold."""


def check(cond, what):
    if not cond:
        raise Failed(what)


def report(**kv):
    print(json.dumps(kv), flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(pred, timeout, what):
    """Polls pred() until it returns a true value; returns (value, seconds)."""
    t0 = time.monotonic()
    last = None
    while True:
        last = pred()
        if last:
            return last, time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise Failed(f"{what}: not reached within {timeout} s")
        time.sleep(0.1)


class Procs:
    """Every child process, each in its own process group; all stopped at exit."""

    def __init__(self, logdir):
        self.logdir = logdir
        self.children = []

    def spawn(self, name, argv, env=None, stdin=False, stdout=True):
        log = open(os.path.join(self.logdir, f"{name}.log"), "ab")
        p = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                             stdout=subprocess.PIPE if stdout else log, stderr=log,
                             text=True, preexec_fn=os.setpgrp)
        p.name = name
        self.children.append(p)
        return p

    def kill(self, p, sig=signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        if sig in (signal.SIGKILL, signal.SIGTERM):
            p.wait(timeout=10)

    def stop_all(self):
        for p in reversed(self.children):
            if p.poll() is None:
                self.kill(p)


def first_line(p, timeout=30):
    t0 = time.monotonic()
    line = p.stdout.readline()
    check(line, f"{p.name} exited before its ready line (see its log)")
    msg = json.loads(line)
    check(msg.get("ready"), f"{p.name}: {msg}")
    msg["startup_s"] = round(time.monotonic() - t0, 3)
    return msg


class Engine:
    """A `kvcore fleet-engine` process and its control socket."""

    def __init__(self, procs, kvcore, name):
        self.procs = procs
        self.proc = procs.spawn(name, [kvcore, "fleet-engine", "--block-size", str(BLOCK)])
        ready = first_line(self.proc)
        self.pub, self.replay, self.control = ready["pub"], ready["replay"], ready["control"]
        self.ctx = zmq.Context.instance()
        self.sock = None

    def call(self, cmd):
        if self.sock is None:
            self.sock = self.ctx.socket(zmq.REQ)
            self.sock.setsockopt(zmq.RCVTIMEO, 10_000)
            self.sock.setsockopt(zmq.LINGER, 0)
            self.sock.connect(self.control)
        self.sock.send_string(json.dumps(cmd))
        try:
            answer = json.loads(self.sock.recv_string())
        except zmq.Again:
            self.sock.close()
            self.sock = None
            raise Failed(f"engine {self.control} did not answer {cmd['op']}")
        check("error" not in answer, f"engine: {cmd['op']}: {answer}")
        return answer

    def held(self, prompt):
        return self.call({"op": "held", "tokens": prompt["tokens"], "image": prompt.get("image")})["cached"]

    def kill(self):
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self.procs.kill(self.proc)


class Worker:
    """A Dynamo worker process in front of an engine."""

    def __init__(self, procs, py, env, ordinal, engine, generation, extra_args=(), pub=None):
        self.ordinal, self.engine = ordinal, engine
        self.proc = procs.spawn(f"worker{ordinal}.{generation}",
                                [py, os.path.join(HERE, "dynamo_worker.py"), "--ordinal", str(ordinal),
                                 "--block-size", str(BLOCK), "--engine-pub", pub or engine.pub,
                                 "--engine-control", engine.control, *extra_args], env=env, stdin=True)
        ready = first_line(self.proc)
        self.instance_id = ready["instance_id"]
        self.startup_s = ready["startup_s"]
        self.started = time.monotonic()


class Router:
    def __init__(self, procs, py, env, generation):
        self.procs = procs
        self.proc = procs.spawn(f"router.{generation}", [py, os.path.join(HERE, "dynamo_router.py"),
                                                        "--block-size", str(BLOCK)], env=env, stdin=True)
        self.startup_s = first_line(self.proc)["startup_s"]

    def call(self, cmd, allow_error=False):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        check(line, f"the router exited during {cmd['op']}")
        answer = json.loads(line)
        if not allow_error:
            check("error" not in answer, f"router: {cmd['op']}: {answer}")
        return answer

    def overlap(self, prompt):
        return self.call({"op": "overlap", "tokens": prompt["tokens"],
                          "block_mm_infos": prompt.get("block_mm_infos")})["blocks"]

    def instances(self):
        return self.call({"op": "instances"})["instance_ids"]


class Fleet:
    def __init__(self, args, logdir):
        self.args = args
        self.procs = Procs(logdir)
        self.logdir = logdir
        self.etcd_port, self.peer_port, self.nats_port = free_port(), free_port(), free_port()
        self.env = dict(os.environ, ETCD_ENDPOINTS=f"http://127.0.0.1:{self.etcd_port}",
                        NATS_SERVER=f"nats://127.0.0.1:{self.nats_port}",
                        ETCD_LEASE_TTL=str(args.lease_ttl_s))
        self.workers = {}
        self.generation = 0
        self.router = None
        self.nats = None

    def start_services(self):
        data = os.path.join(self.logdir, "etcd-data")
        etcd = self.procs.spawn("etcd", [
            self.args.etcd, "--data-dir", data,
            "--listen-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{self.peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer_port}",
            "--initial-cluster", f"default=http://127.0.0.1:{self.peer_port}"], stdout=False)
        self.start_nats()
        wait_until(lambda: port_open(self.etcd_port), 20, "etcd listening")
        return etcd

    def start_nats(self):
        self.nats = self.procs.spawn("nats", [self.args.nats, "-a", "127.0.0.1", "-p", str(self.nats_port)],
                                     stdout=False)
        wait_until(lambda: port_open(self.nats_port), 20, "nats-server listening")

    def start_worker(self, ordinal, engine=None, pub=None):
        self.generation += 1
        if engine is None:
            engine = Engine(self.procs, self.args.kvcore, f"engine{ordinal}.{self.generation}")
        extra = []
        if self.args.no_local_indexer:
            extra.append("--no-local-indexer")
        if self.args.no_republish:
            extra.append("--republish-s")
        w = Worker(self.procs, self.args.python, self.env, ordinal, engine, self.generation, extra, pub)
        self.workers[ordinal] = w
        return w

    def start_router(self):
        self.generation += 1
        self.router = Router(self.procs, self.args.python, self.env, self.generation)
        return self.router

    def mismatches(self, prompts):
        """Where the router's view differs from an engine's own answer, as a list."""
        bad = []
        live = {str(w.instance_id): w for w in self.workers.values()}
        for p in prompts:
            seen = self.router.overlap(p)
            for key, blocks in seen.items():
                if key not in live and blocks:
                    bad.append((p["name"], key, "gone", blocks))
            for key, w in live.items():
                want = w.engine.held(p) // BLOCK
                if seen.get(key, 0) != want:
                    bad.append((p["name"], w.ordinal, seen.get(key, 0), want))
        return bad

    def settle(self, prompts, what, timeout=RECOVERY_BOUND_S):
        """Waits until the router's view equals the engines' answers; returns the seconds taken."""
        t0 = time.monotonic()
        while True:
            bad = self.mismatches(prompts)
            if not bad:
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                with open(os.path.join(self.logdir, "router-dump.json"), "w") as f:
                    json.dump({"workers": {w.ordinal: w.instance_id for w in self.workers.values()},
                               "mismatches": bad, "dump": self.router.call({"op": "dump"}, allow_error=True)}, f)
                raise Failed(f"{what}: the router still differs from the engines after {timeout} s: {bad[:6]}")
            time.sleep(0.2)


def port_open(port):
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def image_prompt(rng, engine, name, uuid, pixels):
    """A 194-token prompt: 32 text tokens, one image of 64 placeholders at 33..97 given by `uuid`,
    then text; with the per-block `block_mm_infos` a frontend sends Dynamo for it."""
    h = engine.call({"op": "mm_hash", "uuid": uuid})["mm_hash"]

    def obj(s, e):
        return {"mm_objects": [{"mm_hash": h, "offsets": [[s, e]]}]}

    text = [rng.randrange(1000, 60_000) for _ in range(32 + 32 + 2 * BLOCK)]
    tokens = text[:32] + [VISION_START] + [IMAGE_PAD] * 64 + [VISION_END] + text[32:]
    return {"name": name, "tokens": tokens, "image": {"pixels": pixels, "uuid": uuid, "start": 33, "len": 64},
            "block_mm_infos": [None, obj(1, 32), obj(0, 32), obj(0, 1)]}


def make_load(seed, engine):
    """Prompts: 6 shared text prefixes of 3 blocks with 2 unique blocks each, and image prompts
    (one image of 64 placeholders at 33..97) over 3 images given by UUID, each asked several
    times; returns (distinct prompts, the request order)."""
    rng = random.Random(seed)

    def text(n):
        return [rng.randrange(1000, 60_000) for _ in range(n)]

    prompts = []
    prefixes = [text(3 * BLOCK) for _ in range(6)]
    for i, pre in enumerate(prefixes):
        for j in range(3):
            prompts.append({"name": f"text{i}.{j}", "tokens": pre + text(2 * BLOCK) + text(2)})
    for k in range(3):
        uuid = f"5b1f0c2e-image-{k}"
        h = engine.call({"op": "mm_hash", "uuid": uuid})["mm_hash"]

        def obj(s, e):
            return {"mm_objects": [{"mm_hash": h, "offsets": [[s, e]]}]}

        head, tail = text(32), text(32)
        for j in range(2):
            tokens = head + [VISION_START] + [IMAGE_PAD] * 64 + [VISION_END] + tail + text(2 * BLOCK)
            prompts.append({"name": f"image{k}.{j}", "tokens": tokens,
                            "image": {"pixels": f"pixels of image {k}", "uuid": uuid, "start": 33, "len": 64},
                            "block_mm_infos": [None, obj(1, 32), obj(0, 32), obj(0, 1)]})
    order = []
    for _ in range(3):
        batch = list(prompts)
        rng.shuffle(batch)
        order.extend(batch)
    return prompts, order


def routed_load(fleet, prompts, order, strict=True):
    """Routes every request of `order` through Dynamo; returns (cached tokens, prompt tokens)."""
    cached = total = 0
    for p in order:
        if strict:
            fleet.settle(prompts if len(prompts) < 8 else [p], f"before {p['name']}", timeout=10)
            # Dynamo weighs a worker's requests in flight against its cached prefix, and it
            # releases a finished request after the answer's stream ends: wait until it counts
            # none, so that the pick below is decided by the prefix alone.
            wait_until(lambda: fleet.router.call({"op": "loads", "tokens": p["tokens"],
                                                  "block_mm_infos": p.get("block_mm_infos")})
                       ["active_requests"] == 0, 10, f"Dynamo's requests in flight to end before {p['name']}")
            held = {w.ordinal: w.engine.held(p) for w in fleet.workers.values()}
        answer = fleet.router.call({"op": "route", "tokens": p["tokens"], "image": p.get("image"),
                                    "block_mm_infos": p.get("block_mm_infos")})
        if strict:
            best = max(held.values())
            check(answer["cached"] == held[answer["ordinal"]],
                  f"{p['name']}: worker {answer['ordinal']} found {answer['cached']}, held {held}")
            check(held[answer["ordinal"]] == best,
                  f"{p['name']}: Dynamo picked worker {answer['ordinal']} holding {held[answer['ordinal']]} "
                  f"tokens, the longest prefix is {best} ({held})")
        cached += answer["cached"]
        total += len(p["tokens"])
    return cached, total


def round_robin_load(fleet, order):
    ids = [fleet.workers[k].instance_id for k in sorted(fleet.workers)]
    cached = total = 0
    for i, p in enumerate(order):
        answer = fleet.router.call({"op": "route_to", "instance_id": ids[i % len(ids)], "tokens": p["tokens"],
                                    "image": p.get("image"), "block_mm_infos": p.get("block_mm_infos")})
        cached += answer["cached"]
        total += len(p["tokens"])
    return cached, total


def run(args, logdir):
    fleet = Fleet(args, logdir)
    t0 = time.monotonic()
    try:
        fleet.start_services()
        for k in range(3):
            fleet.start_worker(k)
        fleet.start_router()
        wait_until(lambda: len(fleet.router.instances()) == 3, RECOVERY_BOUND_S, "the router sees 3 workers")
        report(phase="start", seconds=round(time.monotonic() - t0, 2),
               worker_startup_s=[w.startup_s for w in fleet.workers.values()],
               router_startup_s=fleet.router.startup_s)
        prompts, order = make_load(args.seed, fleet.workers[0].engine)

        # An image given by a UUID is served by one worker, then the same UUID with other pixels
        # by another worker that has never seen the UUID. That engine reuses none of the image's blocks (content is the cache
        # identity), but nothing tells it the UUID named other pixels elsewhere, so it publishes
        # its image blocks under the UUID's mm_hash, and Dynamo's router, which keys image blocks
        # by that mm_hash, then believes the second worker holds the first image.
        # docs/deployment.md describes this; the check below holds the behaviour seen, so a
        # change on either side shows here.
        wrong = []
        rng = random.Random(args.seed + 3)
        first, second = fleet.workers[0], fleet.workers[1]
        for k in range(2):
            uuid = f"9d4e7a10-late-image-{k}"
            genuine = image_prompt(rng, first.engine, f"late{k}", uuid, f"pixels of late image {k}")
            other = dict(genuine, name=f"late{k}.other-pixels",
                         image=dict(genuine["image"], pixels=f"other pixels under the UUID of late image {k}"))
            fleet.router.call({"op": "route_to", "instance_id": first.instance_id, "tokens": genuine["tokens"],
                               "image": genuine["image"], "block_mm_infos": genuine["block_mm_infos"]})
            # Only the first engine is asked what it holds here: an engine asked about the genuine
            # image has seen the UUID with its pixels, and then refuses the UUID for other pixels.
            want = first.engine.held(genuine) // BLOCK
            wait_until(lambda: fleet.router.overlap(genuine).get(str(first.instance_id), 0) == want, 10,
                       f"{genuine['name']} known on worker {first.ordinal}")
            answer = fleet.router.call({"op": "route_to", "instance_id": second.instance_id, "tokens": other["tokens"],
                                        "image": other["image"], "block_mm_infos": other["block_mm_infos"]})
            check(answer["cached"] == 0, f"{other['name']}: the engine reused {answer['cached']} tokens")
            check(second.engine.held(genuine) <= BLOCK, f"{other['name']}: the engine holds the genuine image's blocks")
            try:
                wait_until(lambda: fleet.router.overlap(genuine).get(str(second.instance_id), 0) > 1, 10,
                           f"{other['name']}: the router believing the UUID's blocks on worker {second.ordinal}")
            except Failed as e:
                raise Failed(f"{e}; the router's overlap {fleet.router.overlap(genuine)}, "
                             f"workers {[(w.ordinal, w.instance_id) for w in fleet.workers.values()]}") from None
            wrong.append({"prompt": genuine["name"], "worker": second.ordinal,
                          "router_blocks": fleet.router.overlap(genuine)[str(second.instance_id)],
                          "engine_blocks": second.engine.held(genuine) // BLOCK})
        check(all(w["router_blocks"] > w["engine_blocks"] for w in wrong), f"{wrong}")
        report(phase="uuid_with_other_pixels_on_another_worker", believed_wrongly=wrong)

        # Routing: Dynamo picks, the engines answer.
        kv_cached, total = routed_load(fleet, prompts, order)
        fleet.settle(prompts, "after the load")
        # The same load again, round-robin, on emptied engines.
        for w in fleet.workers.values():
            w.engine.call({"op": "clear"})
        fleet.settle(prompts, "after clearing the engines")
        rr_cached, _ = round_robin_load(fleet, order)
        fleet.settle(prompts, "after the round-robin load")
        report(phase="routing", requests=len(order), kv_hit_rate=round(kv_cached / total, 4),
               round_robin_hit_rate=round(rr_cached / total, 4))
        check(kv_cached > rr_cached, f"KV routing hit {kv_cached} tokens, round-robin {rr_cached}")

        timings = {}

        # A worker killed: its blocks leave the router's view.
        victim = fleet.workers.pop(2)
        t = time.monotonic()
        fleet.procs.kill(victim.proc)
        victim.engine.kill()
        wait_until(lambda: victim.instance_id not in fleet.router.instances(), RECOVERY_BOUND_S,
                   "the killed worker leaves discovery")
        fleet.settle(prompts, "after a worker was killed")
        timings["worker_killed_s"] = round(time.monotonic() - t, 2)
        routed_load(fleet, prompts, order[:10])
        report(phase="worker_killed", seconds=timings["worker_killed_s"])

        # A worker restarted with an empty cache (a new engine, a new instance).
        t = time.monotonic()
        fresh = fleet.start_worker(2)
        wait_until(lambda: fresh.instance_id in fleet.router.instances(), RECOVERY_BOUND_S,
                   "the restarted worker joins")
        fleet.settle(prompts, "after a worker restarted empty")
        timings["worker_restarted_empty_s"] = round(time.monotonic() - t, 2)
        routed_load(fleet, prompts, order[10:25])
        report(phase="worker_restarted_empty", seconds=timings["worker_restarted_empty_s"])

        # A worker's Dynamo side restarted while its engine kept its cache.
        old = fleet.workers[1]
        held_before = sum(old.engine.held(p) for p in prompts)
        check(held_before > 0, "worker 1 holds nothing before its restart")
        t = time.monotonic()
        fleet.procs.kill(old.proc)
        back = fleet.start_worker(1, engine=old.engine)
        wait_until(lambda: back.instance_id in fleet.router.instances() and old.instance_id not in
                   fleet.router.instances(), RECOVERY_BOUND_S, "the restarted worker replaces the old instance")
        fleet.settle(prompts, "after a worker restarted with its engine's cache")
        timings["worker_restarted_with_cache_s"] = round(time.monotonic() - t, 2)
        report(phase="worker_restarted_with_cache", seconds=timings["worker_restarted_with_cache_s"],
               held_tokens=held_before)

        # The router restarted mid-load. The restarted worker's own state publications are over
        # by now (dynamo_worker.py's --republish-s), so what the new router learns it learns
        # from Dynamo's own recovery.
        routed_load(fleet, prompts, order[25:35])
        time.sleep(max(0.0, back.started + REPUBLISH_WINDOW_S - time.monotonic()))
        t = time.monotonic()
        fleet.procs.kill(fleet.router.proc)
        fleet.start_router()
        wait_until(lambda: len(fleet.router.instances()) == 3, RECOVERY_BOUND_S, "the new router sees 3 workers")
        fleet.settle(prompts, "after the router restarted")
        timings["router_restarted_s"] = round(time.monotonic() - t, 2)
        routed_load(fleet, prompts, order[35:45])
        report(phase="router_restarted", seconds=timings["router_restarted_s"])

        # NATS restarted, with requests served while it was down.
        t = time.monotonic()
        fleet.procs.kill(fleet.nats)
        routed_load(fleet, prompts, order[45:50], strict=False)
        fleet.start_nats()
        fleet.settle(prompts, "after NATS restarted")
        timings["nats_restarted_s"] = round(time.monotonic() - t, 2)
        routed_load(fleet, prompts, order[50:])
        report(phase="nats_restarted", seconds=timings["nats_restarted_s"])

        # A relay (the engine stream's subscriber) stalls, shorter than its lease, while its engine
        # keeps committing: the engine's socket keeps the batches, the relay forwards them when it
        # resumes.
        stalled = fleet.workers[0]
        fleet.procs.kill(stalled.proc, signal.SIGSTOP)
        extra = [dict(p, name=p["name"] + "+") for p in make_load(args.seed + 1, stalled.engine)[0][:6]]
        for p in extra:
            stalled.engine.call({"op": "serve", "tokens": p["tokens"], "image": p.get("image")})
        time.sleep(max(0.0, args.lease_ttl_s / 2 - 0.5))
        key = str(stalled.instance_id)
        unseen = [p["name"] for p in extra if fleet.router.overlap(p).get(key, 0) < stalled.engine.held(p) // BLOCK]
        check(unseen, "the router learnt the stalled relay's blocks while it was stopped")
        t = time.monotonic()
        fleet.procs.kill(stalled.proc, signal.SIGCONT)
        fleet.settle(prompts + extra, "after a stalled relay resumed")
        timings["relay_stall_s"] = round(time.monotonic() - t, 2)
        report(phase="relay_stalled", seconds=timings["relay_stall_s"], unseen_during_stall=len(unseen))

        # The same worker stalled past its etcd lease: discovery drops it and the router forgets
        # its blocks (believing nothing it cannot reach). Resumed, the process has lost its lease
        # and stays out of discovery; restarting its Dynamo side on the same engine brings the
        # engine's cache back into the router's view.
        t = time.monotonic()
        fleet.procs.kill(stalled.proc, signal.SIGSTOP)
        fleet.workers.pop(0)
        wait_until(lambda: stalled.instance_id not in fleet.router.instances(), RECOVERY_BOUND_S,
                   "a worker stalled past its lease leaves discovery")
        fleet.settle(prompts + extra, "after a worker stalled past its lease")
        timings["worker_stalled_past_lease_dropped_s"] = round(time.monotonic() - t, 2)
        fleet.procs.kill(stalled.proc, signal.SIGCONT)
        time.sleep(2.0)
        rejoined = stalled.instance_id in fleet.router.instances()
        check(not rejoined, "the stalled worker came back under its old instance")
        t = time.monotonic()
        fleet.procs.kill(stalled.proc)
        back0 = fleet.start_worker(0, engine=stalled.engine)
        wait_until(lambda: back0.instance_id in fleet.router.instances(), RECOVERY_BOUND_S,
                   "the stalled worker's replacement joins")
        fleet.settle(prompts + extra, "after the stalled worker was replaced")
        timings["worker_stalled_past_lease_replaced_s"] = round(time.monotonic() - t, 2)
        report(phase="worker_stalled_past_lease", dropped_s=timings["worker_stalled_past_lease_dropped_s"],
               rejoined_by_itself=rejoined, replaced_s=timings["worker_stalled_past_lease_replaced_s"])

        # The router (the NATS subscriber) stalls while the engines keep committing.
        fleet.procs.kill(fleet.router.proc, signal.SIGSTOP)
        more = [dict(p, name=p["name"] + "*") for p in make_load(args.seed + 2, stalled.engine)[0][:6]]
        for i, p in enumerate(more):
            fleet.workers[sorted(fleet.workers)[i % 3]].engine.call(
                {"op": "serve", "tokens": p["tokens"], "image": p.get("image")})
        time.sleep(max(0.0, args.lease_ttl_s / 2 - 0.5))
        t = time.monotonic()
        fleet.procs.kill(fleet.router.proc, signal.SIGCONT)
        fleet.settle(prompts + extra + more, "after a stalled router resumed")
        timings["router_stall_s"] = round(time.monotonic() - t, 2)
        report(phase="router_stalled", seconds=timings["router_stall_s"])


        report(ok=True, seconds=round(time.monotonic() - t0, 2), kv_hit_rate=round(kv_cached / total, 4),
               round_robin_hit_rate=round(rr_cached / total, 4), recovery_s=timings,
               uuid_with_other_pixels=wrong)
        return 0
    except Failed as e:
        report(ok=False, error=str(e), logs=logdir)
        return 1
    finally:
        fleet.procs.stop_all()


def without_uuid(prompt):
    """The prompt with its image given by pixels alone, for asking an engine what it holds: the
    engine's answer is the same (content is the cache identity), and an engine asked with the UUID
    would learn the UUID with those pixels and stop hinting it for others (its own, correct,
    protection), which would hide what the relay does."""
    return dict(prompt, image=dict(prompt["image"], uuid=None))


def with_infos(prompt, name, mm_hash):
    """The prompt asked of the router with `mm_hash` in its `block_mm_infos` instead."""
    def obj(s, e):
        return {"mm_objects": [{"mm_hash": mm_hash, "offsets": [[s, e]]}]}

    return dict(without_uuid(prompt), name=name, block_mm_infos=[None, obj(1, 32), obj(0, 32), obj(0, 1)])


def run_uuid_through_kvcore_relay(args, logdir):
    """`kvcore relay` between the engines and Dynamo's relays: each Dynamo worker's
    KvEventPublisher reads the kvcore relay's republished stream of its engine. A UUID given
    with other pixels on another worker: while both copies are held, the router believes no
    image block by the UUID on any worker and finds each pixels' holder by the content-derived
    mm_hash; once the other copy is gone, the UUID matches its holder again."""
    fleet = Fleet(args, logdir)
    t0 = time.monotonic()
    try:
        fleet.start_services()
        engines = [Engine(fleet.procs, args.kvcore, f"engine{k}.0") for k in range(3)]
        relay = fleet.procs.spawn("kvcore-relay", [
            args.kvcore, "relay", "--block-size", str(BLOCK), "--resync",
            "--upstream", ",".join(f"{e.pub}@{e.replay}" for e in engines),
            "--bind", ",".join(["tcp://127.0.0.1:*@tcp://127.0.0.1:*"] * 3)])
        streams = first_line(relay)["workers"]
        for k, e in enumerate(engines):
            # --bypass-relay: the workers read the engines directly (the relay still runs), to see
            # the checks below fail without it.
            fleet.start_worker(k, engine=e, pub=None if args.bypass_relay else streams[k]["endpoint"])
        fleet.start_router()
        wait_until(lambda: len(fleet.router.instances()) == 3, RECOVERY_BOUND_S, "the router sees 3 workers")
        report(phase="start", seconds=round(time.monotonic() - t0, 2), relay_streams=streams,
               bypass_relay=args.bypass_relay)
        rng = random.Random(args.seed + 3)
        first, second = fleet.workers[0], fleet.workers[1]
        cases = []
        for k in range(2):
            uuid = f"9d4e7a10-late-image-{k}"
            genuine = image_prompt(rng, first.engine, f"late{k}", uuid, f"pixels of late image {k}")
            other = dict(genuine, name=f"late{k}.other-pixels",
                         image=dict(genuine["image"], pixels=f"other pixels under the UUID of late image {k}"))
            fleet.router.call({"op": "route_to", "instance_id": first.instance_id, "tokens": genuine["tokens"],
                               "image": genuine["image"], "block_mm_infos": genuine["block_mm_infos"]})
            want = first.engine.held(genuine) // BLOCK
            check(want == 6, f"{genuine['name']}: engine 0 holds {want} blocks")
            wait_until(lambda: fleet.router.overlap(genuine).get(str(first.instance_id), 0) == want, 10,
                       f"{genuine['name']} known by its UUID on worker {first.ordinal}")
            answer = fleet.router.call({"op": "route_to", "instance_id": second.instance_id, "tokens": other["tokens"],
                                        "image": other["image"], "block_mm_infos": other["block_mm_infos"]})
            check(answer["cached"] == 0, f"{other['name']}: the engine reused {answer['cached']} tokens")
            by_content = [with_infos(p, p["name"] + ".by-content",
                                     first.engine.call({"op": "mm_hash", "pixels": p["image"]["pixels"]})["mm_hash"])
                          for p in (genuine, other)]
            cases.append((genuine, other, by_content))

        def by_uuid_view():
            """Where the router's view of the prompts named by UUID differs from 'the text block
            before the image wherever an engine holds it, no image block anywhere'."""
            bad = []
            for genuine, _, _ in cases:
                seen = fleet.router.overlap(genuine)
                for w in fleet.workers.values():
                    want = min(w.engine.held(without_uuid(genuine)) // BLOCK, 1)
                    if seen.get(str(w.instance_id), 0) != want:
                        bad.append((genuine["name"], w.ordinal, seen.get(str(w.instance_id), 0), want))
            return bad

        t = time.monotonic()
        content = [p for _, _, pair in cases for p in pair]
        try:
            wait_until(lambda: not fleet.mismatches(content) and not by_uuid_view(), 10,
                       "the router's view by content and by UUID while both copies are held")
        except Failed as e:
            raise Failed(f"{e}: by content {fleet.mismatches(content)}, by UUID {by_uuid_view()}") from None
        ambiguous_s = round(time.monotonic() - t, 2)
        held = {p["name"]: {w.ordinal: w.engine.held(p) // BLOCK for w in fleet.workers.values()} for p in content}
        check(all(held[g["name"]][0] == 6 and held[o["name"]][1] == 6 for _, _, (g, o) in cases), f"{held}")
        report(phase="uuid_with_other_pixels_through_kvcore_relay", seconds=ambiguous_s, held_by_content=held)

        # The other pixels gone from worker 1: the UUID names one image fleet-wide again, and the
        # relay stores worker 0's image blocks under the UUID's mm_hash again (so they are no longer
        # found by the content-derived one); nobody holds the other pixels.
        t = time.monotonic()
        second.engine.call({"op": "clear"})
        genuine_only = [without_uuid(g) for g, _, _ in cases]
        try:
            gone = [o for _, _, (_, o) in cases]
            wait_until(lambda: not fleet.mismatches(genuine_only + gone), 10,
                       "the UUID matches its holder again once the other copy is gone")
        except Failed as e:
            raise Failed(f"{e}: {fleet.mismatches(genuine_only + gone)}") from None
        resolved_s = round(time.monotonic() - t, 2)
        by_uuid = {g["name"]: fleet.router.overlap(g).get(str(first.instance_id), 0) for g in genuine_only}
        check(all(v == 6 for v in by_uuid.values()), f"{by_uuid}")
        report(ok=True, seconds=round(time.monotonic() - t0, 2), ambiguous_settled_s=ambiguous_s,
               resolved_s=resolved_s, by_uuid_on_holder=by_uuid)
        return 0
    except Failed as e:
        report(ok=False, error=str(e), logs=logdir)
        return 1
    finally:
        fleet.procs.stop_all()


def run_without_local_indexer(args, logdir):
    """The router restarted when the workers' relays run without Dynamo's worker-local indexer:
    the new router learns nothing of what the engines already hold (it sees only what they
    publish from then on); the engines' own state publication (`republish`) brings it back."""
    fleet = Fleet(args, logdir)
    t0 = time.monotonic()
    try:
        fleet.start_services()
        for k in range(3):
            fleet.start_worker(k)
        fleet.start_router()
        wait_until(lambda: len(fleet.router.instances()) == 3, RECOVERY_BOUND_S, "the router sees 3 workers")
        prompts, order = make_load(args.seed, fleet.workers[0].engine)
        time.sleep(max(0.0, max(w.started for w in fleet.workers.values()) + REPUBLISH_WINDOW_S - time.monotonic()))
        routed_load(fleet, prompts, order[:30])
        held = sum(w.engine.held(p) for w in fleet.workers.values() for p in prompts) // BLOCK
        check(held > 0, "the engines hold nothing")
        fleet.procs.kill(fleet.router.proc)
        fleet.start_router()
        wait_until(lambda: len(fleet.router.instances()) == 3, RECOVERY_BOUND_S, "the new router sees 3 workers")
        time.sleep(args.blind_wait_s)
        bad = fleet.mismatches(prompts)
        known = sum(sum(fleet.router.overlap(p).values()) for p in prompts)
        check(known == 0 and bad, f"the new router knew {known} blocks of the engines' {held} without the "
              "worker-local indexer")
        t = time.monotonic()
        for w in fleet.workers.values():
            w.engine.call({"op": "republish"})
        fleet.settle(prompts, "after the engines published their state")
        republish_s = round(time.monotonic() - t, 2)
        routed_load(fleet, prompts, order[30:45])
        report(ok=True, seconds=round(time.monotonic() - t0, 2), held_blocks=held,
               known_after_restart=known, blind_after_s=args.blind_wait_s, recovered_by_republish_s=republish_s)
        return 0
    except Failed as e:
        report(ok=False, error=str(e), logs=logdir)
        return 1
    finally:
        fleet.procs.stop_all()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvcore", required=True)
    ap.add_argument("--etcd", default=shutil.which("etcd") or "etcd")
    ap.add_argument("--nats", default=shutil.which("nats-server") or "nats-server")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--lease-ttl-s", type=int, default=5,
                    help="etcd lease TTL of each Dynamo process (ETCD_LEASE_TTL): how long a killed worker stays listed")
    ap.add_argument("--no-local-indexer", action="store_true",
                    help="workers run Dynamo's relay without its worker-local indexer (to see what it recovers)")
    ap.add_argument("--no-republish", action="store_true",
                    help="workers do not ask their engine to publish its state after start (likewise)")
    ap.add_argument("--seed", type=int, default=24)
    ap.add_argument("--logs", default=None, help="folder for the processes' logs (default: a new temp folder)")
    ap.add_argument("--scenario", choices=["faults", "router-restart-without-local-indexer", "uuid-through-kvcore-relay"],
                    default="faults",
                    help="faults: routing and every fault (the default); router-restart-without-local-indexer: "
                    "what a restarted router learns when the relays keep no local indexer; "
                    "uuid-through-kvcore-relay: a UUID with other pixels on another worker, with `kvcore relay` "
                    "between the engines and Dynamo's relays")
    ap.add_argument("--bypass-relay", action="store_true",
                    help="uuid-through-kvcore-relay: Dynamo's relays read the engines, not `kvcore relay`")
    ap.add_argument("--blind-wait-s", type=float, default=5.0,
                    help="how long the second scenario waits before checking the new router learnt nothing")
    args = ap.parse_args()
    if args.scenario == "router-restart-without-local-indexer":
        args.no_local_indexer = True
    logdir = args.logs or tempfile.mkdtemp(prefix="kvcore-fleet-")
    os.makedirs(logdir, exist_ok=True)
    scenarios = {"faults": run, "router-restart-without-local-indexer": run_without_local_indexer,
                 "uuid-through-kvcore-relay": run_uuid_through_kvcore_relay}
    sys.exit(scenarios[args.scenario](args, logdir))


if __name__ == "__main__":
    main()
