"""The soak run: an embedded server on a copy of the model repository, client threads
sending a mixed workload over HTTP and gRPC, and faults injected on a schedule.

Schedule (phases in order; a request belongs to the phase in which it was sent):

1. ``healthy``: no fault, ``healthy_s`` seconds.
2. ``classifier_unloaded``: ``classifier`` unloaded through the repository API, traffic
   for ``unloaded_s`` seconds, loaded again, ``settle_s`` seconds.
3. ``stub_killed``: the ``classifier_fast`` stub (a child of the server this run started,
   found by its instance-name argument) gets SIGKILL, ``kills`` times in a row: each time
   until a new stub process runs and ``classifier_fast`` answers a request sent after that
   kill (or ``recovery_timeout_s``), then ``after_kill_s`` seconds (short, so the phase is
   mostly the time the stub was dead). No operator action: the router's own repair is
   measured, one heal per kill.
4. ``router_reload``: the loaded ``router`` is reloaded with new instances (repository
   API, its configuration with one parameter changed), then ``settle_s`` seconds.
5. ``oversized``: ``oversized_count`` requests with one text of ``oversized_bytes`` bytes,
   one after another (HTTP and gRPC in turn); 10 ms after each is sent, a normal one-text
   request (a probe) is sent and timed. The router stub's RSS is read before and after.

The server runs under the shipped image's conditions (:mod:`orchestrator.tooling.production`):
the repository copy's bytecode compiled before the first load and the copy read-only (a
plain load of a loaded model then starts no new stub in Triton 2.51, so only a forced
reload heals), the control plane restricted to a key with the image's flags; the soak's own
loads and unloads send the key.

The run stops by itself: after the schedule, at ``max_duration_s`` (remaining phases are
skipped) or after ``max_requests`` requests.
"""

from __future__ import annotations

import datetime
import random
import shutil
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import yaml

from lab.bench.stack import describe as describe_stack
from lab.bench.stack import parse_urls, read_stack, served
from lab.soak import procs
from lab.soak.clients import Client, make_inputs, result_fields
from lab.soak.ledger import Ledger, Record
from lab.soak.workload import (
    ACCURATE,
    FAST,
    Mix,
    RequestSpec,
    TextPool,
    build_pool,
    cascade_margin,
    check_answer,
    chunk_stops_early,
    compute_references,
    draw_request,
    needed_models,
    route_model,
)
from orchestrator.tooling import production
from orchestrator.tooling.errors import ToolingError

PHASES = ("healthy", "classifier_unloaded", "stub_killed", "router_reload", "oversized")
#: The model each phase breaks (None: none; the router reload breaks every request's path).
BROKEN = {"healthy": None, "classifier_unloaded": ACCURATE, "stub_killed": FAST, "router_reload": "router", "oversized": None}
FAST_INSTANCE = f"{FAST}_0_0"
ROUTER_INSTANCE = "router_0_0"


class SoakError(ToolingError):
    """The soak could not run: no server, no healthy reference, a stub not found."""


@dataclass(frozen=True)
class SoakConfig:
    """How long and how hard the soak runs (seconds, counts); see the module doc.

    ``http_threads`` / ``grpc_threads``: client threads per protocol, each sending one
    request after another; ``client_timeout_s``: a request with no response by then is
    LOST; ``n_short`` / ``n_long``: texts in the pool; ``oversized_bytes``: size of the
    oversized text (8 MiB); ``seed``: texts and requests are drawn from it;
    ``front_door``: the clients go through nginx (``--front-door``), the faults straight to
    the server.
    """

    http_threads: int = 4
    grpc_threads: int = 4
    healthy_s: float = 60.0
    unloaded_s: float = 30.0
    settle_s: float = 20.0
    after_kill_s: float = 2.0
    kills: int = 3
    recovery_timeout_s: float = 60.0
    oversized_count: int = 20
    oversized_bytes: int = 8 * 1024 * 1024
    client_timeout_s: float = 30.0
    front_door: bool = False
    max_duration_s: float = 600.0
    max_requests: int = 200_000
    n_short: int = 400
    n_long: int = 40
    seed: int = 0
    mix: Mix = field(default_factory=Mix)


