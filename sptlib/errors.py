"""The library's own error types, and how the command lines report them (no JAX imported here).

Every error sptlib raises on bad input is a `SptlibError` whose message names the file, line,
config key or flag at fault and says what to do. The command lines (`sptlib.main`,
`sptlib.protocol.compare`, `python -m sptlib.data`, `sptlib.protocol.lengthgen`) print such an error as ONE line
and exit with status 2 (`--verbose` or `SPTLIB_TRACEBACK=1` adds the traceback); any other
exception is a bug and keeps its traceback.

    SptlibError
      ConfigError                  a config key, flag or workdir is wrong        (ValueError)
      DataError                    a data file is missing or malformed           (ValueError)
      CheckpointError
        CheckpointMismatchError    a checkpoint was written by another config    (ValueError)
        NoReadableCheckpointError  every checkpoint of a stage is unreadable
        IncompatibleCheckpointError  init_from does not fit the model          (ValueError)
        NoCheckpointError          init_from points at no checkpoint      (FileNotFoundError)
        CheckpointDigestError      a checkpoint's bytes differ from its save-time digest
                                                                               (RuntimeError)
      ResultsError                 a results file cannot be read                 (ValueError)
      WorkdirBusyError             another live run holds the workdir's lock
      WriteError                   disk full, file-size limit, unwritable path       (OSError)
      StopError                    a run stopped on purpose, its checkpoints kept
        NonFiniteLossError         NaN/inf loss or parameters            (FloatingPointError)
        PreemptedError             SIGTERM / preemption: exit status 3; SIGINT (Ctrl-C): 130
                                                                               (RuntimeError)
"""

import os
import re
import signal
import sys
import traceback

TRACEBACK_ENV = "SPTLIB_TRACEBACK"
EXIT_ERROR = 2  # a SptlibError: bad input, or a run stopped with its checkpoints kept
EXIT_PREEMPTED = 3  # stopped on request; the same command resumes
EXIT_INTERRUPTED = 130  # stopped by SIGINT (Ctrl-C), a checkpoint kept; the same command resumes


class SptlibError(Exception):
    """Base of the library's own errors: the message alone tells the user what to fix."""


class ConfigError(SptlibError, ValueError):
    """A config key, command-line flag or workdir is wrong (the message names it)."""


class DataError(SptlibError, ValueError):
    """Malformed or missing data files (the message names the file and, where known, line)."""


class CheckpointError(SptlibError):
    """A checkpoint cannot be used."""


class CheckpointMismatchError(CheckpointError, ValueError):
    """A stage's checkpoint was written by another config (tree, shape or dtype differ)."""


class NoReadableCheckpointError(CheckpointError):
    """Every checkpoint of a stage was unreadable (moved aside); it would restart from step 0."""


class IncompatibleCheckpointError(CheckpointError, ValueError):
    """A checkpoint's parameters do not fit the model (names the first mismatched parameter)."""


class NoCheckpointError(CheckpointError, FileNotFoundError):
    """`init_from` points at a place that holds no readable checkpoint."""


class CheckpointDigestError(CheckpointError, RuntimeError):
    """A checkpoint's arrays or JSON items differ from the digest recorded when it was saved."""


class ResultsError(SptlibError, ValueError):
    """A results file is unreadable (e.g. truncated by a kill)."""


class WorkdirBusyError(SptlibError):
    """Another live process holds the workdir's lock (the message names its pid and host)."""


class WriteError(SptlibError, OSError):
    """A file could not be written: disk full, file-size limit (ulimit -f), unwritable path."""


class StopError(SptlibError):
    """A run stopped on purpose; its last good checkpoint is kept."""


class NonFiniteLossError(StopError, FloatingPointError):
    """Training produced a NaN/inf loss; the stage stopped, its last good checkpoint is kept."""


class PreemptedError(StopError, RuntimeError):
    """The run was asked to stop (SIGTERM / preemption / SIGINT); a checkpoint of the last step
    was saved. `signum` is the signal that asked (None: the preemption service)."""

    def __init__(self, message="", signum=None):
        super().__init__(message)
        self.signum = signum


def one_line(e: BaseException) -> str:
    """`e`'s message on one line (newlines folded), prefixed by its type name."""
    text = " ".join(str(e).split()) or "(no message)"
    return f"{type(e).__name__}: {text}"


def wants_traceback(argv=None) -> bool:
    """True when `--verbose` is on the command line or SPTLIB_TRACEBACK=1 is set."""
    argv = sys.argv if argv is None else argv
    return (os.environ.get(TRACEBACK_ENV, "") not in ("", "0")
            or any(a in ("--verbose", "--verbose=true", "--verbose=True") for a in argv))


