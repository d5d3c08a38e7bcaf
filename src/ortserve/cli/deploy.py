"""`ortserve deploy ray`: the same server as `ortserve serve`, as N replicas behind Ray Serve."""

from __future__ import annotations

import signal
import time
from typing import Any

import click

from ortserve.cli.common import fail, guarded


@click.group("deploy")
def deploy_group() -> None:
    """Run ortserve on a cluster (Ray Serve)."""


@deploy_group.command("ray")
@click.option("--model", "-m", default=None, help="Store id (resolved in each node's store) or a shared path")
@click.option("--replicas", type=int, default=1, show_default=True, help="Replicas (the minimum when autoscaling)")
@click.option("--max-replicas", type=int, default=None, help="Autoscale on ongoing requests up to this many")
@click.option("--target-ongoing-requests", type=float, default=8.0, show_default=True,
              help="Autoscaling target of ongoing requests per replica")
@click.option("--num-cpus", type=float, default=1.0, show_default=True, help="CPUs Ray reserves per replica")
@click.option("--address", default=None, help="An existing Ray cluster (ray://host:10001 or auto); "
                                               "default: start a local one")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address of Ray's HTTP proxy")
@click.option("--port", type=int, default=8000, show_default=True, help="Port of Ray's HTTP proxy")
@click.option("--intra-op-threads", type=int, default=None, help="ONNX Runtime threads per replica")
@click.option("--max-batch", type=int, default=None, help="Most sequences a replica decodes together")
@click.option("--api-key", default=None, help="Require Authorization: Bearer KEY (as `ortserve serve`)")
@guarded
def deploy_ray(model: str | None, replicas: int, max_replicas: int | None, target_ongoing_requests: float,
               num_cpus: float, address: str | None, host: str, port: int, intra_op_threads: int | None,
               max_batch: int | None, api_key: str | None) -> None:
    """Serve MODEL on Ray Serve: REPLICAS copies behind Ray's proxy; Ctrl-C stops it."""
    try:
        from ortserve.deploy import ray as ray_deploy
    except ImportError as exc:
        fail(f"Ray Serve is not installed ({exc}); pip install 'ortserve[ray]'")
    settings: dict[str, Any] = {k: v for k, v in {"intra_op_threads": intra_op_threads, "max_batch": max_batch,
                                                  "api_key": api_key}.items() if v is not None}
    click.echo(f"ortserve on Ray: {replicas}{f'..{max_replicas}' if max_replicas else ''} replica(s) of "
               f"{model or 'the default model'}; starting (the first start of a local cluster takes ~30 s)",
               err=True)
    url = ray_deploy.run(model, settings, address=address, host=host, port=port, replicas=replicas,
                         max_replicas=max_replicas, num_cpus=num_cpus,
                         target_ongoing_requests=target_ongoing_requests)
    click.echo(f"serving on {url} (try: curl {url}/healthz); Ctrl-C stops", err=True)
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops it as cleanly as Ctrl-C
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        click.echo("stopping", err=True)
    finally:
        ray_deploy.shutdown()


def _interrupt(_sig: int, _frame: Any) -> None:
    raise KeyboardInterrupt
