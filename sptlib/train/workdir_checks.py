"""The workdir checks of preflight: a folder that is (or can be made) writable, owned by the user,
reachable (a remote `gs://` one answers within `REMOTE_TIMEOUT_S`), whose paths fit the file
system's name limits, with every stage's folder a folder where it exists."""

import errno
import os
import tempfile
import threading

from etils import epath

from sptlib.errors import FOREIGN_ENV, ConfigError, WorkdirOwnerError, foreign_allowed

REMOTE_TIMEOUT_S = 60.0


def check_workdir(workdir, stage_names=()) -> None:
    """The workdir is (or can be made) a folder this process can write to, and its own: a
    workdir of another user (e.g. prepared in a shared `/tmp`) is refused unless
    SPTLIB_ALLOW_FOREIGN_WORKDIR=1; a symlink that leads nowhere (a loop) is named as such; the
    files a run writes there fit the file system's name limits (`check_path_lengths`)."""
    text = str(workdir)
    if "://" in text:  # object stores: one listing, bounded in time (no network: minutes)
        _check_remote(text)
        return
    path = epath.Path(os.path.abspath(text))
    check_path_lengths(str(path), stage_names)
    check_link(str(path), f"--workdir={text}")
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--workdir={text}: is a file, not a folder; pass a folder (it is "
                          f"created if missing)")
    _check_owner(str(path), f"--workdir={text}")
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".sptlib-write-test-", dir=str(path))
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ConfigError(f"--workdir={text}: cannot write there ({type(e).__name__}: "
                          f"{e.strerror or e}); pick a writable folder") from None


def check_link(path: str, what: str) -> None:
    """A symlink at `path` that leads nowhere (a loop, a missing target) is a ConfigError."""
    if os.path.islink(path) and not os.path.exists(path):
        try:
            os.stat(path)
            why = "a missing target"
        except OSError as e:
            why = ("a loop" if e.errno == errno.ELOOP else e.strerror or str(e))
        raise ConfigError(f"{what}: {path} is a symbolic link that leads nowhere ({why}: "
                          f"-> {os.readlink(path)}); remove it or point it at a folder")


def _check_owner(path: str, what: str) -> None:
    """`path` (where it exists) belongs to this user, unless SPTLIB_ALLOW_FOREIGN_WORKDIR=1."""
    try:
        st = os.stat(path)
    except OSError:
        return
    if st.st_uid != os.geteuid() and not foreign_allowed():
        raise WorkdirOwnerError(
            f"{what}: {path} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}); "
            f"another user may have prepared it (planted symlinks write outside it). Use a "
            f"folder of your own, or set {FOREIGN_ENV}=1 if you trust it")


# Room for the paths a run writes below `<workdir>/<stage>/`: a checkpoint's OCDBT data file,
# `checkpoints/<step>/state/ocdbt.process_0/d/<32 hex>`, is 72 characters at step 4 (measured);
# orbax's temporary step folders (`<step>.orbax-checkpoint-tmp-<n>`) and 7-digit steps add about
# 40, TensorBoard's event files carry the host name (up to 64).
RESERVED_PATH = 200


def check_path_lengths(path: str, stage_names=()) -> None:
    """Every component of `path` within the file system's NAME_MAX, and the files a run writes
    below it (`RESERVED_PATH` more characters) within PATH_MAX: too long a path fails only at
    the first checkpoint otherwise, inside orbax's threads."""
    probe = path
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    try:
        name_max = os.pathconf(probe or "/", "PC_NAME_MAX")
        path_max = os.pathconf(probe or "/", "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    for part in path.split(os.sep):
        if len(part.encode()) > name_max:
            raise ConfigError(f"--workdir={path[:80]}...: the folder name {part[:40]}... is "
                              f"{len(part.encode())} bytes, the file system allows {name_max} "
                              f"(NAME_MAX); use a shorter --workdir")
    longest = len(path.encode()) + 1 + max([len(n) for n in stage_names] or [16]) + \
        RESERVED_PATH
    if longest > path_max:
        raise ConfigError(f"--workdir={path[:80]}...: is {len(path.encode())} bytes long; the "
                          f"checkpoints written below it would need paths of up to {longest} "
                          f"bytes, the file system allows {path_max} (PATH_MAX); use a "
                          f"--workdir under {path_max - longest + len(path.encode())} bytes")


def _check_remote(text) -> None:
    outcome = {}

    def probe():
        try:
            outcome["exists"] = epath.Path(text).exists()
        except Exception as e:  # pylint: disable=broad-except
            outcome["error"] = e

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(REMOTE_TIMEOUT_S)
    if t.is_alive():
        raise ConfigError(f"--workdir={text}: no answer within {REMOTE_TIMEOUT_S:.0f} s (no "
                          f"network, or no credentials?); check access or use a local folder")
    if "error" in outcome:
        e = outcome["error"]
        raise ConfigError(f"--workdir={text}: cannot reach it ({type(e).__name__}: "
                          f"{' '.join(str(e).split())[:300]}); check the network and "
                          f"credentials, or use a local folder") from None


def check_stage_dirs(config, workdir) -> None:
    """Every stage's folder and its `checkpoints/`, where they exist, are folders, and not
    symlinks that lead nowhere or that another user planted."""
    text = str(workdir)
    if "://" in text:
        return
    for name in config.stage_order:
        for path in (os.path.join(text, name), os.path.join(text, name, "checkpoints")):
            path = os.path.abspath(path)
            check_link(path, f"stage {name!r}")
            if os.path.islink(path) and os.lstat(path).st_uid != os.geteuid() and \
                    not foreign_allowed():
                raise WorkdirOwnerError(
                    f"{path}: a symbolic link (-> {os.readlink(path)}) of uid "
                    f"{os.lstat(path).st_uid}, not yours: not writing through it; remove it, or "
                    f"set {FOREIGN_ENV}=1 if you trust it")
            if os.path.exists(path) and not os.path.isdir(path):
                raise ConfigError(f"{path}: is a file, but stage {name!r} "
                                  f"needs a folder there; move it aside or use another "
                                  f"--workdir")


