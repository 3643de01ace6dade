"""A reward-pool worker: ``python -m npu_rl.reward._pool_worker <read fd> <write fd>`` (started by pool.py).

Protocol over the two pipes (pickled tuples): the parent sends ``("init", ScoreFnSpec)``; the worker loads the
function and answers ``("ready", None)`` or ``("init_error", message)``. Then ``("task", index, payload)`` ->
``("done", index, Outcome)`` until ``("exit",)`` or the parent's end of the pipe closes.
"""

from __future__ import annotations

import pickle
import sys
from multiprocessing.connection import Connection

from npu_rl.reward.pool import Outcome, execute


def main(argv: list[str]) -> int:
    import signal

    # Ctrl-C reaches the whole foreground process group: the trainer finishes its step (and this row) before it
    # stops, then closes the pipe, which ends this worker. So SIGINT is not for us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    inbox = Connection(int(argv[0]), writable=False)
    outbox = Connection(int(argv[1]), readable=False)
    try:
        _, spec = inbox.recv()
        fn = spec.load()
        if spec.path is None:  # import sympy & co. now, so the first row's time limit does not pay for it
            from npu_rl.reward.math_utils import math_verify_equal

            math_verify_equal("1", "1")
    except EOFError:
        return 0
    except Exception as exc:  # report the loading error to the parent, which raises it with context
        outbox.send(("init_error", f"{type(exc).__name__}: {exc}"))
        return 1
    outbox.send(("ready", None))
    while True:
        try:
            message = inbox.recv()
        except EOFError:  # the parent went away
            return 0
        if message[0] == "exit":
            return 0
        _, index, payload = message
        outcome = execute(fn, spec, payload)
        try:
            outbox.send(("done", index, outcome))
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            outcome = Outcome("error", error=f"the reward function returned a value that cannot be sent back "
                                             f"between processes: {type(exc).__name__}: {exc}")
            outbox.send(("done", index, outcome))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
