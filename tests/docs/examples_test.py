#!/usr/bin/env python3
"""Runs every example of README.md and docs/*.md against the real binaries.

    examples_test.py SOURCE_DIR BUILD_DIR

An example is a fenced code block whose info string is `console` (docs/testing.md says so for
authors). In it, a line that starts with "$ " is a command; a command whose line ends with "\\"
goes on over the next line, and a command with a here-document (<<EOF, <<'EOF') takes the lines up
to its terminator. Every other line is sample output and is not checked. A block whose previous
non-blank line is `<!-- not run: REASON -->` is counted and reported, never run (systemd, sudo, a
GPU, minutes of runtime).

Each block runs on its own in a fresh `bash -e -o pipefail`, so every command must exit 0, from a
scratch copy of the repository root (python/, demo/ and ipc/warmpool.proto copied, build/ a link to
BUILD_DIR):

- README.md's blocks run with no context at all (no WARMPOOL_SOCKET, no daemon): the quick start
  must set up everything it uses.
- the blocks of docs/*.md run in the context the quick start leaves: $WP a directory holding
  models/tiny.safetensors (4 inputs, 8 hidden, 3 outputs) and models/license-llama (the shipped
  language model, demo/), WARMPOOL_SOCKET=$WP/warmpool.sock
  served by a warmpoold started with --models-dir $WP/models whose pid is $daemon, build/bin
  first on PATH, and
  python/warmpool/warmpool_pb2.py generated (so PYTHONPATH=python imports the client). Every file
  gets a fresh daemon and $WP; the daemon must stop with exit status 0 after the file's blocks.

Exit status 1 when an example fails, when a console block has no command, or when nothing ran.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(.*?)\s*-->$")
HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")
BLOCK_TIMEOUT_S = 90


class Block:
    def __init__(self, path, line, commands, skip_reason):
        self.path, self.line, self.commands, self.skip_reason = path, line, commands, skip_reason


def parse(path, rel):
    """The console blocks of one Markdown file."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    blocks, errors = [], []
    i = 0
    last_text = ""  # the previous non-blank line outside a block
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            if lines[i].strip():
                last_text = lines[i].strip()
            i += 1
            continue
        indent, info, start = len(m.group(1)), m.group(2), i + 1
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith("```"):
            body.append(lines[i][indent:] if not lines[i][:indent].strip() else lines[i])
            i += 1
        i += 1  # the closing fence
        if info == "console":
            skip = NOT_RUN.match(last_text)
            commands = extract_commands(body)
            if not commands:
                errors.append(f"{rel}:{start}: a console block with no '$ ' command")
            if skip and not skip.group(1):
                errors.append(f"{rel}:{start}: 'not run' needs a reason")
            blocks.append(Block(rel, start, commands, skip.group(1) if skip else None))
        last_text = ""
    return blocks, errors


def extract_commands(body):
    commands, j = [], 0
    while j < len(body):
        line = body[j]
        j += 1
        if not line.startswith("$ "):
            continue  # sample output
        command = line[2:]
        while command.endswith("\\") and j < len(body):
            command += "\n" + body[j]
            j += 1
        for m in HEREDOC.finditer(command):
            end = m.group(2)
            while j < len(body):
                command += "\n" + body[j]
                j += 1
                if body[j - 1].strip() == end:
                    break
        commands.append(command)
    return commands


def scratch_root(source, build, work):
    """A stand-in for the repository root that examples may write into."""
    root = os.path.join(work, "repo")
    os.makedirs(os.path.join(root, "ipc"))
    shutil.copytree(os.path.join(source, "python"), os.path.join(root, "python"),
                    ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__",
                                                  "warmpool_pb2.py"))
    shutil.copy(os.path.join(source, "ipc", "warmpool.proto"), os.path.join(root, "ipc"))
    shutil.copytree(os.path.join(source, "demo"), os.path.join(root, "demo"))
    os.symlink(build, os.path.join(root, "build"))
    return root


def base_env(work):
    env = {k: v for k, v in os.environ.items()
           if k not in ("WARMPOOL_SOCKET", "WP", "PYTHONPATH", "VENV", "daemon")}
    env["TMPDIR"] = os.path.join(work, "tmp")  # whatever examples mktemp stays in the scratch dir
    os.makedirs(env["TMPDIR"], exist_ok=True)
    return env


