"""Signal handlers a library replaces are put back (``ray.init`` replaces SIGTERM's; the Ray run's test shows the
whole path: SIGTERM, checkpoint, exit 143)."""

import signal

from tdrl.utils.interrupt import keeps_signal_handlers


def test_handlers_replaced_inside_are_put_back():
    def ours(signum, frame):
        pass

    before = {sig: signal.signal(sig, ours) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with keeps_signal_handlers():
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        assert signal.getsignal(signal.SIGTERM) is ours and signal.getsignal(signal.SIGINT) is ours
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