def _unknown_key_message(e: BaseException, argv) -> str:
    """One line for ml_collections' error on an unknown `--config.a.b=v` key."""
    text = str(e.args[0] if e.args else e)
    found = re.search(r"'([\w-]+)", text)
    key = found.group(1) if found else "?"
    hint = re.search(r"Did you mean [^?]*\?", text)
    flag = next((a.split("=")[0] for a in argv if a.startswith("--config.") and
                 key in a.split("=")[0].split(".")), None)
    where = (f"{flag}: no such config key {flag[len('--config.'):]!r}" if flag
             else f"no config key {key!r}")
    return (f"{where}{' (' + hint.group(0) + ')' if hint else ''}; docs/training.md lists every "
            f"field")


HELP_ARGS = ("-h", "-?", "-help", "--help", "--helpshort")


def print_flags_help(prog: str, doc=None, *, full=False, stream=None):
    """`--help`: `doc` (default: the `__main__` module's docstring), then every flag the command
    defined (absl's own `--help` lists only the `__main__` module's flags, so a command whose
    flags live in another module listed none); `full` adds absl's and other libraries' flags."""
    from absl import flags  # pylint: disable=import-outside-toplevel
    stream = stream or sys.stdout
    doc = doc if doc is not None else (getattr(sys.modules.get("__main__"), "__doc__", "") or "")
    by_module = flags.FLAGS.flags_by_module_dict()
    mine = sorted(m for m in by_module if full or not m.startswith(("absl", "jax", "ml_collections")))
    lines = [doc.strip(), "", f"{prog} flags:"] if doc.strip() else [f"{prog} flags:"]
    for flag in sorted({f for m in mine for f in by_module[m]}, key=lambda f: f.name):
        help_text = flags.text_wrap(f"--{'[no]' if flag.boolean else ''}{flag.name}: "
                                    f"{flag.help}", indent="    ", firstline_indent="  ")
        default = "" if flag.default in (None, "") else f"\n    (default: {flag.default_as_str})"
        lines.append(help_text + default)
    if not full:
        lines.append("\n--helpfull lists absl's own flags too.")
    stream.write("\n".join(lines) + "\n")
    stream.flush()


def parse_absl_flags(argv, prog: str, doc=None):
    """absl's flag parsing for `app.run(..., flags_parser=...)`, with one-line errors: a bad
    flag value, an unknown `--config.` key (with the key path) or an unloadable config file.
    `--help` lists the command's own flags (`print_flags_help`, with `doc`) and exits 0."""
    from absl import flags  # pylint: disable=import-outside-toplevel
    args = list(argv[1:argv.index("--")] if "--" in argv else argv[1:])
    if any(a in HELP_ARGS or a == "--helpfull" for a in args):
        print_flags_help(prog, doc, full="--helpfull" in args)
        sys.exit(0)
    try:
        rest = flags.FLAGS(argv)
        for name in ("config",):  # ml_collections defers a config file's load error to its use
            if name in flags.FLAGS and flags.FLAGS[name].value is not None:
                getattr(flags.FLAGS[name].value, "keys")
        return rest
    except flags.Error as e:
        text = str(e)
        if "Traceback (most recent call last)" in text:  # get_config raised: keep its last line
            head = text.split("Traceback (most recent call last)")[0].strip().rstrip(":")
            text = f"{head}: {text.strip().splitlines()[-1].strip()}"
        error = ConfigError(f"{text}; see --help")
    except (AttributeError, KeyError) as e:  # ml_collections: a locked config has no such key
        error = ConfigError(_unknown_key_message(e, argv))
    except OSError as e:  # the config file could not be loaded
        cause = e.__cause__ or e.__context__ or e
        files = [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]
        error = ConfigError(f"--config={files[0] if files else '?'}: cannot load the config file "
                            f"({type(cause).__name__}: {cause})")
        error.__cause__ = e
    sys.exit(report(error, prog, verbose=wants_traceback(argv)))


def exit_code(e: BaseException) -> int:
    """2 for a `SptlibError`; a stop on request 3, or 130 when it was SIGINT (Ctrl-C)."""
    if isinstance(e, PreemptedError):
        return EXIT_INTERRUPTED if e.signum == signal.SIGINT else EXIT_PREEMPTED
    return EXIT_ERROR


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
        hint = f"; {_free_space(target)} free there: free some space or use another --workdir"
    elif e.errno == errno.EFBIG:
        hint = f"; the file-size limit is {_fsize_limit()} (ulimit -f): raise it"
    elif e.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
        hint = "; pick a writable --workdir"
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


WRITE_ERRNOS = (28, 122, 27, 30)  # ENOSPC, EDQUOT, EFBIG, EROFS


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


def report(e: BaseException, prog: str, *, verbose=None, stream=None) -> int:
    """Prints `prog: error: <one line>` (plus the traceback when asked); returns the exit code."""
    stream = stream or sys.stderr
    if verbose if verbose is not None else wants_traceback():
        traceback.print_exception(type(e), e, e.__traceback__, file=stream)
    label = "stopped" if isinstance(e, StopError) else "error"
    stream.write(f"{prog}: {label}: {one_line(e)}\n")
    stream.flush()
    return exit_code(e)

