"""A reward function scored in the trainer's process (``reward_model.num_workers=0``, the default) cannot end the run
without a word: ``os._exit``, ``sys.exit``, ``raise SystemExit`` and a ``KeyboardInterrupt`` it raises itself are
errors naming the function and the row (``npu_rl/utils/exit_guard.py``); the user's own Ctrl-C still interrupts.

Before: ``os._exit(3)`` in the reward ended the trainer at once with exit code 3 and nothing printed, and a
``KeyboardInterrupt`` raised by the function read as the user's Ctrl-C (exit 130, no traceback)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from npu_rl.reward import build_reward_manager
from npu_rl.reward.score_fn import RewardFunctionError
from tests.helpers import make_tiny_tokenizer
from tests.reward.common import config, make_batch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FUNCTIONS = textwrap.dedent('''
    import os
    import signal
    import sys
    import time


    def os_exit(data_source, solution_str, ground_truth, extra_info=None):
        os._exit(3)


    def sys_exit_0(data_source, solution_str, ground_truth, extra_info=None):
        sys.exit(0)


    def raises_system_exit(data_source, solution_str, ground_truth, extra_info=None):
        raise SystemExit


    def raises_keyboard_interrupt(data_source, solution_str, ground_truth, extra_info=None):
        raise KeyboardInterrupt


    def user_presses_ctrl_c(data_source, solution_str, ground_truth, extra_info=None):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
        return 1.0


    def forks_a_child_that_exits(data_source, solution_str, ground_truth, extra_info=None):
        pid = os.fork()
        if pid == 0:  # the child must really end here (multiprocessing's children end with os._exit)
            try:
                os._exit(7)
            finally:
                os.kill(os.getpid(), signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        return float(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 7)
''')

SCORE_ONE_BATCH = textwrap.dedent('''
    import sys
    from npu_rl.reward import build_reward_manager
    from tests.helpers import make_tiny_tokenizer
    from tests.reward.common import config, make_batch
    tok = make_tiny_tokenizer()
    manager = build_reward_manager(config(path=sys.argv[1], name=sys.argv[2]), tok)
    try:
        manager(make_batch(tok, ["a", "b"], ["1", "1"]))
    except Exception as exc:
        print(type(exc).__name__, exc)
        sys.exit(1)
    print("scored")
''')


@pytest.fixture(scope="module")
def tok():
    return make_tiny_tokenizer()


@pytest.fixture
def fns(tmp_path):
    path = tmp_path / "exiting_rewards.py"
    path.write_text(FUNCTIONS)
    return str(path)


def test_os_exit_in_an_in_process_reward_is_an_error_naming_the_function_and_row(fns):
    # in a child interpreter: before the guard, os._exit ended the process that scored (it would end pytest here)
    done = subprocess.run([sys.executable, "-c", SCORE_ONE_BATCH, fns, "os_exit"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO_ROOT})
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr[-2000:])
    assert (f"RewardFunctionError function 'os_exit' in {fns} failed on row 0 of the batch (data_source='arith', "
            f"index=0): the reward function called os._exit(3), which would have ended the trainer") in done.stdout


@pytest.mark.parametrize("name, said", [
    ("sys_exit_0", "the reward function called sys.exit(0)"),
    ("raises_system_exit", "the reward function called sys.exit(None)"),
    ("raises_keyboard_interrupt", "the reward function raised KeyboardInterrupt itself (no Ctrl-C arrived)"),
])
def test_exits_and_interrupts_raised_by_a_reward_are_errors_naming_function_and_row(tok, fns, name, said):
    real_exit = os._exit
    manager = build_reward_manager(config(path=fns, name=name), tok)
    with pytest.raises(RewardFunctionError) as info:
        manager(make_batch(tok, ["a", "b"], ["1", "1"]))
    assert f"function {name!r} in {fns} failed on row 0 of the batch" in str(info.value)
    assert said in str(info.value)
    tolerant = build_reward_manager(config(path=fns, name=name, tolerate_errors=True), tok)
    assert tolerant(make_batch(tok, ["a", "b"], ["1", "1"])).metrics["reward/errors"] == 2.0
    assert os._exit is real_exit  # put back once no reward code runs


def test_the_users_ctrl_c_during_a_reward_still_interrupts(tok, fns):
    manager = build_reward_manager(config(path=fns, name="user_presses_ctrl_c"), tok)
    with pytest.raises(KeyboardInterrupt):
        manager(make_batch(tok, ["a"], ["1"]))


def test_a_forked_child_and_other_threads_keep_the_real_os_exit(tok, fns):
    manager = build_reward_manager(config(path=fns, name="forks_a_child_that_exits"), tok)
    assert manager(make_batch(tok, ["a"], ["1"])).token_level_scores.sum() == 1.0
    other_thread = textwrap.dedent('''
        import os, threading
        from npu_rl.utils.exit_guard import guard_exits
        with guard_exits():
            worker = threading.Thread(target=os._exit, args=(9,))
            worker.start()
            worker.join()
        print("not reached")
    ''')
    done = subprocess.run([sys.executable, "-c", other_thread], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": REPO_ROOT})
    assert done.returncode == 9 and "not reached" not in done.stdout, (done.returncode, done.stderr)
