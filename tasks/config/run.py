"""How a run uses the machines and where it is logged (`retries`, `run`, `tracking`): none of it
is part of any artifact's identity."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tasks.config.base import Section


class RetryConfig(Section):
    attempts: int = Field(2, ge=0, description="Retries of a stage after a transient failure (out of "
                          "memory, a crashed worker); bad input or config is never retried.")
    delay_s: float = Field(10, ge=0, description="Wait before the first retry; it doubles for each next one.")

    @property
    def delays(self) -> list[float]:
        return [self.delay_s * 2**i for i in range(self.attempts)]


class RunConfig(Section):
    """How a run uses the machines: none of it is part of any artifact's identity."""

    workers: int | None = Field(None, ge=1, description="Processes for the CPU-bound data stages (sentence "
                                "splitting); default: the cores available.")
    task_runner: Literal["sequential", "threads", "processes", "dask"] = Field(
        "sequential", description="How independent stages run: one after another in the flow's process "
        "(`sequential`), side by side in threads, in worker processes, or on a Dask cluster (README: Scale out).")
    max_workers: int | None = Field(None, ge=1, description="Stages at once for `threads`, `processes` and a "
                                    "local Dask cluster; default: the cores available.")
    dask_address: str | None = Field(None, description="Scheduler of an existing Dask cluster (tcp://host:8786) "
                                     "for `dask`; default: a local cluster of `max_workers` processes.")


class TrackingConfig(Section):
    """Where runs are logged as well as the store; none of it is part of any artifact's identity."""

    mlflow: str = Field(description="MLflow tracking URI (http://host:5000, or sqlite:///mlflow.db): every "
                        "run's config, training curves, scores, report and pictures (docs/tracking.md).")
