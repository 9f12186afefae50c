"""tests/processes.py: a forked process is a program of its own (its arguments, folder, environment, output, exit
code and signals), Prefect reads its own environment in it, and what the fork server cannot stand for starts
from nothing."""

import os
import signal
import subprocess
import sys
import textwrap

from tests import processes

SCRIPT = textwrap.dedent("""
    import os, sys
    preloaded = "torch" in sys.modules  # imported before this script ran: forked from the fork server
    if sys.argv[1].isdigit():  # Prefect's settings, read from this process's environment (a bare import: ~2 s)
        from prefect.settings import get_current_settings
        print(os.getcwd(), os.environ["WHO"], sys.argv[1:], preloaded, get_current_settings().home)
    print("to stderr", file=sys.stderr)
    if sys.argv[1] == "kill-group":
        os.killpg(os.getpgid(0), 9)
    if sys.argv[1] == "ctrl-c":
        raise KeyboardInterrupt
    if sys.argv[1] == "raise":
        raise ValueError("boom")
    if sys.argv[1] == "exit-text":
        sys.exit("bye")
    if sys.argv[1] == "exit-none":
        sys.exit()
    if sys.argv[1] == "draw":
        import random, numpy
        print(random.random(), numpy.random.rand(), file=sys.stderr)
        sys.exit()
    sys.exit(int(sys.argv[1]))
""")


def script(tmp_path) -> list[str]:
    (tmp_path / "program.py").write_text(SCRIPT)
    return [sys.executable, str(tmp_path / "program.py")]


def test_a_forked_program_has_its_own_arguments_folder_environment_output_and_exit_code(tmp_path):
    env = {**os.environ, "WHO": "first", "PREFECT_HOME": str(tmp_path / "home")}
    done = processes.run([*script(tmp_path), "3", "x"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 3
    assert done.stdout.split() == [str(tmp_path), "first", "['3',", "'x']", "True", str(tmp_path / "home")]
    assert done.stderr == "to stderr\n"
    other = processes.run([*script(tmp_path), "0"], cwd=tmp_path, env={**env, "WHO": "second"},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert other.returncode == 0 and other.stdout.split()[1] == "second" and "to stderr" in other.stdout
    code = processes.run([sys.executable, "-c", "import sys; print(sys.argv, __name__)", "a"], capture_output=True,
                         text=True)
    assert code.stdout == "['-c', 'a'] __main__\n"


def test_a_forked_program_ends_as_a_plain_one_would(tmp_path):
    env = {**os.environ, "WHO": "x"}
    endings = {"kill-group": (-signal.SIGKILL, "to stderr"), "ctrl-c": (-signal.SIGINT, "KeyboardInterrupt"),
               "raise": (1, "ValueError: boom"), "exit-text": (1, "bye"), "exit-none": (0, "to stderr")}
    for argv, (code, last_line) in endings.items():
        forked = processes.run([*script(tmp_path), argv], cwd=tmp_path, env=env, capture_output=True, text=True,
                               start_new_session=True)
        plain = subprocess.run([*script(tmp_path), argv], cwd=tmp_path, env=env, capture_output=True, text=True,
                               start_new_session=True)
        assert forked.returncode == plain.returncode == code, argv
        assert forked.stderr.splitlines()[-1] == plain.stderr.splitlines()[-1] == last_line, argv
    assert processes.run([*script(tmp_path), "0"], cwd=tmp_path, env=env).returncode == 0  # the server lives on
    draws = [processes.run([*script(tmp_path), "draw"], cwd=tmp_path, env=env, capture_output=True, text=True)
             .stderr.splitlines()[-1] for _ in range(2)]
    assert draws[0] != draws[1]  # random and numpy's generators seeded anew, not the fork server's state


def test_a_program_whose_import_time_environment_differs_starts_from_nothing(tmp_path):
    env = {**os.environ, "WHO": "x", "HF_HOME": str(tmp_path / "hf")}
    done = processes.run([*script(tmp_path), "0"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.split()[-2] == "False"
    started = processes.Popen(["true"])  # not Python: subprocess's own
    assert isinstance(started, subprocess.Popen) and started.wait() == 0
