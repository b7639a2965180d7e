"""A forked worker does not run the parent's signal handlers: a SIGTERM that arrived while the parent
held signals for the fork kills the worker quietly instead of raising inside multiprocessing's bootstrap."""
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import os, signal, sys
    from kcache_cli.util import parallel

    def raising(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, raising)  # as export installs it in the parent
    with parallel.signals_held():
        os.kill(os.getpid(), signal.SIGTERM)  # pending, as when the parent is told to stop mid-fork
        signal.signal(signal.SIGTERM, raising)
        parallel.die_with_parent(None)  # a worker's first step: the pending signal lands here
        print("survived", flush=True)
""")


def test_a_pending_sigterm_kills_a_worker_without_a_traceback():
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -15, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert "survived" not in proc.stdout


def test_the_old_order_would_have_raised():
    """The same child with the handler left in place: the check above can fail."""
    body = CHILD.replace("parallel.die_with_parent(None)",
                         "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})")
    proc = subprocess.run([sys.executable, "-c", body], capture_output=True, text=True, timeout=60)
    assert "KeyboardInterrupt: signal 15" in proc.stderr
