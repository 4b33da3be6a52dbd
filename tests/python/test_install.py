"""The package installs with pip into a fresh virtual environment, offline, and the README's
three lines work against a running daemon."""

import json
import os
import subprocess
import sys

import numpy as np

from conftest import REPO, dense_reference

# The README's example, verbatim.
README_LINES = ('import warmpool, numpy as np; c = warmpool.Client(); '
                'print(c.infer("tiny", np.ones((2, 16), np.float32)))')


def test_pip_install_into_a_venv_then_use(daemon, tmp_path):
    venv = tmp_path / "venv"
    # Debian's python3 (numpy, protobuf) with its packages visible; pip refuses system installs.
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, capture_output=True)
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_FIND_LINKS")}
    env["PIP_NO_INPUT"] = "1"
    install = subprocess.run(
        [python, "-m", "pip", "install", "--no-index", "./python"],
        cwd=REPO, capture_output=True, text=True, env=env)
    assert install.returncode == 0, install.stdout + install.stderr

    env["WARMPOOL_SOCKET"] = daemon.socket
    script = README_LINES + (
        "\nimport json; print('JSON', json.dumps(c.infer('tiny', np.ones((2, 16))).tolist()))"
        "\nprint('FROM', warmpool.__file__)")
    used = subprocess.run([python, "-c", script], cwd=str(tmp_path), capture_output=True,
                          text=True, env=env, timeout=60)
    assert used.returncode == 0, used.stderr
    lines = used.stdout.splitlines()
    assert lines[0].startswith("[[") and "]]" in used.stdout  # numpy's print of a 2 x 8 array
    assert lines[-1].startswith(f"FROM {venv}")  # the installed package, not the source tree
    output = np.array(json.loads(next(l for l in lines if l.startswith("JSON "))[5:]), np.float32)
    dense_reference.assert_matches(daemon.model_paths["tiny"], np.ones((2, 16)), output)
    # And the generated protocol module is part of the installed package.
    assert (venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
            / "warmpool" / "warmpool_pb2.py").is_file()
