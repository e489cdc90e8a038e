"""The submitter service's composition root: settings, store, engines, servicer, consumers.

Settings (environment, ``COULER_`` prefix): the common ones (:class:`CommonSettings` --
``COULER_DATABASE_URL`` for the run records, ``COULER_ARTIFACTS`` / ``COULER_S3_*`` for the
artifact store) plus:

* ``COULER_RUNS_DIR`` -- where the local engine keeps its run directories
  (default ``<state_dir>/runs``);
* ``COULER_MAX_WORKERS`` -- step processes the local engine runs at once, per run;
* ``COULER_ENGINES`` -- the engines this submitter runs, comma-separated
  (default ``local,dryrun``); a run for another engine fails naming the engine and this
  setting. Remote engines run through their ``couler.engines.base.EngineAdapter``, built
  from these settings (or plugged in with ``build(..., adapters=...)``):

  - ``argo`` / ``tekton``: ``COULER_KUBE_HOST`` + ``COULER_KUBE_TOKEN`` (or
    ``COULER_KUBECONFIG`` / ``COULER_KUBE_CONTEXT``, else the in-cluster configuration),
    ``COULER_KUBE_VERIFY_SSL``, ``COULER_ARGO_NAMESPACE`` (default ``argo``),
    ``COULER_TEKTON_NAMESPACE`` (default ``default``);
  - ``airflow``: ``COULER_AIRFLOW_URL``, ``COULER_AIRFLOW_DAGS_FOLDER`` (the folder the
    deployment watches) and ``COULER_AIRFLOW_TOKEN`` or ``COULER_AIRFLOW_USERNAME`` +
    ``COULER_AIRFLOW_PASSWORD``;
  - ``kfp``: ``COULER_KFP_HOST`` (+ ``COULER_KFP_TOKEN``); needs the kfp SDK installed;
* ``COULER_METRICS_INTERVAL`` -- seconds between two batches of utilization samples of a
  running run on ``couler.metrics.batch`` (default 5), and between two polls of a remote
  engine's pod metrics (Argo, Tekton); ``COULER_SAMPLE_INTERVAL`` -- the interval the local
  engine samples a step's process tree over (default 1 s: each sample is the average cores
  over it and the memory at its end);
* ``COULER_OUTBOX_INTERVAL`` -- seconds between looks at the events outbox when nothing
  new was queued (events are published as soon as they are committed; this bounds how
  long a row left by another process waits);
* ``COULER_MAX_VALUE_BYTES`` (default 262144, 256 KiB), ``COULER_MAX_WORKFLOW_BYTES``
  (default 67108864, 64 MiB), ``COULER_MAX_WORKFLOW_STEPS`` (default 200000) and
  ``COULER_MAX_NESTING_DEPTH`` (default 16) -- the size limits Submit and RegisterTemplate
  check (:mod:`couler.ir.limits`): a value over its limit is refused with
  INVALID_ARGUMENT naming the workflow, step, field and limit;
* ``COULER_SECRETS_FILE`` -- a JSON file ``{"secret-name": {"KEY": "value"}}`` (mode 0600)
  with the values of the secrets local runs reference (``couler up --secrets-file``); read
  at start (a bad file fails the start, naming it) and again for every run, so an edit
  takes effect without a restart. Values never enter records, events or logs;
* ``COULER_CACHE_ADDRESS`` -- the cache service's ``host:port``, told to drop an entry whose
  artifact is corrupt or gone from the artifact store when a run fetches it (its step runs
  again either way); empty: such entries are only not reused. ``COULER_CACHE_TIMEOUT``
  (default 5) bounds that call, in seconds.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from pydantic import Field, SecretStr, field_validator, model_validator

from couler.engines.base import EngineAdapter
from couler.errors import UserError
from couler.ir.limits import DEFAULT_LIMITS, SizeLimits
from couler_runtime.blobs import open_blob_store
from couler_runtime.bus import Bus
from couler_runtime.client import CoulerClient
from couler_runtime.rpc import SUBMITTER
from couler_runtime.service import Component, service_main
from couler_runtime.settings import CommonSettings, SettingsError
from couler_submitter.artifacts import ArtifactBlobs
from couler_submitter.engines import (
    KNOWN_ENGINES,
    AdapterRunner,
    DryRunRunner,
    LocalRunner,
    Runner,
)
from couler_submitter.events import BusEvents, start_consumers
from couler_submitter.rpc import SubmitterService
from couler_submitter.service import Submitter
from couler_submitter.store import RunStore

__all__ = ["SubmitterSettings", "build", "main"]

log = logging.getLogger(__name__)


class SubmitterSettings(CommonSettings):
    """Settings of the submitter service (see the module docstring).

    Attributes:
        runs_dir: The local engine's run directories; ``<state_dir>/runs`` when unset.
        max_workers: Step processes the local engine runs at once, per run.
        engines: The engines this submitter runs, comma-separated.
        outbox_interval: Seconds between looks at the outbox when nothing woke the sender.
        metrics_interval: Seconds between batches of utilization samples (and polls of a
            remote engine's pod metrics).
        sample_interval: The local engine's sampling interval, in seconds.
        secrets_file: The secret values of local runs (JSON; see the module docstring).
        max_value_bytes: The largest single value in a workflow (an argument, an env
            value, a script's source, a parameter value, ...), in bytes.
        max_workflow_bytes: The largest encoded workflow, in bytes (also the largest
            upload).
        max_workflow_steps: The most steps a workflow may have, nested ones included.
        max_nesting_depth: How deeply sub-workflows may nest.
    """

    runs_dir: Path | None = None
    max_workers: int = Field(default=4, ge=1, le=256)
    engines: str = "local,dryrun"
    outbox_interval: float = Field(default=5.0, gt=0)
    metrics_interval: float = Field(default=5.0, gt=0)
    sample_interval: float = Field(default=1.0, ge=0.05)
    secrets_file: Path | None = None
    max_value_bytes: int = Field(default=DEFAULT_LIMITS.max_value_bytes, ge=1024,
                                 le=64 * 1024 * 1024)
    max_workflow_bytes: int = Field(default=DEFAULT_LIMITS.max_workflow_bytes, ge=64 * 1024,
                                    le=1024 * 1024 * 1024)
    max_workflow_steps: int = Field(default=DEFAULT_LIMITS.max_steps, ge=1, le=10_000_000)
    max_nesting_depth: int = Field(default=DEFAULT_LIMITS.max_depth, ge=1, le=64)
    # remote engines (see the module docstring)
    kube_host: str | None = None
    kube_token: SecretStr | None = None
    kube_verify_ssl: bool = True
    kubeconfig: str | None = None
    kube_context: str | None = None
    argo_namespace: str = "argo"
    tekton_namespace: str = "default"
    airflow_url: str | None = None
    airflow_dags_folder: Path | None = None
    airflow_token: SecretStr | None = None
    airflow_username: str | None = None
    airflow_password: SecretStr | None = None
    kfp_host: str | None = None
    kfp_token: SecretStr | None = None
    cache_address: str = ""
    cache_timeout: float = Field(default=5.0, gt=0)

    @field_validator("runs_dir", "secrets_file", mode="before")
    @classmethod
    def _optional_path(cls, value: Any) -> Any:
        return None if value in ("", None) else value

    @field_validator("engines")
    @classmethod
    def _engines(cls, value: str) -> str:
        names = [n.strip().lower() for n in value.split(",") if n.strip()]
        unknown = [n for n in names if n not in KNOWN_ENGINES]
        if unknown:
            raise ValueError(f"unknown engine(s) {', '.join(unknown)} "
                             f"(known: {', '.join(KNOWN_ENGINES)})")
        return ",".join(dict.fromkeys(names))

    @model_validator(mode="after")
    def _default_runs_dir(self) -> Self:
        if self.runs_dir is None:
            self.runs_dir = self.state_dir / "runs"
        return self

    @property
    def size_limits(self) -> SizeLimits:
        """The size limits these settings give (``COULER_MAX_*``)."""
        return SizeLimits(max_value_bytes=self.max_value_bytes,
                          max_workflow_bytes=self.max_workflow_bytes,
                          max_steps=self.max_workflow_steps, max_depth=self.max_nesting_depth)

    @property
    def engine_names(self) -> tuple[str, ...]:
        """The configured engines, in order."""
        return tuple(n for n in self.engines.split(",") if n)


def _secret(value: SecretStr | None) -> str | None:
    return value.get_secret_value() if value is not None else None


def adapter_from_settings(name: str, settings: SubmitterSettings) -> EngineAdapter | None:
    """The adapter of remote engine ``name`` built from the settings; None when the
    settings do not configure it (SettingsError naming what is missing or wrong)."""
    host, token = settings.kube_host, _secret(settings.kube_token)
    verify, config, context = settings.kube_verify_ssl, settings.kubeconfig, settings.kube_context
    try:
        if name == "argo":
            from couler_runtime.argo import ArgoAdapter

            return ArgoAdapter(settings.argo_namespace, host=host, token=token,
                               verify_ssl=verify, config_file=config, context=context)
        if name == "tekton":
            from couler_runtime.tekton import TektonAdapter

            return TektonAdapter(settings.tekton_namespace, host=host, token=token,
                                 verify_ssl=verify, config_file=config, context=context)
        if name == "airflow":
            if not settings.airflow_url or settings.airflow_dags_folder is None:
                return None
            from couler_runtime.airflow import AirflowAdapter

            return AirflowAdapter(settings.airflow_url, settings.airflow_dags_folder,
                                  token=_secret(settings.airflow_token),
                                  username=settings.airflow_username,
                                  password=_secret(settings.airflow_password))
        if name == "kfp":
            if not settings.kfp_host:
                return None
            from couler_runtime.kfp import KfpAdapter

            return KfpAdapter(settings.kfp_host, existing_token=_secret(settings.kfp_token))
    except UserError as exc:
        raise SettingsError(f"COULER_ENGINES lists {name!r}, but its adapter cannot be "
                            f"built: {exc}") from None
    return None


def make_runners(settings: SubmitterSettings,
                 adapters: Mapping[str, EngineAdapter] | None = None) -> dict[str, Runner]:
    """The runners of the configured engines (an adapter is needed for remote ones)."""
    runs_dir = settings.runs_dir or settings.state_dir / "runs"
    runners: dict[str, Runner] = {}
    for name in settings.engine_names:
        adapter = (adapters or {}).get(name)
        if name == "local":
            runners[name] = LocalRunner(runs_dir, settings.max_workers,
                                        secrets_file=settings.secrets_file,
                                        series_seconds=settings.sample_interval)
        elif name == "dryrun":
            runners[name] = DryRunRunner()
        elif adapter is not None or (adapter := adapter_from_settings(name, settings)):
            runners[name] = AdapterRunner(name, adapter,
                                          metrics_interval=settings.metrics_interval)
        else:
            log.warning("engine %r is listed in COULER_ENGINES but no adapter was plugged in; "
                        "its runs will fail", name)
    return runners


async def build(settings: SubmitterSettings, bus: Bus, *,
                adapters: Mapping[str, EngineAdapter] | None = None) -> Component:
    """Wire the submitter: migrate the store, the engines, recovery, servicer, consumers."""
    store = await asyncio.to_thread(RunStore, settings.database_url)
    token = settings.auth_token.get_secret_value() if settings.auth_token else None
    cache = (CoulerClient({"cache": settings.cache_address.strip()}, token=token,
                          timeout=settings.cache_timeout)
             if settings.cache_address.strip() else None)
    try:
        blobs = ArtifactBlobs(await asyncio.to_thread(open_blob_store, settings))
        runs_dir = settings.runs_dir or settings.state_dir / "runs"
        runs_dir.mkdir(parents=True, exist_ok=True)
        submitter = Submitter(store, BusEvents(bus), make_runners(settings, adapters),
                              blobs=blobs, runs_dir=runs_dir,
                              outbox_interval=settings.outbox_interval,
                              limits=settings.size_limits,
                              cache=cache.cache if cache is not None else None,
                              metrics_interval=settings.metrics_interval)
        await submitter.start()
        await start_consumers(bus, submitter, store)
    except BaseException:
        store.close()
        if cache is not None:
            cache.close()
        raise

    async def close() -> None:
        # After the bus stopped the consumers: no handler still uses the submitter.
        await submitter.close()
        store.close()
        if cache is not None:
            cache.close()

    return Component({SUBMITTER: SubmitterService(submitter)}, close)


def main() -> int:
    """The ``couler-submitter`` console script (also ``python -m couler_submitter.main``)."""
    return service_main("submitter", SubmitterSettings, build)


if __name__ == "__main__":
    sys.exit(main())
