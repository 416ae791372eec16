"""One writer per workdir: `workdir/.sptlib.lock`, held for the whole run.

The file records its owner (`{"pid", "host", "started", "argv"}`); the lock itself is an
exclusive `fcntl.flock` on it, which the kernel drops when the owner dies however it dies
(SIGKILL, OOM), so a lock left by a dead run is stale by construction: the next run takes it
over and says whose it was. A second run into a busy workdir stops before writing anything with
one line naming the owner (`sptlib.errors.WorkdirBusyError`).

The file is opened with `O_NOFOLLOW` and mode 0600: a symlink planted at its name (e.g. by
another user of a shared `/tmp`) is refused, never written through, and so is a file with
other hard links or another owner (`sptlib.errors.WorkdirOwnerError`;
`SPTLIB_ALLOW_FOREIGN_WORKDIR=1` accepts another owner's file).

Object-store workdirs (`gs://...`) and file systems without `flock` are not locked (a warning
says so); in multi-process runs only process 0 takes the lock.
"""

import json
import os
import signal
import socket
import stat
import sys
import threading
import time

from absl import logging

from sptlib.errors import PreemptedError, WorkdirBusyError, WorkdirOwnerError, foreign_allowed

LOCK_FILE = ".sptlib.lock"

# The SIGTERM received while a lock was held, until the lock is released. The handler raises a
# PreemptedError, but Python runs signal handlers between any two bytecodes, also inside a
# garbage-collection or weakref callback whose exceptions are printed and dropped ("Exception
# ignored in ..."); the run then goes on. So the request is also recorded here, and the stage
# runner and the training loop's own handler (`signals.StopFlag`) honour it.
_pending_signum = None


def pending_stop():
    """The signal number of a SIGTERM received under the lock and not yet acted on, or None."""
    return _pending_signum


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


def _open_private(path) -> int:
    """fd of the lock file `path` (created 0600), refusing what is not a plain file of ours."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                     0o600)
    except OSError:
        if os.path.islink(path):
            raise WorkdirOwnerError(
                f"{path} is a symbolic link (to {os.readlink(path)}), not sptlib's lock file: "
                f"not following it. Someone else may have prepared this workdir; remove the "
                f"link if you trust it, or use a folder of your own as --workdir") from None
        raise
    st = os.fstat(fd)
    why = ("is not a regular file" if not stat.S_ISREG(st.st_mode) else
           f"has {st.st_nlink} hard links" if st.st_nlink > 1 else
           f"belongs to uid {st.st_uid}, not to you (uid {os.geteuid()})"
           if st.st_uid != os.geteuid() and not foreign_allowed() else "")
    if why:
        os.close(fd)
        raise WorkdirOwnerError(f"{path} {why}: not writing to it. Someone else may have "
                                f"prepared this workdir; use a folder of your own as --workdir")
    return fd


class WorkdirLock:
    """`with WorkdirLock(workdir):` holds the workdir's lock (see the module docstring)."""

    def __init__(self, workdir):
        self.workdir = str(workdir)
        self.path = os.path.join(os.path.abspath(self.workdir), LOCK_FILE)
        self._fd = None

    def acquire(self):
        self._stop_on_sigterm()  # from here on a SIGTERM is a PreemptedError
        try:
            return self._acquire()
        except BaseException:
            self.release()  # the handler, and the file if it was ours already
            raise

    def _acquire(self):
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
            fd = _open_private(self.path)
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
                self._fd = fd  # ours: release() removes it, whatever happens next
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
        self._fd = fd
        os.fsync(fd)
        return self

    def _stop_on_sigterm(self):
        """While the lock is held, SIGTERM outside a stage's training loop (preflight, data
        loading or generation, compilation) stops the run at once as a `PreemptedError`
        (exit 3) instead of killing it, so the `finally` that releases the lock runs. (The
        loop's own handler, `signals.StopFlag`, replaces this one while it trains.)"""
        if threading.current_thread() is not threading.main_thread():
            return

        def stop(signum, frame):  # pylint: disable=unused-argument
            global _pending_signum
            _pending_signum = signum
            raise PreemptedError("stopped on request (SIGTERM) before a checkpoint of the "
                                 "current stage could be saved; its last checkpoint is kept. "
                                 "Run the same command to resume.", signum=signum)
        try:
            self._previous = signal.signal(signal.SIGTERM, stop)
        except ValueError:  # not the main interpreter
            self._previous = None

    def release(self):
        global _pending_signum
        _pending_signum = None
        if getattr(self, "_previous", None) is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None
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
