"""A failed write as one line: the disk-full / file-size / read-only `OSError` that orbax,
tensorstore or TensorFlow wrapped, turned into a `WriteError` naming the file and what to do."""

import os
import re

from sptlib.errors import WriteError


def write_error(e: OSError, path=None, *, under: bool = False) -> "WriteError":
    """A one-line `WriteError` for an `OSError` of writing `path` (disk full: with the free
    space of its file system; a file-size limit: with the limit). `under`: `path` is the folder
    the file was in, not the file."""
    import errno
    target = path or getattr(e, "filename", None) or "?"
    where = f"a file under {target}" if under and path else target
    reason = e.strerror or str(e)
    hint = ""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        hint = (f"; {_free_space(target)} free there: free some space or use another "
                f"--workdir") if target != "?" else "; free some space or use another --workdir"
    elif e.errno == errno.EFBIG:
        hint = f"; the file-size limit is {_fsize_limit()} (ulimit -f): raise it"
    elif e.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
        hint = "; pick a writable --workdir"
    elif e.errno == errno.ENAMETOOLONG:
        hint = "; use a shorter --workdir"
        where = f"{str(where)[:120]}... ({len(str(where))} characters)"
    elif e.errno == errno.ELOOP:
        hint = "; a symbolic link loop on the way: remove it"
    out = WriteError(f"cannot write {where}: {reason} (errno {e.errno}){hint}")
    out.errno = e.errno
    return out


def _free_space(path) -> str:
    import shutil
    p = str(path)
    while p and not os.path.exists(p):
        p = os.path.dirname(p)
    try:
        return f"{shutil.disk_usage(p or '.').free / 2**20:.1f} MiB"
    except OSError:
        return "? MiB"


def _fsize_limit() -> str:
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    except (ImportError, OSError, ValueError):
        return "?"
    return "unlimited" if soft == resource.RLIM_INFINITY else f"{soft} bytes"


# ENOSPC, EDQUOT, EFBIG, EROFS, ENAMETOOLONG, EACCES, EPERM, ELOOP: a file that cannot be
# written (orbax raises them from its background threads).
WRITE_ERRNOS = (28, 122, 27, 30, 36, 13, 1, 40)


def find_write_error(e: BaseException, where=None):
    """The disk-full / file-size / read-only `OSError` in `e`'s chain (orbax and tensorstore
    wrap it), as a `WriteError`; None when there is none. Messages of wrapped errors that only
    carry the text ("No space left on device") are recognised too. `where` names the folder
    written to when the error does not name its file."""
    import errno
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, WriteError):
            return e
        if isinstance(e, OSError) and e.errno in WRITE_ERRNOS:
            return write_error(e, None if e.filename else where, under=not e.filename)
        text = str(e)
        for code, needle in ((errno.ENOSPC, "No space left on device"),
                             (errno.EFBIG, "File too large"),
                             (errno.EROFS, "Read-only file system")):
            if needle in text:
                found = re.search(r"(/[^\s'\"\]\[]+)", text)
                if found:
                    return write_error(OSError(code, needle), found.group(1).rstrip(":;,."))
                return write_error(OSError(code, needle), where, under=True)
        e = e.__cause__ or e.__context__
    return None
