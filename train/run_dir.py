"""One training run per output_dir: a lock held for the whole run, and who holds it."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from specheads.heads.files import write_text
from specheads.train.config import RunError

LOCK_NAME = ".lock"  # in train.output_dir: flock'ed for the whole run (the OS drops it when the process dies)
OWNER_NAME = ".lock.owner"  # who holds it, for the message of a run that finds it taken


class OutputDirLock:
    """One training run per output_dir: two would share the checkpoints' staging folders and overwrite each other."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.lock = None
        self.created = False  # the run made the folder: a run that ends having written nothing removes it again

    def acquire(self) -> None:
        from filelock import FileLock, Timeout

        lock = FileLock(str(self.directory / LOCK_NAME), timeout=0)
        try:
            self.created = not self.directory.exists()
            self.directory.mkdir(parents=True, exist_ok=True)
            lock.acquire()
        except Timeout:
            try:
                owner = (self.directory / OWNER_NAME).read_text().strip()
            except OSError:
                owner = ""
            raise RunError(f"train.output_dir {self.directory} is in use by another training run"
                             f"{f' ({owner})' if owner else ''}: wait for it to end or choose another "
                             "train.output_dir (nothing was changed)") from None
        except OSError as err:  # after Timeout, an OSError too
            raise RunError(f"train.output_dir {self.directory}: cannot take its lock: {err}") from None
        self.lock = lock
        write_text(self.directory / OWNER_NAME, f"pid {os.getpid()} on {socket.gethostname()} since "
                                                       f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")

    def release(self) -> None:
        if self.lock is not None:
            (self.directory / OWNER_NAME).unlink(missing_ok=True)
            self.lock.release()
            self.lock = None
            if self.created and {p.name for p in self.directory.iterdir()} <= {LOCK_NAME}:
                (self.directory / LOCK_NAME).unlink(missing_ok=True)
                self.directory.rmdir()
