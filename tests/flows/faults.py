"""`python -m tests.flows.faults STAGE embforge-args...`: runs `embforge` and kill -9s its own process
group (the run, its Prefect server, its workers: what a power cut or the OOM killer does) inside
STAGE: right after the stage wrote its first file into its temp folder, or for `train` right after
its first mid-epoch checkpoint."""

import os
import signal
import sys

from flows import cli
from storage.store import ArtifactWriter
from tasks.methods.training import Checkpoints


def die() -> None:
    os.killpg(os.getpgid(0), signal.SIGKILL)


def die_after(cls: type, name: str, when) -> None:
    original = getattr(cls, name)

    def patched(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        if when(self):
            die()
        return result

    setattr(cls, name, patched)


def main() -> int:
    stage, argv = sys.argv[1], sys.argv[2:]
    if stage == "train":
        die_after(Checkpoints, "save", lambda _: True)
    else:
        for name in ("write_batches", "write_text"):  # write_table writes through write_batches
            die_after(ArtifactWriter, name, lambda writer: writer.folder.name.startswith(f"{stage}-"))
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
