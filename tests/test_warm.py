"""tests/helpers/warm.py: a process started warm is what the same command started cold is, as
far as a test of ``main.py`` can see (arguments, directory, environment, standard streams and
their buffering, exit status, signals, sessions), and a command whose start-up could differ
starts cold."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import warm

PROBE = textwrap.dedent('''
    import json, os, sys
    if sys.argv[1] == "report":
        print(json.dumps({
            "name": __name__, "argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0],
            "value": os.environ.get("WARM_PROBE"), "stdin": sys.stdin.read(),
            "line_buffered": sys.stdout.line_buffering, "write_through": sys.stdout.write_through,
            "stderr_line_buffered": sys.stderr.line_buffering,
            "session_leader": os.getsid(0) == os.getpid(),
            "tmp": __import__("tempfile").gettempdir()}))
        print("to stderr", file=sys.stderr)
    elif sys.argv[1] == "exit":
        sys.exit(int(sys.argv[2]))
    elif sys.argv[1] == "message":
        sys.exit("a message")
    elif sys.argv[1] == "raise":
        raise ValueError("raised")
    elif sys.argv[1] == "interrupt":
        raise KeyboardInterrupt
    elif sys.argv[1] == "atexit":
        import atexit, threading, time
        atexit.register(lambda: print("atexit ran", flush=True))
        threading.Thread(target=lambda: (time.sleep(0.3), print("thread done", flush=True))).start()
    elif sys.argv[1] == "sleep":
        print("sleeping", flush=True)
        import time; time.sleep(60)
''')

pytestmark = pytest.mark.skipif(warm._disabled, reason="warm starts are off here "
                                "(IMAGENET_TESTS_COLD=1 or a GPU machine)")


@pytest.fixture
def probe(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text(PROBE)
    return str(path)


def both(args, **kwargs):
    """The same command cold (subprocess.run) and warm (warm.Popen)."""
    cold = subprocess.run(args, capture_output=True, text=True, timeout=60, **kwargs)
    warm_run = warm.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          stdin=subprocess.PIPE if "input" in kwargs else None,
                          **{k: v for k, v in kwargs.items() if k != "input"})
    assert warm_run.warm
    out, err = warm_run.communicate(kwargs.get("input"), timeout=60)
    return cold, subprocess.CompletedProcess(args, warm_run.returncode, out, err)


@pytest.mark.parametrize("unbuffered", ["", "1"])
def test_a_warm_process_sees_what_a_cold_one_sees(probe, tmp_path, unbuffered):
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"},
           "WARM_PROBE": "value", "TMPDIR": str(tmp_path),
           **({"PYTHONUNBUFFERED": "1"} if unbuffered else {})}
    cold, hot = both([sys.executable, probe, "report", "x y"], cwd=str(tmp_path), env=env,
                     input="from\r\nstdin")
    assert hot.returncode == cold.returncode == 0, (cold.stderr, hot.stderr)
    assert json.loads(hot.stdout) == json.loads(cold.stdout)
    report = json.loads(hot.stdout)
    assert report["name"] == "__main__" and report["argv"][1:] == ["report", "x y"]
    assert report["value"] == "value" and report["stdin"] == "from\r\nstdin"
    assert report["tmp"] == str(tmp_path)
    assert (report["line_buffered"], report["stderr_line_buffered"],
            report["write_through"]) == ((False, False, True) if unbuffered else (False, True, False))
    assert hot.stderr == cold.stderr == "to stderr\n"


@pytest.mark.parametrize("how, code, stderr", [
    (["exit", "3"], 3, ""), (["exit", "0"], 0, ""), (["exit", "-2"], 254, ""),
    (["message"], 1, "a message\n"), (["raise"], 1, "ValueError: raised\n"),
    (["interrupt"], -signal.SIGINT, "KeyboardInterrupt\n"), (["atexit"], 0, "")])
def test_exit_status_and_output_at_exit_are_a_cold_process_s(probe, how, code, stderr):
    cold, hot = both([sys.executable, probe, *how])
    assert hot.returncode == cold.returncode == code
    assert hot.stdout == cold.stdout and hot.stderr.endswith(stderr) and cold.stderr.endswith(stderr)
    if how == ["atexit"]:  # non-daemon threads are joined before atexit, as at interpreter exit
        assert hot.stdout == "thread done\natexit ran\n"


def test_signals_sessions_and_unbuffered_output(probe):
    proc = warm.Popen([sys.executable, probe, "sleep"], stdout=subprocess.PIPE, text=True,
                      start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.warm and os.getpgid(proc.pid) == proc.pid  # the session exists on return
    assert proc.stdout.readline() == "sleeping\n"
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL
    proc.stdout.close()


def test_a_missing_directory_raises_as_popen_does(probe, tmp_path):
    with pytest.raises(FileNotFoundError):
        warm.Popen([sys.executable, probe, "report"], cwd=str(tmp_path / "missing"))


@pytest.mark.parametrize("change", [{"PYTHONPATH": "/nowhere"}, {"OMP_NUM_THREADS": "7"},
                                    {"IMAGENET_FAST_FULL_DECODE": "1"}])
def test_a_start_up_variable_that_differs_starts_cold(probe, change):
    proc = warm.Popen([sys.executable, probe, "exit", "0"], env={**os.environ, **change})
    assert not proc.warm and proc.wait(60) == 0


def test_code_and_other_programs_start_cold():
    for args in ([sys.executable, "-c", "pass"], ["true"]):
        proc = warm.Popen(args)
        assert not proc.warm and proc.wait(60) == 0


@pytest.mark.slow
def test_main_py_says_the_same_warm_and_cold():
    for args in (["--help"], ["--epochs", "x"]):
        cold, hot = both([sys.executable, "main.py", *args], cwd=warm.REPO)
        assert (hot.returncode, hot.stdout, hot.stderr) == (cold.returncode, cold.stdout,
                                                            cold.stderr)


def test_a_run_past_its_timeout_is_killed_with_its_children(probe, tmp_path):
    """A grandchild holding the output pipe does not keep ``warm.run`` waiting (a training
    process that outlives its killed launcher)."""
    script = tmp_path / "parent.py"
    script.write_text("import subprocess, sys, time\n"
                      f"subprocess.Popen([sys.executable, {probe!r}, 'sleep'])\n"
                      "time.sleep(60)\n")
    with pytest.raises(subprocess.TimeoutExpired):
        warm.run([sys.executable, str(script)], capture_output=True, text=True, timeout=5)