#: ``make soak``: about 3 minutes of traffic on 2 cores.
FULL = SoakConfig()
#: The version in ``make test`` (tests/server/test_soak.py): well under a minute of traffic.
SHORT = SoakConfig(
    http_threads=2, grpc_threads=2, healthy_s=4.0, unloaded_s=3.0, settle_s=2.0, kills=2, recovery_timeout_s=35.0,
    client_timeout_s=20.0, max_duration_s=100.0, max_requests=20_000, n_short=96, n_long=8,
)


def copy_repository(source: Path, dest: Path) -> Path:
    """Copy the model repository ``source`` to ``dest`` for the soak's own server (without
    the execution-environment artifacts ``make env`` may have installed, ~120 MB a model)."""
    shutil.copytree(
        source, dest,
        ignore=shutil.ignore_patterns("__pycache__", "triton_env*", "triton_python_backend_stub*", "env.pbtxt"),
    )
    return dest


def models_to_load(policy: dict) -> List[str]:
    """The models the shipped policy calls: the classifiers and the router, plus the
    tokenizer and postprocess models when the policy does not ``inline`` them."""
    models = [ACCURATE, FAST, "router"]
    return models if policy.get("inline") else ["tokenizer", "postprocess", *models]


#: The fault steps a soak against a server it did not start (``--url``) leaves out, and why.
EXTERNAL_SKIPS: Dict[str, str] = {
    "classifier_unloaded": "unloads and reloads a model through the control plane: not done to a server this command did not start",
    "stub_killed": "kills a Python-backend stub process: needs the server's processes on this machine",
    "router_reload": "reloads the router through the control plane: not done to a server this command did not start",
    "oversized": "reads the router stub's memory in /proc: needs the server's processes on this machine",
}


