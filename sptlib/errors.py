"""The library's own error types, and how the command lines report them (no JAX imported here).

Every error sptlib raises on bad input is a `SptlibError` whose message names the file, line,
config key or flag at fault and says what to do. The command lines (`sptlib.main`,
`sptlib.protocol.compare`, `python -m sptlib.data`, `sptlib.protocol.lengthgen`) print such an error as ONE line
and exit with status 2 (`--verbose` or `SPTLIB_TRACEBACK=1` adds the traceback); any other
exception is a bug and keeps its traceback.

    SptlibError
      ConfigError                  a config key, flag or workdir is wrong        (ValueError)
        WorkdirOwnerError          a workdir (or a file in it) belongs to another user or
                                   is a planted symlink; SPTLIB_ALLOW_FOREIGN_WORKDIR=1 accepts
                                   another owner, never a symlink
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

from sptlib import config_paths
from sptlib.cli_help import HELP_ARGS, print_flags_help  # noqa: F401 (the commands' --help)

TRACEBACK_ENV = "SPTLIB_TRACEBACK"
EXIT_ERROR = 2  # a SptlibError: bad input, or a run stopped with its checkpoints kept
EXIT_PREEMPTED = 3  # stopped on request; the same command resumes
EXIT_INTERRUPTED = 130  # stopped by SIGINT (Ctrl-C), a checkpoint kept; the same command resumes


class SptlibError(Exception):
    """Base of the library's own errors: the message alone tells the user what to fix."""


class ConfigError(SptlibError, ValueError):
    """A config key, command-line flag or workdir is wrong (the message names it)."""


class WorkdirOwnerError(ConfigError):
    """The workdir, or a file sptlib writes in it, is not this user's own (another owner, a
    planted symlink, extra hard links): nothing is written through it."""


FOREIGN_ENV = "SPTLIB_ALLOW_FOREIGN_WORKDIR"


def foreign_allowed() -> bool:
    """True when SPTLIB_ALLOW_FOREIGN_WORKDIR=1: a workdir of another user is accepted."""
    return os.environ.get(FOREIGN_ENV, "") not in ("", "0")


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


class ResultsDigestError(ResultsError):
    """A results file whose numbers differ from the digest written with them (edited, damaged)."""


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


def parse_absl_flags(argv, prog: str, doc=None):
    """absl's flag parsing for `app.run(..., flags_parser=...)`, with one-line errors: a bad
    flag value, an unknown `--config.` key (with the key path) or an unloadable config file.
    `--help` lists the command's own flags (`print_flags_help`, with `doc`) and exits 0."""
    from absl import flags  # pylint: disable=import-outside-toplevel
    args = list(argv[1:argv.index("--")] if "--" in argv else argv[1:])
    if any(a in HELP_ARGS or a == "--helpfull" for a in args):
        print_flags_help(prog, doc, full="--helpfull" in args)
        sys.exit(0)
    error = _config_file_problem(argv) or _repeated_config_flag(argv)
    if error is not None:
        sys.exit(report(error, prog, verbose=wants_traceback(argv)))
    try:
        rest = flags.FLAGS(argv)
        for name in ("config",):  # ml_collections defers a config file's load error to its use
            if name in flags.FLAGS and flags.FLAGS[name].value is not None:
                getattr(flags.FLAGS[name].value, "keys")
        return rest
    except flags.Error as e:
        if isinstance(e.__cause__ or e.__context__, StopError):  # SIGTERM while loading the file
            raise (e.__cause__ or e.__context__) from None
        text = str(e)
        where = _config_file_frame(argv, text)
        if "--config must have a value other than None" in text and _config_path(argv):
            text = (f"--config={_config_path(argv)}: get_config() returned None (a missing "
                    f"return statement?)")
        elif where and "Traceback (most recent call last)" in text:
            text = f"{where}: {text.strip().splitlines()[-1].strip()} (in the --config file)"
        if "Traceback (most recent call last)" in text:  # get_config raised: keep its last line
            head = text.split("Traceback (most recent call last)")[0].strip().rstrip(":")
            text = f"{head}: {text.strip().splitlines()[-1].strip()}"
        error = ConfigError(f"{text}; see --help")
    except (AttributeError, KeyError) as e:  # ml_collections: a locked config has no such key
        error = ConfigError(_through_a_leaf(argv) or _unknown_key_message(e, argv))
    except OSError as e:  # the config file could not be loaded
        cause = e.__cause__ or e.__context__ or e
        files = [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]
        error = ConfigError(f"--config={files[0] if files else '?'}: cannot load the config file "
                            f"({type(cause).__name__}: {cause})")
        error.__cause__ = e
    except StopError:  # a stop request (SIGTERM) that landed while the file was imported
        raise
    except Exception as e:  # pylint: disable=broad-except  (raised while importing the file)
        where = _config_file_frame(argv, "".join(traceback.format_exception(e)))
        if not where:
            raise
        error = ConfigError(f"{where}: {type(e).__name__}: {e} (while loading the --config "
                            f"file)")
        error.__cause__ = e
    sys.exit(report(error, prog, verbose=wants_traceback(argv)))


def _config_path(argv):
    """The file of `--config=<file>[:arg]` (or `--config <file>`) as loading resolves it (a
    packaged `experiments/X.py`), or None."""
    for i, a in enumerate(argv):
        if a.startswith("--config="):
            return config_paths.resolve_config_path(a.split("=", 1)[1].split(":")[0])
        if a == "--config" and i + 1 < len(argv):
            return config_paths.resolve_config_path(argv[i + 1].split(":")[0])
    return None


