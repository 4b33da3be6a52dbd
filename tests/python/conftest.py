"""Fixtures of the Python client's tests.

Run from the repository root, after building the C++ project:

    WARMPOOL_BUILD_DIR=build /usr/bin/python3 -m pytest tests/python -q

WARMPOOL_BUILD_DIR (default: build, relative to the repository root) holds bin/warmpoold,
bin/warmpool-worker and bin/warmpool-mkmodel. Before any test is collected, the package in
python/ is built (protoc generates warmpool_pb2.py) and installed into a temporary directory that
goes first on sys.path, so the tests import the package as pip installs it, never the source
tree.
"""

import atexit
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE_SOURCE = os.path.join(REPO, "python")
PROTO = os.path.join(REPO, "ipc", "warmpool.proto")


def _install_package():
    """Builds python/ (from a copy, leaving the checkout untouched) into a temporary target."""
    work = tempfile.mkdtemp(prefix="warmpool-pytest-pkg-")
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    source = os.path.join(work, "src")
    shutil.copytree(PACKAGE_SOURCE, source,
                    ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__",
                                                  "warmpool_pb2.py"))
    target = os.path.join(work, "site")
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-build-isolation",
               "--no-deps", "--no-index", "--target", target, source]
    result = subprocess.run(command, capture_output=True, text=True,
                            env=dict(os.environ, WARMPOOL_PROTO=PROTO, PIP_NO_INPUT="1"))
    if result.returncode != 0:
        raise RuntimeError(
            f"building the warmpool package failed ({' '.join(command)}):\n{result.stdout}"
            f"{result.stderr}\nIt needs protoc (apt-get install protobuf-compiler), "
            "python3-setuptools and python3-wheel."
        )
    sys.path.insert(0, target)


_install_package()

import numpy as np  # noqa: E402

import dense_reference  # noqa: E402
import warmpool  # noqa: E402

assert warmpool.__file__.startswith(tempfile.gettempdir()), warmpool.__file__


def build_dir():
    return os.path.join(REPO, os.environ.get("WARMPOOL_BUILD_DIR", "build"))


def binary(name):
    path = os.path.join(build_dir(), "bin", name)
    if not os.access(path, os.X_OK):
        pytest.fail(
            f"{path} is missing: build the project first (cmake -S . -B build -G Ninja && "
            "cmake --build build), or point WARMPOOL_BUILD_DIR at a build directory",
            pytrace=False,
        )
    return path


def make_model(path, layers, activation="relu", dtype="f32", seed=1):
    """A dense model file written by warmpool-mkmodel."""
    result = subprocess.run(
        [binary("warmpool-mkmodel"), path, "--layers", layers, "--activation", activation,
         "--dtype", dtype, "--seed", str(seed)],
        capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return path


# name -> (layers, activation, dtype, seed): dense models written into the models directory.
MODELS = {
    "tiny": ("16,32,8", "relu", "f32", 1),
    "wide": ("24,64,48,12", "gelu", "f16", 2),
    "narrow": ("20,40,6", "tanh", "bf16", 3),
    "expand": ("16,64", "none", "f32", 4),  # outputs 4x its input: larger than a region's slice
}

# Besides the models directory: an echo model (no file, any width).
CONFIG = """\
[daemon]
workers_per_device = 2
[pool]
park_budget = "64MiB"
[[models]]
name = "echo"
engine = "echo"
"""

_instances = itertools.count()


class Daemon:
    """A warmpoold of its own (socket, segment instance, models directory) in a temp dir."""

    def __init__(self, directory, args=(), config=CONFIG):
        self.dir = directory
        self.models_dir = os.path.join(directory, "models")
        os.makedirs(self.models_dir, exist_ok=True)
        self.socket = os.path.join(directory, "warmpool.sock")
        self.instance = f"pytest-{os.getpid()}-{next(_instances)}"
        self.config = os.path.join(directory, "config.toml")
        with open(self.config, "w") as f:
            f.write(config)
        self.model_paths = {}
        for name, (layers, activation, dtype, seed) in MODELS.items():
            self.model_paths[name] = make_model(
                os.path.join(self.models_dir, f"{name}.safetensors"), layers, activation, dtype, seed)
        self.log_path = os.path.join(directory, "daemon.log")
        self.args = list(args)
        self.process = None

    def start(self):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("NOTIFY_SOCKET", "LISTEN_", "WATCHDOG_", "WARMPOOL_SOCKET"))}
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [binary("warmpoold"), "--config", self.config, "--models-dir", self.models_dir,
                 "--socket", self.socket, "--instance", self.instance, *self.args],
                cwd=self.dir, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env)
        binary("warmpool-worker")  # the daemon runs the one beside itself
        self._wait_ready(timeout=15)

    def _wait_ready(self, timeout):
        """Until every worker is up and idle, through the one readiness check that scripts use too
        (`warmpool status --wait --workers-idle`, client/ready.h)."""
        wait = subprocess.run(
            [binary("warmpool"), "--socket", self.socket, "status", "--wait", f"{timeout}s", "--workers-idle"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if wait.returncode == 0:
            return
        if self.process.poll() is not None:
            pytest.fail(f"warmpoold exited with status {self.process.returncode}:\n"
                        f"{self.log_tail()}", pytrace=False)
        pytest.fail(f"warmpoold did not get ready in {timeout} s ({wait.stderr.strip()}):\n{self.log_tail()}",
                    pytrace=False)

    def stop(self):
        """SIGTERM and the exit status (the daemon validates its segment when it stops)."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return -signal.SIGKILL

    def log_tail(self, size=4000):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-size:]
        except FileNotFoundError:
            return "(no log)"

    def check_stopped_cleanly(self):
        status = self.stop()
        assert status == 0, f"warmpoold exited with status {status}:\n{self.log_tail()}"
        assert not os.path.exists(self.socket), "warmpoold left its socket behind"
        assert not os.path.exists(f"/dev/shm/warmpool.{self.instance}"), "segment left behind"


@pytest.fixture(scope="session")
def daemon(tmp_path_factory):
    """The tests' shared daemon: models tiny, wide, narrow (dense) and echo; fault injection on."""
    d = Daemon(str(tmp_path_factory.mktemp("daemon")), args=["--enable-fault-injection"])
    d.start()
    yield d
    d.check_stopped_cleanly()


@pytest.fixture
def start_daemon(tmp_path):
    """A factory for a daemon of a test's own (args: extra flags)."""
    started = []

    def start(args=()):
        d = Daemon(str(tmp_path / f"d{len(started)}"), args=args)
        d.start()
        started.append(d)
        return d

    yield start
    for d in started:
        d.check_stopped_cleanly()


@pytest.fixture
def client(daemon):
    with warmpool.Client(daemon.socket) as c:
        yield c


def random_input(rows, cols, seed):
    return np.random.default_rng(seed).uniform(-1, 1, size=(rows, cols)).astype(np.float32)


__all__ = ["Daemon", "binary", "dense_reference", "make_model", "random_input"]
