"""Writing generated data safely: argument checks and all-or-nothing folders.

A generator writes its whole release folder into a hidden sibling (`.<name>.partial-<host>-<pid>`)
and renames it into place only when complete (`write_atomically`), so a generation killed half
way leaves no folder a later run could mistake for data; the next run generates again. Runs that
share a data folder check for it and generate it under `folder_lock`, one after the other. Partial
folders of dead processes on this host are removed on the next attempt.
"""

import contextlib
import logging
import os
import shutil
import socket
import time

from sptlib.errors import ConfigError


def check_count(name: str, value, minimum: int) -> int:
    """`value` as an int >= `minimum`; else a ConfigError naming `--<name>` / the argument."""
    if isinstance(value, bool) or not float(value).is_integer() or int(value) < minimum:
        raise ConfigError(f"{name}={value!r} (--{name}): must be an integer >= {minimum}")
    return int(value)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale(parent: str, name: str, host: str):
    prefix = f".{name}.partial-{host}-"
    for entry in os.listdir(parent):
        if entry.startswith(prefix) and entry[len(prefix):].isdigit() and \
                not _alive(int(entry[len(prefix):])):
            logging.warning("Removing %s, left by a killed generation.",
                            os.path.join(parent, entry))
            shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)


@contextlib.contextmanager
def folder_lock(parent: str, name: str):
    """An exclusive `flock` on `parent/.<name>.lock` for as long as the block runs. Runs that
    share a data folder check for it and generate it under this lock: the second finds the
    first's complete folder instead of generating again (and moving it aside)."""
    parent = parent or "."
    os.makedirs(parent, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not POSIX: unlocked
        yield
        return
    fd = os.open(os.path.join(parent, f".{name}.lock"),
                 os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # a file system without flock: unlocked
            pass
        yield
    finally:
        os.close(fd)


def write_atomically(final: str, write) -> str:
    """Calls `write(tmp_folder)`, then renames the folder to `final`; returns `final`.

    An existing `final` (an incomplete folder: callers generate only when theirs is missing) is
    moved aside to `<final>.replaced-<time>`, never deleted."""
    final = os.path.abspath(final)
    parent, name = os.path.split(final)
    os.makedirs(parent, exist_ok=True)
    host = socket.gethostname().replace("-", "_")
    _remove_stale(parent, name, host)
    tmp = os.path.join(parent, f".{name}.partial-{host}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        write(tmp)
        if os.path.exists(final):
            aside = f"{final}.replaced-{int(time.time())}"
            logging.warning("%s exists but is incomplete; moved to %s.", final, aside)
            os.rename(final, aside)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # an exception (not a kill): clean up now
        raise
    return final