class Soak:
    """One soak run against ``server`` (a started :class:`~orchestrator.tooling.server.TritonServer`
    serving the shipped policy); :meth:`run` returns the raw results for the report."""

    def __init__(self, server, config: SoakConfig, pool: TextPool, margin: Optional[float],
                 log: Callable[[str], None] = print) -> None:
        self.server, self.config, self.pool, self.margin, self.log = server, config, pool, margin, log
        #: fault steps that cannot run against this server, with the reason (a server this
        #: command did not start: no local processes to kill or read, models not ours to unload)
        self.not_run: Dict[str, str] = EXTERNAL_SKIPS if getattr(server, "external", False) else {}
        self.ledger = Ledger()
        self.events: List[dict] = []
        self.phase = PHASES[0]
        self.phase_starts: Dict[str, float] = {}
        self.skipped: List[str] = []
        self.stop = threading.Event()
        self.t0 = time.monotonic()
        self.deadline = self.t0 + config.max_duration_s
        self.kill_time: Optional[float] = None
        self.new_stub: Optional[dict] = None
        self.heals: List[dict] = []
        self.oversized: List[dict] = []
        self.rss: dict = {}
        self._encoded = [t.encode("utf-8") for t in pool.texts]
        self._phase_lock = threading.Lock()

    # ------------------------------------------------------------------ events, phases

    def event(self, what: str, **detail) -> None:
        t = time.monotonic() - self.t0
        # wall clock too: to find the moment in the server log
        wall = datetime.datetime.now().strftime("%H:%M:%S.%f")[:-3]
        self.events.append({"t_s": round(t, 3), "wall": wall, "event": what, **detail})
        self.log(f"[soak {t:7.2f} s] {what}" + (f" {detail}" if detail else ""))

    def enter(self, phase: str) -> None:
        with self._phase_lock:
            self.phase = phase
            self.phase_starts[phase] = time.monotonic()
        self.event(f"phase {phase}")

    def _sleep(self, seconds: float) -> bool:
        """Sleep unless the run must end; False when it must (deadline, request bound)."""
        end = min(time.monotonic() + seconds, self.deadline)
        while time.monotonic() < end:
            if self.stop.is_set():
                return False
            time.sleep(0.05)
        return time.monotonic() < self.deadline and not self.stop.is_set()

    # ------------------------------------------------------------------ sending

    def send(self, client: Client, spec: RequestSpec, probe: bool = False) -> Record:
        """Send ``spec`` with ``client`` and record its outcome in the ledger (blocks)."""
        with self._phase_lock:
            phase = self.phase
        rec = Record(spec, phase, needed_models(spec, self.pool, self.margin), time.monotonic(), probe=probe)
        self.ledger.add(rec)
        inputs = make_inputs(spec.protocol, [self._encoded[i] for i in spec.texts], spec.thresholds)
        parameters = {"route": spec.route} if spec.route else None
        rid = spec.request_id

        def on_result(result, t):
            try:
                carried, probs, verdicts, routes = result_fields(spec.protocol, result)
                problems = check_answer(spec, self.pool, probs, verdicts, routes)
            except Exception as exc:  # noqa: BLE001 - an unreadable answer is a wrong one
                carried, routes, problems = rid, [], [f"unreadable answer: {type(exc).__name__}: {exc}"]
            self.ledger.answer(rid, carried, t, problems, routes)

        def on_error(status, message, t):
            self.ledger.fail(rid, rid, t, status, message)

        client.send(rid, inputs, parameters, on_result, on_error, lambda reason: self.ledger.lose(rid, reason))
        return rec

    def worker(self, index: int, protocol: str) -> None:
        rng = random.Random(f"{self.config.seed}-{index}")
        url = self.server.http_url if protocol == "http" else self.server.grpc_url
        client = Client(protocol, url, self.config.client_timeout_s)
        seq = 0
        try:
            while not self.stop.is_set() and time.monotonic() < self.deadline:
                if len(self.ledger) >= self.config.max_requests:
                    self.stop.set()
                    break
                seq += 1
                spec = draw_request(rng, self.pool, f"soak-{index}-{seq}", protocol, self.config.mix)
                self.send(client, spec)
        finally:
            client.close()

    # ------------------------------------------------------------------ faults

    def control(self, action: str, model: str) -> None:
        """``load``, ``reload`` or ``unload`` ``model`` through gRPC's repository API with
        the server's key; an unload waits until the model is no longer ready (at most 60 s).
        ``reload`` sends the loaded configuration with one parameter changed
        (``control.repair_config``): the repository copy is read-only and compiled, so a
        plain load of a loaded model would do nothing (Triton 2.51).

        Not through HTTP: Triton 2.51 runs an HTTP load/unload on the HTTP worker thread
        that received it until the load ends, and an HTTP inference request that the same
        worker thread picks up meanwhile waits for it (measured here: a request sent
        with a router reload waited the whole 6-8 s of the load; none did with the load
        sent over gRPC). That would be a stall of the operator's making, not the router's.
        """
        import json

        import tritonclient.grpc as grpcclient

        from orchestrator.runtime.bls.control import repair_config

        # the server's own port, also behind the front door (which does not admit the admin APIs)
        client = grpcclient.InferenceServerClient(getattr(self.server, "admin_grpc_url", self.server.grpc_url))
        headers = self.server.control_headers("grpc")
        try:
            if action == "reload":
                config = client.get_model_config(model, headers=headers, as_json=True)["config"]
                client.load_model(model, headers=headers, config=json.dumps(repair_config(config, str(time.time_ns()))))
            else:
                getattr(client, f"{action}_model")(model, headers=headers)
            deadline = time.monotonic() + 60.0
            while action == "unload" and client.is_model_ready(model) and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            client.close()

    def unload_classifier(self) -> None:
        self.enter("classifier_unloaded")
        t = time.monotonic()
        self.control("unload", ACCURATE)
        self.event("classifier unloaded", took_s=round(time.monotonic() - t, 3))
        ok = self._sleep(self.config.unloaded_s)
        t = time.monotonic()
        self.control("load", ACCURATE)  # even past the deadline: leave it loaded
        self.event("classifier loaded", took_s=round(time.monotonic() - t, 3))
        if ok:
            self._sleep(self.config.settle_s)

    def kill_fast_stub(self) -> None:
        self.enter("stub_killed")
        for i in range(self.config.kills):
            if time.monotonic() >= self.deadline or self.stop.is_set():
                self.skipped.append(f"kills {i + 1}..{self.config.kills}")
                break
            self._kill_and_heal(i + 1)
            self._sleep(self.config.after_kill_s)

    def _kill_and_heal(self, n: int) -> None:
        """One SIGKILL; wait for a new stub and a ``classifier_fast`` answer to a request
        sent after the kill; record the heal."""
        pid = procs.kill_stub(self.server.pid, FAST_INSTANCE)
        kill = time.monotonic()
        if self.kill_time is None:
            self.kill_time = kill
        self.event(f"SIGKILL classifier_fast stub ({n} of {self.config.kills})", pid=pid)
        heal: dict = {"kill": n, "at_s": round(kill - self.t0, 3), "pid": pid, "new_pid": None, "new_stub_after_s": None,
                      "fast_after_s": None}
        end = min(kill + self.config.recovery_timeout_s, self.deadline)
        while time.monotonic() < end and not self.stop.is_set():
            if heal["new_pid"] is None:
                new = procs.find_stub(self.server.pid, FAST_INSTANCE)
                if new is not None and new != pid:
                    heal.update(new_pid=new, new_stub_after_s=round(time.monotonic() - kill, 3))
                    self.event("new classifier_fast stub", pid=new, after_s=heal["new_stub_after_s"])
            back = self.ledger.first(lambda r: r.sent >= kill and r.outcome == "ok"
                                     and any(route_model(x) == FAST for x in r.routes or ()))
            if back is not None and heal["new_pid"] is not None:
                heal["fast_after_s"] = round(back.done - kill, 3)
                break
            time.sleep(0.05)
        if heal["fast_after_s"] is None:
            self.event("classifier_fast not answering", waited_s=round(time.monotonic() - kill, 3))
        else:
            self.event("classifier_fast answers again", after_s=heal["fast_after_s"])
        if self.new_stub is None and heal["new_pid"] is not None:
            self.new_stub = {"pid": heal["new_pid"], "after_s": heal["new_stub_after_s"]}
        self.heals.append(heal)

    def reload_router(self) -> None:
        self.enter("router_reload")
        before = procs.find_stub(self.server.pid, ROUTER_INSTANCE)
        t = time.monotonic()
        self.control("reload", "router")
        self.reload_window = (t, time.monotonic())
        after = procs.find_stub(self.server.pid, ROUTER_INSTANCE)
        self.event("router reloaded", took_s=round(time.monotonic() - t, 3), stub_pid_before=before, stub_pid_after=after)
        self._sleep(self.config.settle_s)

    def send_oversized(self) -> None:
        self.enter("oversized")
        cfg = self.config
        pid = procs.find_stub(self.server.pid, ROUTER_INSTANCE)
        if pid is None:
            raise SoakError(f"no live {ROUTER_INSTANCE} stub among the children of pid {self.server.pid}")
        self.rss = {"pid": pid, "before_bytes": procs.rss_bytes(pid)}
        sentence = self.pool.texts[self.pool.indices("short")[0]].encode("utf-8") + b" "
        big = (sentence * (cfg.oversized_bytes // len(sentence) + 1))[: cfg.oversized_bytes]
        probe_client = Client("http", self.server.http_url, cfg.client_timeout_s)
        try:
            for i in range(cfg.oversized_count):
                if time.monotonic() >= self.deadline:
                    self.skipped.append(f"oversized requests {i + 1}..{cfg.oversized_count}")
                    break
                self.oversized.append(self._one_oversized(i, big, "http" if i % 2 == 0 else "grpc", probe_client))
        finally:
            probe_client.close()
        time.sleep(0.5)  # let the stub free what it frees
        self.rss.update({"after_bytes": procs.rss_bytes(pid), "pid_after": procs.find_stub(self.server.pid, ROUTER_INSTANCE)})
        self.event("oversized done", **{k: v for k, v in self.rss.items()})

    def _one_oversized(self, i: int, big: bytes, protocol: str, probe_client: Client) -> dict:
        out: dict = {"protocol": protocol, "bytes": len(big)}
        done = threading.Event()

        def on_result(result, t):
            out.update(outcome="answered", done=t)

        def on_error(status, message, t):
            out.update(outcome="error", status=status, message=message, done=t)

        def on_lost(reason):
            out.update(outcome="lost", message=reason)

        def run():
            # a client of its own: tritonclient.http (gevent) must stay in the thread that made it
            url = self.server.http_url if protocol == "http" else self.server.grpc_url
            client = Client(protocol, url, self.config.client_timeout_s)
            try:
                out["sent"] = time.monotonic()
                client.send(f"soak-oversized-{i}", make_inputs(protocol, [big], [0.5]), None, on_result, on_error, on_lost)
            finally:
                client.close()
                done.set()

        thread = threading.Thread(target=run, name=f"soak-oversized-{i}", daemon=True)
        thread.start()
        time.sleep(0.01)
        in_flight = not done.is_set()
        short = self.pool.indices("short")
        spec = RequestSpec(f"soak-probe-{i}", (short[i % len(short)],), (0.5,), None, "http")
        probe = self.send(probe_client, spec, probe=True)
        out["probe_sent_in_flight"] = in_flight
        out["probe_done_in_flight"] = in_flight and not done.is_set()
        thread.join()
        out["latency_s"] = out["done"] - out["sent"] if "done" in out else None
        out["probe_latency_s"] = probe.latency_s
        out["probe_outcome"] = probe.outcome
        out.pop("done", None)
        out.pop("sent", None)
        return out

    # ------------------------------------------------------------------ the run

    def run(self) -> dict:
        cfg = self.config
        self.enter("healthy")
        threads = [
            threading.Thread(target=self.worker, args=(i, "http" if i < cfg.http_threads else "grpc"), name=f"soak-{i}", daemon=True)
            for i in range(cfg.http_threads + cfg.grpc_threads)
        ]
        for t in threads:
            t.start()
        steps = [("classifier_unloaded", self.unload_classifier), ("stub_killed", self.kill_fast_stub),
                 ("router_reload", self.reload_router), ("oversized", self.send_oversized)]
        for name, reason in self.not_run.items():
            self.event(f"{name} skipped: {reason}")
        steps = [(n, step) for n, step in steps if n not in self.not_run]
        try:
            if self._sleep(cfg.healthy_s):
                for i, (_name, step) in enumerate(steps):
                    if time.monotonic() >= self.deadline or self.stop.is_set():
                        self.skipped += [n for n, _ in steps[i:]]
                        break
                    step()
            else:
                self.skipped += [n for n, _ in steps]
        finally:
            self.stop.set()
            self.event("stopping clients")
            for t in threads:
                t.join(cfg.client_timeout_s + 15.0)
        self.event("done")
        return {
            "records": self.ledger.snapshot(),
            "t0": self.t0,
            "events": self.events,
            "phase_starts": {k: v - self.t0 for k, v in self.phase_starts.items()},
            "kill_time": self.kill_time,
            "reload_window": getattr(self, "reload_window", None),
            "new_stub": self.new_stub,
            "heals": self.heals,
            "oversized": self.oversized,
            "rss": self.rss,
            "skipped": self.skipped,
            "not_run": dict(self.not_run),
            "duration_s": time.monotonic() - self.t0,
            "config": asdict(cfg),
        }


def reference_sender(server):
    """``send(texts, route)`` for :func:`compute_references`: one HTTP request to the router."""
    client = Client("http", server.http_url, 120.0)

    def send(texts, route):
        box: dict = {}
        client.send(f"soak-reference-{route}-{time.monotonic_ns()}", make_inputs("http", [t.encode() for t in texts], [0.5] * len(texts)),
                    {"route": route}, lambda result, t: box.update(result=result),
                    lambda status, message, t: box.update(error=f"{status}: {message}"),
                    lambda reason: box.update(error=reason))
        if "result" not in box:
            raise SoakError(f"healthy reference request (route={route}) failed: {box.get('error')}")
        _, probs, _, routes = result_fields("http", box["result"])
        return probs.reshape(-1), routes

    return send, client


def run_external(urls: Sequence[str], config: SoakConfig, source: Path, log: Callable[[str], None]) -> dict:
    """:func:`run_soak` against a running server (``--url``, HTTP and gRPC): its traffic and
    checks, without the fault steps that need a server started here (:data:`EXTERNAL_SKIPS`).
    The server must serve the router with the policy of ``source`` (its cascade margin and
    models are read there)."""
    external = parse_urls(urls)
    if not (external.http_url and external.grpc_url):
        raise SoakError("the soak sends over HTTP and gRPC: give --url http://host:port and --url grpc://host:port")
    stack = read_stack(external)
    policy = yaml.safe_load((source / "router" / "policy.yaml").read_text())
    served(stack, [ACCURATE, FAST, "router"], "serve the repository with the shipped router")
    log(f"[soak] against the running server at {external.http_url} (HTTP) and {external.grpc_url} (gRPC): {describe_stack(stack)}")
    pool = build_pool(config.n_short, config.n_long, seed=config.seed)
    pool.early_stopping = chunk_stops_early(policy)
    send, client = reference_sender(external)
    try:
        compute_references(send, pool)
    except RuntimeError as exc:
        raise SoakError(str(exc)) from exc
    finally:
        client.close()
    margin = cascade_margin(policy)
    result = Soak(external, config, pool, margin, log).run()
    result.update(pool=pool, margin=margin, models=sorted(stack["models"]), server_log=None, stack=stack)
    return result


def run_soak(config: SoakConfig = FULL, source_repository: Optional[Path] = None, workdir: Optional[Path] = None,
             log: Callable[[str], None] = print, urls: Sequence[str] = ()) -> dict:
    """Run one soak (see the module doc) and return the raw results plus ``pool``,
    ``margin``, ``models``, ``server_log``, ``stack``. Starts and stops its own server on a copy of
    ``source_repository`` (default: the project's ``model_repository``) under ``workdir``
    (default: a temporary directory, removed afterwards); with ``urls`` soaks that running
    server instead (:func:`run_external`). Raises :class:`SoakError` or
    :class:`~orchestrator.tooling.server.ServerError` when the soak cannot run."""
    import tempfile

    from orchestrator.tooling.paths import default_model_repository
    from orchestrator.tooling.server import TritonServer

    source = Path(source_repository or default_model_repository())
    if urls:
        return run_external(urls, config, source, log)
    tmp = None
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="soak-")
        workdir = Path(tmp.name)
    try:
        repo = production.freeze(copy_repository(source, Path(workdir) / "model_repository"))
        policy = yaml.safe_load((repo / "router" / "policy.yaml").read_text())
        margin = cascade_margin(policy)
        models = models_to_load(policy)
        pool = build_pool(config.n_short, config.n_long, seed=config.seed)
        pool.early_stopping = chunk_stops_early(policy)
        server = TritonServer(repo, models=models, control_key=production.new_key())
        log(f"[soak] starting tritonserver on a read-only, compiled copy of {source} with the control plane "
            f"restricted (models: {', '.join(models)})")
        server.start()
        try:
            send, client = reference_sender(server)
            try:
                compute_references(send, pool)
            except RuntimeError as exc:
                raise SoakError(str(exc)) from exc
            finally:
                client.close()
            log(f"[soak] healthy reference for {len(pool.references)} texts; pool {pool.summary()}")
            stack = read_stack(server, embedded=True)
            target = server
            if config.front_door:  # the clients through nginx (orchestrator.tooling.frontdoor)
                from orchestrator.tooling.frontdoor_nginx import start_in_front_of

                target = start_in_front_of(server, repo=repo)
                log(f"[soak] clients through the front door (nginx) at {target.http_url} and {target.grpc_url}")
            try:
                result = Soak(target, config, pool, margin, log).run()
            finally:
                if target is not server:
                    target.door.stop()
        finally:
            server.stop()
        result.update(pool=pool, margin=margin, models=models, server_log=str(server.log_path), stack=stack)
        return result
    finally:
        production.thaw(Path(workdir) / "model_repository")
        if tmp is not None:
            tmp.cleanup()
