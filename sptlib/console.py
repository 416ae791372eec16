"""What a person sees while sptlib runs: one display per process, the details in the workdir.

    stderr      warnings and errors (absl's format), always; with --verbose every INFO record too
    stderr      per training stage a progress bar (tqdm: steps, rate, ETA, last loss, last
                validation metric), only when stderr is a terminal: piped or redirected (CI,
                nohup, tests) there is no bar, never a carriage-return frame; the steps are in
                the log file (`tail -f <workdir>/log.txt`)
    stdout      results: a line per finished stage (`sptlib.main`) or run (`sptlib.compare`),
                then the table
    log.txt     every record of the process at INFO and above, appended, under the workdir of the
                run (`log.<i>.txt` on process i > 0 of a multi-process run); a comparison keeps
                its own lines in `<workdir>/log.txt` and each run's in the run's folder

One handler on the root logger routes every record (absl's, orbax's, jax's, Python warnings) so
that no line is printed twice. A gs:// workdir cannot be appended to: there the details go to
stderr as with --verbose. No JAX here: the command lines import this module before their flags.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import logging as pylogging
import os
import sys
import threading
import traceback
from typing import Iterator, Optional

LOG_FILE = "log.txt"
_PENDING_MAX = 5000  # records kept before the first log file opens (config loading, ...)


def log_name(process_index: int = 0) -> str:
    """`log.txt` on process 0, `log.<i>.txt` on process i."""
    return LOG_FILE if process_index == 0 else f"log.{process_index}.txt"


class _Router(pylogging.Handler):
    """Sends each record to the innermost open log file (or keeps it until one opens) and, at
    the terminal's level, to stderr without breaking a progress bar."""

    def __init__(self, formatter):
        super().__init__(pylogging.NOTSET)
        self.setFormatter(formatter)
        self.terminal_level = pylogging.WARNING
        self.files: list = []        # stack of open files (None: a remote workdir, no file)
        self.pending: list = []
        self.file_errors: set = set()
        self.shown: set = set()

    def emit(self, record):
        try:
            text = self.format(record)
        except Exception:  # pylint: disable=broad-except  (a bad %-format in someone's call)
            text = f"{record.levelname} {record.pathname}:{record.lineno}] {record.msg!r}"
        with _lock:
            no_file = bool(self.files) and self.files[-1] is None
            if self.files and not no_file:
                self._write(self.files[-1], text)
            elif not self.files:
                self.pending.append(text)
                del self.pending[:-_PENDING_MAX]
        level = pylogging.INFO if no_file else self.terminal_level
        if record.levelno < level or getattr(record, "sptlib_result", False) or (
                level > pylogging.INFO and _not_actionable(record)):
            return
        if level > pylogging.INFO:  # not --verbose: a warning repeated verbatim shows once
            key = (record.levelno, record.getMessage())
            if key in self.shown:
                return
            self.shown.add(key)
        write(text + "\n", sys.stderr)

    def _write(self, f, text):
        try:
            f.write(text + "\n")
        except (OSError, ValueError) as e:  # a full disk, a file-size limit, a closed file
            # The run reports its own write errors in one line; the log must not add a
            # traceback ("--- Logging error ---") or stop it.
            if f.name not in self.file_errors:
                self.file_errors.add(f.name)
                write(f"W sptlib.console] cannot append to {f.name} ({e}); the details "
                      f"of this run are not logged from here on.\n", sys.stderr)


# Third-party warnings that ask nothing of the user at the size they have: the log file only.
_SLOW_SAVE_S = 60.0


def _not_actionable(record) -> bool:
    """orbax's "Waiting for previous save to complete took X seconds" (an asynchronous save
    overlapping the next one on a busy machine) under a minute: the run waits, nothing to do."""
    if "/orbax/" in record.pathname and str(record.msg).startswith(
            "Waiting for previous save to complete took"):
        try:
            return float(record.args[0]) < _SLOW_SAVE_S
        except (TypeError, ValueError, IndexError):
            return False
    return False


