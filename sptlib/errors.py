"""The library's own error types, and how the command lines report them (no JAX imported here).

Every error sptlib raises on bad input is a `SptlibError` whose message names the file, line,
config key or flag at fault and says what to do. The command lines (`sptlib.main`,
`sptlib.compare`, `python -m sptlib.data`, `sptlib.lengthgen`) print such an error as ONE line
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
      ResultsError                 a results file cannot be read                 (ValueError)
      StopError                    a run stopped on purpose, its checkpoints kept
        NonFiniteLossError         NaN/inf training loss                 (FloatingPointError)
        PreemptedError             SIGTERM / preemption; exit status 3         (RuntimeError)
"""

import os
import re
import sys
import traceback

TRACEBACK_ENV = "SPTLIB_TRACEBACK"
EXIT_ERROR = 2  # a SptlibError: bad input, or a run stopped with its checkpoints kept
EXIT_PREEMPTED = 3  # stopped on request; the same command resumes


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


class ResultsError(SptlibError, ValueError):
    """A results file is unreadable (e.g. truncated by a kill)."""


class StopError(SptlibError):
    """A run stopped on purpose; its last good checkpoint is kept."""


class NonFiniteLossError(StopError, FloatingPointError):
    """Training produced a NaN/inf loss; the stage stopped, its last good checkpoint is kept."""


class PreemptedError(StopError, RuntimeError):
    """The run was asked to stop (SIGTERM / preemption); a checkpoint of the last step was saved."""


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


def parse_absl_flags(argv, prog: str):
    """absl's flag parsing for `app.run(..., flags_parser=...)`, with one-line errors: a bad
    flag value, an unknown `--config.` key (with the key path) or an unloadable config file."""
    from absl import flags  # pylint: disable=import-outside-toplevel
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
        error = ConfigError(f"{text}; see --helpfull")
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
    return EXIT_PREEMPTED if isinstance(e, PreemptedError) else EXIT_ERROR


def report(e: BaseException, prog: str, *, verbose=None, stream=None) -> int:
    """Prints `prog: error: <one line>` (plus the traceback when asked); returns the exit code."""
    stream = stream or sys.stderr
    if verbose if verbose is not None else wants_traceback():
        traceback.print_exception(type(e), e, e.__traceback__, file=stream)
    label = "stopped" if isinstance(e, StopError) else "error"
    stream.write(f"{prog}: {label}: {one_line(e)}\n")
    stream.flush()
    return exit_code(e)

