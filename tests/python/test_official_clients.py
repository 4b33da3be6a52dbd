"""The official JavaScript clients (tests/clients: the `openai` and `ollama` libraries from the
npm registry, pinned by their lockfile) against a warmpoold serving the demo model on a loopback TCP port. What
they must see is computed here through the framed protocol (the Python client): the same greedy
requests, token for token. scripts/test.sh installs the clients (npm ci); run alone, a missing
tests/clients/node_modules skips these tests unless WARMPOOL_REQUIRE_CLIENTS is set."""

import json
import os
import shutil
import socket
import subprocess

import pytest

import warmpool
from conftest import CONFIG, REPO, Daemon
from scripted_model import write_tool_calling_model

CLIENTS = os.path.join(REPO, "tests", "clients")
QUESTION = "What may I do with the program?"
ADMIN_TOKEN = "a-test-admin-token-of-some-length"
API_KEY = "a-test-api-key-of-some-length"
PROMPT = "This License"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    if not os.path.isdir(os.path.join(CLIENTS, "node_modules")):
        if os.environ.get("WARMPOOL_REQUIRE_CLIENTS"):
            pytest.fail("tests/clients/node_modules is missing: run npm ci --prefix tests/clients", pytrace=False)
        pytest.skip("the official clients are not installed (npm ci --prefix tests/clients)")
    port = _free_port()
    directory = str(tmp_path_factory.mktemp("clients"))
    token = os.path.join(directory, "admin-token")
    with open(os.open(token, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write(ADMIN_TOKEN + "\n")
    keys = os.path.join(directory, "api-keys")
    with open(os.open(keys, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write(API_KEY + "\n")
    d = Daemon(directory, config=CONFIG + f'[http]\nlisten = "127.0.0.1:{port}"\nadmin_token_file = "{token}"\n'
                                          f'api_keys_file = "{keys}"\n')
    shutil.copytree(os.path.join(REPO, "demo", "license-llama"), os.path.join(d.models_dir, "lm"))
    write_tool_calling_model(os.path.join(d.models_dir, "tools"))
    d.start()
    yield d, port
    d.check_stopped_cleanly()


def _expected(socket_path):
    with warmpool.Client(socket_path) as c:
        chat = c.generate("lm", messages=[{"role": "user", "content": QUESTION}], max_tokens=12, temperature=0,
                          stream=False)
        completion = c.generate("lm", PROMPT, max_tokens=10, temperature=0, stream=False)
        embedding = c.embed("lm", [PROMPT]).embeddings[0]
        shorter = c.embed("lm", [PROMPT], dimensions=8).embeddings[0]
    return {"question": QUESTION, "prompt": PROMPT, "chat": chat.text, "completion": completion.text,
            "embedding": list(embedding), "shorter": list(shorter)}


def test_the_official_openai_library_works_unchanged(served):
    d, port = served
    env = dict(os.environ, WARMPOOL_OPENAI_URL=f"http://127.0.0.1:{port}/v1", WARMPOOL_API_KEY=API_KEY,
               WARMPOOL_EXPECT=json.dumps(_expected(d.socket)))
    run = subprocess.run(["node", os.path.join(CLIENTS, "openai_client.mjs")], cwd=CLIENTS, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{d.log_tail()}"
    assert "openai client: ok" in run.stdout


def test_the_official_ollama_library_works_unchanged(served):
    d, port = served
    env = dict(os.environ, WARMPOOL_OLLAMA_HOST=f"http://127.0.0.1:{port}", WARMPOOL_ADMIN_TOKEN=ADMIN_TOKEN,
               WARMPOOL_API_KEY=API_KEY,
               WARMPOOL_EXPECT=json.dumps(_expected(d.socket)))
    run = subprocess.run(["node", os.path.join(CLIENTS, "ollama_client.mjs")], cwd=CLIENTS, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{d.log_tail()}"
    assert "ollama client: ok" in run.stdout
