"""Run records: one JSON file per flow run under `runs/`, rewritten after every stage, so a killed
run shows how far it got. The catalog's `runs`, `run_stages` and `models` views read them.

A live run rewrites its heartbeat every HEARTBEAT_S seconds; the catalog shows a `running` record
as `crashed` once its process is gone (same host) or it missed MISSED_HEARTBEATS beats (storage/catalog.py)."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from storage.base import HOST, ArtifactRef, now
from storage.store import ArtifactStore

HEARTBEAT_S = float(os.environ.get("EMBFORGE_HEARTBEAT_S", "30"))


class RunRecord:
    """A flow run's record. A retried flow run (same id) starts its record again; its stages then
    show what was cached."""

    def __init__(self, store: ArtifactStore, run_id: str, *, name: str, flow: str, config_path: str,
                 overrides: dict[str, Any], config: dict):
        self.store, self.run_id = store, run_id
        self.record = dict(run_id=run_id, name=name, flow=flow, status="running", config_path=config_path,
                           overrides=overrides, config=config, started_at=now(), finished_at=None,
                           error=None, stages=[], models=[], host=HOST, pid=os.getpid(), heartbeat_at=now(),
                           heartbeat_s=HEARTBEAT_S)
        self._lock = threading.RLock()  # the heartbeat thread and the flow's stages all rewrite the record
        self._stopped = threading.Event()
        self._save()
        threading.Thread(target=self._beat, name=f"heartbeat-{run_id}", daemon=True).start()

    def _save(self, **changes: Any) -> None:
        with self._lock:
            self.record.update(changes)
            self.store.write_run(self.run_id, self.record)

    def _beat(self) -> None:
        while not self._stopped.wait(HEARTBEAT_S):
            try:
                self._save(heartbeat_at=now())
            except OSError as e:  # a full disk for a moment must not stop the beats: the run would look crashed
                logging.getLogger("embforge.runs").warning("run %s: heartbeat not written: %s", self.run_id, e)

    def add_stage(self, ref: ArtifactRef, state: str, label: str = "", method: str = "",
                  version_changes: dict | None = None) -> None:
        """A stage the run used: its artifact and whether Prefect found it cached; `version_changes`:
        libraries whose version differs from the one a cached artifact was built with."""
        stage = dict(stage=ref.stage, label=label, method=method, key=ref.key, state=state)
        self._append("stages", [stage | ({"version_changes": version_changes} if version_changes else {})])

    def register(self, models: list[dict]) -> None:
        """Models the run made or scored: the catalog's `models` view (what `evaluate` re-scores)."""
        self._append("models", models)

    def _append(self, field: str, entries: list[dict]) -> None:
        with self._lock:  # stages finishing at once in the runner's threads must not drop each other's entry
            self._save(**{field: [*self.record[field], *entries]})

    def finish(self, status: str, error: str | None = None) -> None:
        self._stopped.set()
        self._save(status=status, finished_at=now(), error=error, heartbeat_at=now())
