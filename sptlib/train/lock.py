"""One writer per workdir: `workdir/.sptlib.lock`, held for the whole run.

The file records its owner (`{"pid", "host", "started", "argv"}`); the lock itself is an
exclusive `fcntl.flock` on it, which the kernel drops when the owner dies however it dies
(SIGKILL, OOM), so a lock left by a dead run is stale by construction: the next run takes it
over and says whose it was. A second run into a busy workdir stops before writing anything with
one line naming the owner (`sptlib.errors.WorkdirBusyError`).

Object-store workdirs (`gs://...`) and file systems without `flock` are not locked (a warning
says so); in multi-process runs only process 0 takes the lock.
"""

import json
import os
import socket
import sys
import time

from absl import logging

from sptlib.errors import WorkdirBusyError

LOCK_FILE = ".sptlib.lock"


def _owner_text(info: dict) -> str:
    if not info:
        return "an unknown process"
    started = info.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if started else "?"
    return f"pid {info.get('pid')} on host {info.get('host')} (since {when})"


def _read(path) -> dict:
    try:
        with open(path) as f:
            return json.loads(f.read() or "{}")
    except (OSError, ValueError):
        return {}


class WorkdirLock:
    """`with WorkdirLock(workdir):` holds the workdir's lock (see the module docstring)."""

    def __init__(self, workdir):
        self.workdir = str(workdir)
        self.path = os.path.join(os.path.abspath(self.workdir), LOCK_FILE)
        self._fd = None

    def acquire(self):
        if "://" in self.workdir:
            logging.warning("%s is an object store: not locked against a second run.",
                            self.workdir)
            return self
        try:
            import fcntl
        except ImportError:  # not POSIX
            return self
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        for _ in range(10):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise WorkdirBusyError(
                    f"--workdir={self.workdir} is in use by another run: "
                    f"{_owner_text(_read(self.path))} holds {self.path}. Wait for it to finish "
                    f"(or stop it), or use another --workdir") from None
            except OSError as e:  # e.g. a network file system without flock
                os.close(fd)
                logging.warning("Cannot lock %s (%s): not locked against a second run.",
                                self.path, e)
                return self
            # The file may have been replaced between open and flock (its holder released it):
            # the lock is ours only if the path still names the locked file.
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        else:
            raise WorkdirBusyError(f"--workdir={self.workdir}: could not take {self.path}")
        old = _read(self.path)
        if old.get("pid") and (old.get("pid"), old.get("host")) != (os.getpid(),
                                                                    socket.gethostname()):
            logging.warning("Taking over the stale lock %s of %s (no longer running).",
                            self.path, _owner_text(old))
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                "argv": sys.argv}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self):
        if self._fd is None:
            return
        try:
            os.unlink(self.path)  # before unlocking: a waiter then re-opens a fresh file
        except OSError:
            pass
        os.close(self._fd)  # drops the flock
        self._fd = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
        return False
