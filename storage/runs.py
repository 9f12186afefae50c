"""Run records: one JSON file per flow run under `runs/`, rewritten after every stage, so a killed
run shows how far it got. The catalog's `runs`, `run_stages` and `models` views read them."""

from __future__ import annotations

from typing import Any

from storage.store import ArtifactRef, ArtifactStore, now


class RunRecord:
    """A flow run's record. A retried flow run (same id) starts its record again; its stages then
    show what was cached."""

    def __init__(self, store: ArtifactStore, run_id: str, *, name: str, flow: str, config_path: str,
                 overrides: dict[str, Any], config: dict):
        self.store, self.run_id = store, run_id
        self.record = dict(run_id=run_id, name=name, flow=flow, status="running", config_path=config_path,
                           overrides=overrides, config=config, started_at=now(), finished_at=None,
                           error=None, stages=[], models=[])
        self._save()

    def _save(self) -> None:
        self.store.write_run(self.run_id, self.record)

    def add_stage(self, ref: ArtifactRef, state: str, label: str = "", method: str = "",
                  version_changes: dict | None = None) -> None:
        """A stage the run used: its artifact and whether Prefect found it cached; `version_changes`:
        libraries whose version differs from the one a cached artifact was built with."""
        stage = dict(stage=ref.stage, label=label, method=method, key=ref.key, state=state)
        self.record["stages"].append(stage | ({"version_changes": version_changes} if version_changes else {}))
        self._save()

    def register(self, models: list[dict]) -> None:
        """Models the run made or scored: the catalog's `models` view (what `evaluate` re-scores)."""
        self.record["models"] += models
        self._save()

    def finish(self, status: str, error: str | None = None) -> None:
        self.record.update(status=status, finished_at=now(), error=error)
        self._save()
