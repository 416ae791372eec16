"""Stop on request: SIGTERM and SIGINT (Ctrl-C) ask the loop to checkpoint the current step and
stop (exit 3 / 130); a second SIGINT interrupts at once."""

import signal
import threading

from absl import logging
import jax

from sptlib.errors import PreemptedError
from sptlib.train import lock as lock_lib


class StopFlag:
    """Set by SIGTERM or SIGINT (single-process runs) so the loop checkpoints and exits cleanly.

    `signum` is the signal received. A second SIGINT raises `KeyboardInterrupt` at once."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.requested = False
        self.signum = None
        self._previous = {}

    def install(self):
        if jax.process_count() > 1 or threading.current_thread() is not threading.main_thread():
            # Multi-host: the JAX preemption service decides (reached_preemption), consistently
            # on every process; a per-process flag could desynchronise them.
            return self
        for s in self.SIGNALS:
            self._previous[s] = signal.signal(s, self._handle)
        pending = lock_lib.pending_stop()  # a SIGTERM whose exception was swallowed before
        if pending is not None:
            self.requested, self.signum = True, pending
        return self

    def _handle(self, signum, frame):  # pylint: disable=unused-argument
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        name = signal.Signals(signum).name
        logging.warning("%s received: saving a checkpoint after this step, then stopping%s.",
                        name, " (Ctrl-C again to stop at once)" if signum == signal.SIGINT
                        else "")
        self.requested, self.signum = True, signum

    def uninstall(self):
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous = {}

    def error(self, what, then):
        """The PreemptedError of this request: "<what> on request (<signal>); <then>"."""
        how = signal.Signals(self.signum).name if self.signum else "preemption"
        return PreemptedError(f"{what} on request ({how}); {then}", signum=self.signum)