class Context:
    """The quick start's state for one docs page: a daemon serving $WP/models."""

    def __init__(self, root, env, name):
        self.env = dict(env)
        wp = tempfile.mkdtemp(prefix=f"ctx-{name}-", dir=env["TMPDIR"])
        bin_dir = os.path.join(root, "build", "bin")
        os.makedirs(os.path.join(wp, "models"))
        subprocess.run([os.path.join(bin_dir, "warmpool-mkmodel"),
                        os.path.join(wp, "models", "tiny.safetensors"), "--layers", "4,8,3"],
                       check=True, stdout=subprocess.DEVNULL)
        shutil.copytree(os.path.join(root, "demo", "license-llama"), os.path.join(wp, "models", "license-llama"))
        pb2 = os.path.join(root, "python", "warmpool", "warmpool_pb2.py")
        if not os.path.exists(pb2):
            subprocess.run(["protoc", "--python_out=python/warmpool", "-I", "ipc",
                            "ipc/warmpool.proto"], cwd=root, check=True)
        self.env.update(WP=wp, WARMPOOL_SOCKET=os.path.join(wp, "warmpool.sock"),
                        PATH=bin_dir + os.pathsep + env.get("PATH", ""))
        self.log_path = os.path.join(wp, "warmpoold.log")
        self.log = open(self.log_path, "w")
        self.daemon = subprocess.Popen(
            [os.path.join(bin_dir, "warmpoold"), "--socket", self.env["WARMPOOL_SOCKET"],
             "--models-dir", os.path.join(wp, "models"), "--instance", f"docs{os.getpid()}"],
            stdout=self.log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        self.env["daemon"] = str(self.daemon.pid)
        # The one readiness check every script uses (README.md's quick start among them).
        if subprocess.run([os.path.join(bin_dir, "warmpool"), "status", "--wait", "10s"], env=self.env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode != 0:
            raise RuntimeError("the context's warmpoold did not come up:\n" + self.tail())

    def tail(self):
        self.log.flush()
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-20:])

    def stop(self):
        """The daemon's exit status: 0 unless it found a broken invariant."""
        self.daemon.send_signal(signal.SIGTERM)
        try:
            rc = self.daemon.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.daemon.kill()
            rc = self.daemon.wait()
        self.log.close()
        return rc


def run_block(block, root, env):
    """Runs one block; returns (ok, output)."""
    script = "\n".join(block.commands) + "\n"
    # Output to a file, not a pipe: a process the block left running must not hold the test up.
    with tempfile.TemporaryFile(mode="w+", errors="replace") as log:
        proc = subprocess.Popen(["bash", "-e", "-o", "pipefail", "-v", "-c", script], cwd=root,
                                env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            proc.wait(timeout=BLOCK_TIMEOUT_S)
            ok = proc.returncode == 0
        except subprocess.TimeoutExpired:
            ok = False
        log.seek(0)
        out = log.read()
        if not ok and proc.returncode is None:
            out += f"(timed out after {BLOCK_TIMEOUT_S} s)\n"
    # Whatever the block left running (a daemon it started and did not stop) goes with it.
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    return ok, out


PIPE_INTO_HEAD = re.compile(r"\|\s*head\b")


def main():
    source = os.path.abspath(sys.argv[1])
    build = os.path.abspath(sys.argv[2])
    files = ["README.md"] + sorted(os.path.join("docs", f)
                                   for f in os.listdir(os.path.join(source, "docs"))
                                   if f.endswith(".md"))
    work = tempfile.mkdtemp(prefix="warmpool-docs-examples-")
    failures, skipped, ran, commands = [], [], 0, 0
    try:
        root = scratch_root(source, build, work)
        env = base_env(work)
        for rel in files:
            blocks, errors = parse(os.path.join(source, rel), rel)
            failures += errors
            skipped += [b for b in blocks if b.skip_reason]
            runnable = [b for b in blocks if not b.skip_reason and b.commands]
            # head may exit before the writer has written all: under pipefail the writer's
            # SIGPIPE fails the example by timing (curl: "Failed writing body"). cut reads all.
            for b in runnable:
                if any(PIPE_INTO_HEAD.search(c) for c in b.commands):
                    failures.append(f"{b.path}:{b.line}")
                    print(f"FAIL {b.path}:{b.line}: a command pipes into head, which may stop reading "
                          "before the writer ends (pipefail then fails it by timing): use cut -c or sed -n")
            if not runnable:
                continue
            context = None if rel == "README.md" else Context(root, env, os.path.basename(rel)[:-3])
            for block in runnable:
                started = time.monotonic()
                ok, out = run_block(block, root, context.env if context else env)
                took = time.monotonic() - started
                if ok:
                    ran += 1
                    commands += len(block.commands)
                    print(f"ok   {block.path}:{block.line} ({len(block.commands)} commands, "
                          f"{took:.1f} s)")
                else:
                    failures.append(f"{block.path}:{block.line}")
                    print(f"FAIL {block.path}:{block.line}: an example exited non-zero. "
                          "The block's lines as bash read them, and their output:")
                    print(out.rstrip())
                    if context:
                        print("--- the context's warmpoold log:\n" + context.tail())
            if context:
                rc = context.stop()
                if rc != 0:
                    failures.append(f"{rel}: the context's warmpoold exited {rc}")
                    print(f"FAIL {rel}: the context's warmpoold exited {rc}:\n{context.tail()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for b in skipped:
        print(f"not run {b.path}:{b.line}: {b.skip_reason}")
    print(f"{ran} example blocks run ({commands} commands), {len(skipped)} not run, "
          f"{len(failures)} failed")
    for f in failures:
        print(f"FAIL: {f}")
    if failures or ran == 0:
        sys.exit(1)


if __name__ == "__main__":
    main()