_lock = threading.RLock()
_router: Optional[_Router] = None
_removed: list = []       # absl's stderr handler, put back by `reset`
_bars: list = []          # open tqdm bars of this process
_settings = {"bars": True, "stage_results": True, "results": True, "context": "", "prog": ""}


def setup(prog: str = "", *, verbose: bool = False, bars: Optional[bool] = None,
          stage_results: bool = True, results: bool = True) -> None:
    """Installs the routing of log records (idempotent; the last call's settings hold).

    Args:
      prog: the command (`sptlib.main`), for the line that starts each invocation's log.
      verbose: INFO records to stderr as well (as without this module), not only to the file.
      bars: progress bars (default: when stderr is a terminal).
      stage_results: a stdout line per finished stage (`sptlib.main`; not within a comparison,
        whose line per run says it).
      results: any result line on stdout (off in `--jobs`' workers: their parent reports).
    """
    global _router
    from absl import logging as absl_logging  # light; absl is what every CLI parses flags with
    root = pylogging.getLogger()
    with _lock:
        if _router is None:
            _router = _Router(absl_logging.PythonFormatter())
            for h in list(root.handlers):
                if isinstance(h, absl_logging.ABSLHandler):  # it writes every record to stderr
                    root.removeHandler(h)
                    _removed.append(h)
            root.addHandler(_router)
        _router.terminal_level = pylogging.INFO if verbose else pylogging.WARNING
    # The file holds INFO even where nothing asked absl for it (--verbosity=-1 means WARNING).
    if absl_logging.get_absl_logger().getEffectiveLevel() > pylogging.INFO:
        absl_logging.set_verbosity(absl_logging.INFO)
    if root.level > pylogging.INFO or root.level == pylogging.NOTSET:
        root.setLevel(pylogging.INFO)
    pylogging.captureWarnings(True)  # Python warnings: to stderr as before, and into the file
    _settings.update(bars=_is_terminal(sys.stderr) if bars is None else bars,
                     stage_results=stage_results, results=results, prog=prog)


def reset() -> None:
    """Undoes `setup` (tests)."""
    global _router
    root = pylogging.getLogger()
    with _lock:
        close_bars()
        if _router is not None:
            root.removeHandler(_router)
            for f in _router.files:
                if f is not None:
                    f.close()
        for h in _removed:
            root.addHandler(h)
        _removed.clear()
        _router = None
    pylogging.captureWarnings(False)
    _settings.update(bars=True, stage_results=True, results=True, context="")


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def write(text: str, stream=None) -> None:
    """Writes `text` to `stream` (stdout), clearing and redrawing any progress bar around it."""
    stream = sys.stdout if stream is None else stream
    if _bars:
        from tqdm import tqdm  # deferred: only where a bar is shown
        with tqdm.external_write_mode(file=stream):
            stream.write(text)
            stream.flush()
    else:
        stream.write(text)
        stream.flush()


def result(text: str, *, stage: bool = False) -> None:
    """A result line: on stdout (where a command line called `setup`, unless this process shows
    no results or it is a `stage` line and stage lines are off) and into the log file, never
    twice on a terminal."""
    show = _router is not None and _settings["results"] and (
        _settings["stage_results"] or not stage)  # a library caller (no CLI): the log only
    pylogging.getLogger("sptlib").info(text, extra={"sptlib_result": show}, stacklevel=2)
    if show:
        write(text + "\n")


def _no_follow(path: str, flags: int) -> int:
    """`open`'s opener for the log: never through a symlink at `path` (ELOOP instead)."""
    return os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o666)


def _open_log(path: str):
    """`path` opened to append, never through a symlink: a link planted at the log's name (to a
    file outside the workdir) is replaced by a regular file, with one warning naming it, instead
    of the run appending its log to whatever the link points at."""
    try:
        return open(path, "a", encoding="utf-8", buffering=1, opener=_no_follow)  # noqa: SIM115
    except OSError as e:
        if e.errno != errno.ELOOP or not os.path.islink(path):
            raise
    pylogging.getLogger("sptlib").warning(
        "%s is a symbolic link (to %s): not written through; replaced by a regular file.",
        path, os.readlink(path))
    os.unlink(path)
    # "x": a link planted again meanwhile is refused (O_EXCL), not followed
    return open(path, "x", encoding="utf-8", buffering=1, opener=_no_follow)  # noqa: SIM115