def _config_file_frame(argv, text):
    """`file:line` of the innermost traceback frame in the --config file, or None."""
    path = _config_path(argv)
    if not path:
        return None
    found = [m for m in re.finditer(r'File "([^"]+)", line (\d+)', text)
             if os.path.abspath(m.group(1)) == os.path.abspath(path)]
    return f"{path}:{found[-1].group(2)}" if found else None


def _load_config(argv):
    """The --config file's ConfigDict (its `get_config()`), or None when it cannot be had."""
    import importlib.util
    path = _config_path(argv)
    if not path or not os.path.isfile(path):
        return None
    try:
        spec = importlib.util.spec_from_file_location("_sptlib_config_probe", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        arg = next((a.split("=", 1)[1].split(":", 1)[1] for a in argv
                    if a.startswith("--config=") and ":" in a.split("=", 1)[1]), None)
        return module.get_config(arg) if arg is not None else module.get_config()
    except Exception:  # pylint: disable=broad-except
        return None


def _through_a_leaf(argv):
    """For `--config.a.b.c=v` where `a.b` is a value (not a group): the one line that says so,
    or None. (ml_collections reports the value's type name as the missing key.)"""
    config = _load_config(argv)
    if config is None:
        return None
    for a in argv:
        if not a.startswith("--config.") or "=" not in a:
            continue
        flag = a.split("=", 1)[0]
        parts, node = flag[len("--config."):].split("."), config
        for i, part in enumerate(parts[:-1]):
            try:
                node = node[part]
            except (KeyError, TypeError, AttributeError):
                break
            if not hasattr(node, "keys"):
                return (f"{flag}: config.{'.'.join(parts[:i + 1])} is a value "
                        f"({type(node).__name__} {node!r}), not a group: it has no field "
                        f"{parts[i + 1]!r}; docs/training.md lists every field")
    return None


def _config_file_problem(argv):
    """A ConfigError for a --config file that cannot be a config (a syntax error, no
    `get_config`), found without running it; None otherwise."""
    import ast
    path = _config_path(argv)
    if not path or not path.endswith(".py") or not os.path.isfile(path):
        return None  # a missing file: ml_collections' own message names it
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), filename=path)
    except SyntaxError as e:
        return ConfigError(f"{path}:{e.lineno}: SyntaxError: {e.msg} (in the --config file)")
    except (OSError, ValueError) as e:
        return ConfigError(f"--config={path}: cannot read the config file ({e})")
    names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)} | {
        t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
        if isinstance(t, ast.Name)} | {
        a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom)
        for a in n.names}
    if "get_config" not in names:
        return ConfigError(f"--config={path}: defines no get_config() function; a config file "
                           f"returns its ConfigDict from get_config() (see experiments/smoke.py)")
    return None


def _repeated_config_flag(argv):
    """A ConfigError for a tuple-valued `--config.<key>` given twice: absl would join the two
    values (`--config.stage_order` twice runs both stages). A scalar given twice keeps the
    last value, as absl does."""
    seen, repeated = {}, {}
    for a in argv:
        if a.startswith("--config.") and "=" in a:
            key, value = a.split("=", 1)
            if key in seen:
                repeated.setdefault(key, seen[key])
                repeated[key + " then"] = value
            seen[key] = value
    keys = [k for k in repeated if not k.endswith(" then")]
    if not keys:
        return None
    config = _load_config(argv)
    for key in keys:
        node = config
        for part in key[len("--config."):].split("."):
            try:
                node = node[part]
            except (KeyError, TypeError, AttributeError):
                node = None
                break
        if isinstance(node, (tuple, list)):
            return ConfigError(f"{key} is given twice ({repeated[key]!r}, then "
                               f"{repeated[key + ' then']!r}), which would join the values; "
                               f"give it once (a tuple as one value: {key}=a,b)")
    return None


def exit_code(e: BaseException) -> int:
    """2 for a `SptlibError`; a stop on request 3, or 130 when it was SIGINT (Ctrl-C)."""
    if isinstance(e, PreemptedError):
        return EXIT_INTERRUPTED if e.signum == signal.SIGINT else EXIT_PREEMPTED
    return EXIT_ERROR


EXIT_GRACE_S = 10.0  # after the main thread ends, how long threads may hold the exit up


def report(e: BaseException, prog: str, *, verbose=None, stream=None) -> int:
    """Prints `prog: error: <one line>` (plus the traceback when asked); returns the exit code.

    Also arms `exit_guard`: a command line that reported an error exits, even when library
    threads it cannot stop (orbax's background save threads after a failed write) would keep
    the interpreter waiting for them forever."""
    stream = stream or sys.stderr
    if verbose if verbose is not None else wants_traceback():
        traceback.print_exception(type(e), e, e.__traceback__, file=stream)
    label = "stopped" if isinstance(e, StopError) else "error"
    stream.write(f"{prog}: {label}: {one_line(e)}\n")
    stream.flush()
    code = exit_code(e)
    exit_guard(code)
    return code


def exit_guard(code: int, grace_s: float = None) -> None:
    """Ends the process with `code` when, `grace_s` after its main thread finished (the
    interpreter is joining the remaining threads), it is still alive. A daemon thread: it never
    keeps a healthy process up, and does nothing while the main thread runs."""
    import threading
    grace = EXIT_GRACE_S if grace_s is None else grace_s

    def watch():
        import time
        main = threading.main_thread()
        main.join()
        time.sleep(grace)
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:  # pylint: disable=broad-except
            pass
        os._exit(code)

    threading.Thread(target=watch, name="sptlib-exit-guard", daemon=True).start()

