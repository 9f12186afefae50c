"""`python -m tests.flows.faults STAGE[:SIGNAL[:pid]] embforge-args...`: runs `embforge` and, inside
STAGE (right after the stage wrote its first file into its temp folder, for `train` right after its
first mid-epoch checkpoint, a signal other than kill -9 one step after it, for `summaries` and `queries`
right after the LLM's first shard reached the pool), sends itself a signal once:

- `STAGE`: kill -9 to its own process group (the run and its workers: what a power cut does);
- `STAGE:SIGINT` or `STAGE:SIGTERM`: that signal to its process group (Ctrl-C in a terminal, a
  scheduler stopping a job); `STAGE:SIGTERM:pid` to the main process alone (`kill PID`, docker stop);
- `STAGE:SIGKILL:server`, `STAGE:SIGKILL:engine`: kill -9 to the run's own Prefect server, or to vLLM's
  engine process (a crash of what the run depends on, the run itself untouched).

Before a signal it writes the time into $EMBFORGE_SIGNALLED_AT, so a test can time the stop; with
$EMBFORGE_HOLD_SIGNAL (a folder) it first says `ready` there and waits for `go`, so a test can take the cores
for the stop alone (tests/workers.py), not for the run's start."""

import os
import signal
import sys
import time
from pathlib import Path

import psutil

from flows import cli
from storage.shards import ShardPool
from storage.store import ArtifactWriter
from tasks.core.progress import StageProgress
from tasks.methods.training import Checkpoints

SENT: list[str] = []  # a signal is sent once per process
HELPERS = {"server": lambda p: "flows.api:guarded_app" in p.cmdline(),  # the run's own Prefect server
           "engine": lambda p: "EngineCore" in " ".join(p.cmdline())}  # vLLM's VLLM::EngineCore


def send(name: str, to: str) -> None:
    if SENT:
        return
    SENT.append(name)
    if hold := os.environ.get("EMBFORGE_HOLD_SIGNAL"):
        (Path(hold) / "ready").touch()
        while not (Path(hold) / "go").exists():
            time.sleep(0.05)
    if stamp := os.environ.get("EMBFORGE_SIGNALLED_AT"):
        with open(stamp, "w") as f:
            f.write(str(time.time()))
    if to in HELPERS:
        [helper] = [p for p in psutil.Process().children(recursive=True) if HELPERS[to](p)]
        helper.send_signal(getattr(signal, name))
    elif to == "pid":
        os.kill(os.getpid(), getattr(signal, name))
    else:
        os.killpg(os.getpgid(0), getattr(signal, name))


def after(cls: type, name: str, when, act) -> None:
    original = getattr(cls, name)

    def patched(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        if when(self):
            act()
        return result

    setattr(cls, name, patched)


def main() -> int:
    where, argv = sys.argv[1], sys.argv[2:]
    stage, name, to = (where.split(":") + ["SIGKILL", "group"])[:3]
    act = lambda: send(name, to)  # noqa: E731
    if stage == "train" and name == "SIGKILL":
        after(Checkpoints, "save", lambda _: True, act)
    elif stage == "train":  # one step after the first checkpoint: the stop saves one of its own
        saved = []
        after(Checkpoints, "save", lambda _: True, lambda: saved.append(True))
        after(StageProgress, "advance", lambda progress: progress.unit == "steps" and saved, act)
    elif stage in ("summaries", "queries"):  # after the LLM's first shard is in the pool
        after(ShardPool, "write", lambda _: True, act)
    else:
        for method in ("write_batches", "write_text"):  # write_table writes through write_batches
            after(ArtifactWriter, method, lambda writer: writer.folder.name.startswith(f"{stage}-"), act)
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