@contextlib.contextmanager
def log_file(directory, process_index: int = 0, *, name: str = "",
             header: str = "") -> Iterator[Optional[str]]:
    """Appends this process's records to `directory/log.txt` (`log.<i>.txt`, or `name`) while open; the
    innermost open file gets them. An exception leaving the block is written into the file with
    its traceback (the terminal keeps its one line). Yields the path, or None for a remote
    (gs://) directory, where the details go to stderr instead."""
    if _router is None:
        yield None
        return
    remote = "://" in str(directory)
    f = None
    if not remote:
        path = os.path.join(os.fspath(directory), name or log_name(process_index))
        try:
            os.makedirs(os.fspath(directory), exist_ok=True)  # process i > 0 may come first
            f = _open_log(path)
        except OSError as e:
            pylogging.getLogger("sptlib").warning("cannot open %s (%s): the details of this "
                                                  "run go nowhere.", path, e)
            remote = True
    with _lock:
        if f is not None:
            stamp = datetime.datetime.now().isoformat(sep=" ", timespec="seconds")
            _router._write(f, f"==== {stamp} pid {os.getpid()}: "
                           f"{header or ' '.join([_settings['prog'] or sys.argv[0]] + sys.argv[1:])}")
            for text in _router.pending:  # what was logged before the first file opened
                _router._write(f, text)
            _router.pending.clear()
        _router.files.append(f)
    try:
        yield None if f is None else path
    except BaseException as e:
        if f is not None:
            with _lock:
                _router._write(f, "E sptlib.console] stopped: " + "".join(
                    traceback.format_exception(type(e), e, e.__traceback__)).rstrip())
        raise
    finally:
        with _lock:
            if _router is not None and f in _router.files:
                _router.files.reverse()
                _router.files.remove(f)  # the innermost (last) entry that is this one
                _router.files.reverse()
        if f is not None:
            try:
                f.close()
            except OSError:  # its last line did not fit either: said once already
                pass


@contextlib.contextmanager
def task(text: str) -> Iterator[None]:
    """Prefixes the progress bars opened inside (e.g. a comparison's "(3/18) s4d/scratch/seed0")."""
    before = _settings["context"]
    _settings["context"] = text
    try:
        yield
    finally:
        _settings["context"] = before


class Bar:
    """A progress bar (a training stage's steps, a comparison's runs); every method is a no-op
    where no bar is shown."""

    def __init__(self, name: str, start: int, total: int, *, unit: str = "step",
                 show: bool = True):
        self._bar = None
        self._post: dict = {}
        if not (show and _settings["bars"] and _settings["results"] and _router is not None):
            return
        from tqdm import tqdm  # deferred: only where a bar is shown
        desc = " ".join(s for s in (_settings["context"], name) if s)
        self._bar = tqdm(total=total, initial=start, desc=desc, unit=unit, leave=False,
                         file=sys.stderr, dynamic_ncols=True, mininterval=0.5, smoothing=0.1)
        _bars.append(self._bar)

    def update(self, step: int, **postfix) -> None:
        """Moves the bar to `step`; `postfix` (e.g. loss=2.31, val_accuracy=0.61) is kept until
        the same key is given again."""
        if self._bar is None:
            return
        self._post.update({k: f"{v:.4g}" if isinstance(v, float) else v
                           for k, v in postfix.items()})
        self._bar.set_postfix(self._post, refresh=False)
        self._bar.update(max(0, step - self._bar.n))

    def close(self) -> None:
        if self._bar is not None:
            _close(self._bar)
            self._bar = None


def _close(bar) -> None:
    with _lock:
        if bar in _bars:
            _bars.remove(bar)
    bar.close()


def close_bars() -> None:
    """Closes every open bar (before an error line, so it does not land on a bar's line)."""
    for bar in list(_bars):
        _close(bar)
