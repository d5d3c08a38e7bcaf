"""The Ray Serve deployment of ortserve: the same FastAPI app (create_app) behind Ray's proxy.

`pip install 'ortserve[ray]'`, then `ortserve deploy ray --replicas 2 --model smollm2-135m`,
or `serve run ortserve.deploy.ray:app_builder model=smollm2-135m replicas=2`.

Each replica resolves the model in its own node's store (ORTSERVE_HOME there), or loads a
directory given as a path (a shared filesystem), and loads it in its constructor: Ray routes
to a replica only once its model is loaded. Health is the app's /healthz (Ray calls
check_health; a failing replica is replaced). Every response names its replica in
X-Ortserve-Replica (and the process in X-Ortserve-Pid).

Cost ledger and telemetry with several replicas: the replicas of one node share that node's
ORTSERVE_HOME. Telemetry already writes one file per process (`<signal>-<start>-p<pid>-...jsonl`)
into one directory, and the readers merge them; the ledger is one SQLite file in WAL mode that
several processes write safely (sqlite's own locking, 10 s busy timeout). So one node = one
shared store, correct without extra work; several nodes = one ledger and one telemetry
directory per node (docs/scale.md: how to read them together).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import ray
from ray import serve

from ortserve.config import load_settings
from ortserve.loopback import wait_healthy

log = logging.getLogger("ortserve.deploy")
DEPLOYMENT = "ortserve"
# Ray Serve gives a new HTTP proxy 5 s to answer its ready check, then kills it; serve.start
# then fails with ActorDiedError ("killed by ray.kill ... never ran"). On a busy 2-core machine
# (the suite beside a CPU hog) the proxy took longer. For a local cluster ortserve starts, it
# allows 60 s for readiness and 30 s per health check; values the user set win.
PROXY_TIMEOUTS = {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60", "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "30"}


@serve.ingress()
class OrtServeReplica:
    """One replica: the model loaded in the constructor, then create_app over it."""

    def __init__(self, model: str | None, settings: dict[str, Any]) -> None:
        from ortserve.engine import AsyncEngine
        from ortserve.models.locate import resolve_model_dir
        from ortserve.server.app import create_app
        from ortserve.server.engine_loader import draft_of

        t0 = time.monotonic()
        self.ortserve_settings = load_settings(**settings)
        model_dir, model_id = resolve_model_dir(model or self.ortserve_settings.model, self.ortserve_settings)
        self.ortserve_engine = AsyncEngine.load(model_dir, self.ortserve_settings, model_id,
                                                draft=draft_of(self.ortserve_settings))
        try:
            self.ortserve_replica = serve.get_replica_context().replica_id.unique_id
        except Exception:  # noqa: BLE001 - outside a replica (tests of the class itself)
            self.ortserve_replica = f"local-{os.getpid()}"
        self.ortserve_app = create_app(self.ortserve_settings, engine=self.ortserve_engine)
        self.ortserve_app.add_middleware(ReplicaHeader, replica=self.ortserve_replica)
        log.info("replica %s loaded %s in %.1f s", self.ortserve_replica, model_id, time.monotonic() - t0)

    def __serve_build_asgi_app__(self) -> Any:
        return self.ortserve_app

    def check_health(self) -> None:
        """Ray calls this every health_check_period_s; raising gets the replica replaced.
        The same verdict as the app's /healthz: a failed load or an unhealthy engine."""
        state = self.ortserve_app.state.ortserve
        if state.load_error:
            raise RuntimeError(f"model failed: {state.load_error}")
        engine = state.engine
        problem = engine.health() if engine is not None and hasattr(engine, "health") else None
        if problem:
            raise RuntimeError(f"/healthz says unavailable: {problem}")
        if engine is not None and not getattr(engine.core, "alive", True):
            raise RuntimeError("the engine loop thread died")


