"""The time limit every sympy and math-verify call runs under, so that a pathological answer from an
adversarial agent cannot hang a run. math-verify's own timeouts use signal.alarm, which works only on
the main thread (readers also run on worker threads): it is called with its timeouts off, inside this."""

import signal
import threading

SYMPY_SECONDS = 2.0


class _Timeout(BaseException):
    """Not an Exception: sympy and math-verify catch Exception around their steps, and would go on."""


def timed(fn, seconds):
    """fn() or None if it takes longer than `seconds`. SIGALRM interrupts it on the main thread;
    elsewhere it runs on a daemon thread that is abandoned on timeout."""
    use_signal = (hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
                  and signal.getitimer(signal.ITIMER_REAL)[0] == 0)
    if use_signal:
        armed = [True]  # an alarm that lands once fn is over raises nothing

        def alarm(*_):
            if armed[0]:
                raise _Timeout
        old = signal.signal(signal.SIGALRM, alarm)
        try:
            signal.setitimer(signal.ITIMER_REAL, seconds)  # inside the try: a short limit may end before it
            return fn()
        except _Timeout:
            return None
        except Exception:
            return None
        finally:
            armed[0] = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
    box = []

    def run():
        try:
            box.append(fn())
        except Exception:
            box.append(None)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    return box[0] if box else None