class ReplicaHeader:
    """X-Ortserve-Replica / X-Ortserve-Pid on every response (pure ASGI: streams pass through)."""

    def __init__(self, app: Any, replica: str) -> None:
        self.ortserve_app = app
        self.headers = [(b"x-ortserve-replica", replica.encode()), (b"x-ortserve-pid", str(os.getpid()).encode())]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.ortserve_app(scope, receive, send)
            return

        async def tagged(msg: Any) -> None:
            if msg["type"] == "http.response.start":
                msg = {**msg, "headers": [*msg.get("headers", []), *self.headers]}
            await send(msg)

        await self.ortserve_app(scope, receive, tagged)


def deployment_options(replicas: int = 1, *, max_replicas: int | None = None, num_cpus: float = 1.0,
                       target_ongoing_requests: float = 8.0, max_ongoing_requests: int = 64,
                       health_check_period_s: float = 5.0) -> dict[str, Any]:
    """Fixed replicas, or autoscaling on ongoing requests between ``replicas`` and ``max_replicas``."""
    opts: dict[str, Any] = {"name": DEPLOYMENT, "ray_actor_options": {"num_cpus": num_cpus},
                            "max_ongoing_requests": max_ongoing_requests,
                            "health_check_period_s": health_check_period_s, "health_check_timeout_s": 30.0,
                            "graceful_shutdown_timeout_s": 10.0}
    if max_replicas and max_replicas > replicas:
        opts["autoscaling_config"] = {"min_replicas": replicas, "initial_replicas": replicas,
                                      "max_replicas": max_replicas,
                                      "target_ongoing_requests": target_ongoing_requests}
    else:
        opts["num_replicas"] = replicas
    return opts


def build(model: str | None, settings: dict[str, Any] | None = None, **options: Any) -> Any:
    """The Ray Serve application (bind it, then serve.run it)."""
    return serve.deployment(OrtServeReplica, **deployment_options(**options)).bind(model, settings or {})


def app_builder(args: dict[str, str]) -> Any:
    """For `serve run ortserve.deploy.ray:app_builder model=... replicas=2 max_replicas=4`."""
    settings = {k: v for k, v in args.items() if k not in ("model", "replicas", "max_replicas", "num_cpus")}
    return build(args.get("model"), settings, replicas=int(args.get("replicas", 1)),
                 max_replicas=int(args["max_replicas"]) if "max_replicas" in args else None,
                 num_cpus=float(args.get("num_cpus", 1.0)))


def run(model: str | None, settings: dict[str, Any], *, address: str | None = None, host: str = "127.0.0.1",
        port: int = 8000, cluster_cpus: int | None = None, proxy_wait: float = 300.0, **options: Any) -> str:
    """Start a local Ray cluster (or join the one at ``address``) and serve ortserve on it;
    returns the proxy's URL once it answers /healthz (within ``proxy_wait`` seconds)."""
    if not ray.is_initialized():
        if address is None:  # the cluster's processes inherit this environment
            for name, seconds in PROXY_TIMEOUTS.items():
                os.environ.setdefault(name, seconds)
        # "local": always a new cluster of our own, never one a `ray start` left running here
        kw: dict[str, Any] = {"address": address or "local", "include_dashboard": False, "log_to_driver": False}
        if address is None and cluster_cpus is not None:
            kw["num_cpus"] = cluster_cpus
        ray.init(**kw)
    try:
        serve.start(http_options={"host": host, "port": port})
    except (TimeoutError, ray.exceptions.RayActorError) as exc:
        # Serve waits a fixed 60 s for its HTTP proxy; on a busy machine the proxy is slower,
        # and it goes on starting. serve.run below connects to the same controller.
        log.warning("Ray Serve's HTTP proxy is slow to start (%s); waiting for it", str(exc).splitlines()[0])
    serve.run(build(model, settings, **options), name="ortserve", route_prefix="/")
    url = f"http://{host}:{port}"
    here = f"http://127.0.0.1:{port}" if host in ("0.0.0.0", "::", "") else url
    if not wait_healthy(here, proxy_wait):
        raise RuntimeError(f"Ray Serve's proxy at {url} did not answer /healthz within {proxy_wait:.0f} s")
    return url


def shutdown() -> None:
    """Stop the Serve app and, if this process started it, the local cluster."""
    try:
        serve.shutdown()
    finally:
        ray.shutdown()
