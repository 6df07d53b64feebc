"""summrl.serve as a user runs it: a subprocess serving a copy of the shared trained run (tiny model) on loopback,
reached with the real ``openai`` client and plain HTTP; best-of-N ranked by the loopback judge; and the whole online
loop (serve with recording, train on the inbox, the server reloads the new step, the watermark advances, a second
train finds nothing new)."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import re
import os
import shutil
import socket
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import httpx
import openai
import pytest

from summrl.prompt import word_count
from summrl.serve.process import ServeProcess
from summrl.testing import FakeLLM, Reply
from tests.conftest import ROOT, run_cli

SERVE_KEY = "planted-serve-key-4f1a"


@pytest.fixture(scope="module")
def run_copy(shared_run, tmp_path_factory) -> Path:
    """The shared run (steps 1-3, tiny model), copied: serving and online training write into it."""
    target = tmp_path_factory.mktemp("served") / "run"
    shutil.copytree(shared_run.run_dir, target)
    return target


def summarize(url: str, document: str, key: str | None = SERVE_KEY, **extra) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{url}/v1/summarize", json={"document": document, **extra}, headers=headers, timeout=120)


def in_front_of(fake: FakeLLM, monkeypatch, extra_body: Optional[dict] = None) -> None:
    """summrl.serve's app with the loopback fake as its backend's endpoint, and a word-splitting tokenizer."""
    import summrl.backends.serving as serving
    import summrl.serve.app as app

    class Endpoint:  # what start_server returns (a CheckpointServer)
        base_url, api_key = fake.base_url, "none"

        async def serve(self, step: int) -> str:
            return "fake-policy"

    Endpoint.extra_body = extra_body  # LocalGPUServer's: the model's chat_template_kwargs

    async def start_server(train, run, early=False):
        return Endpoint()

    monkeypatch.setattr(serving, "start_server", start_server)
    monkeypatch.setattr(app, "load_tokenizer", lambda model, fix: lambda text, **kw: {"input_ids": text.split()})


def test_best_of_n_returns_the_summary_the_judge_ranks_first_and_bad_requests_get_clear_errors(run_copy, tmp_path):
    with FakeLLM() as judge:
        served = ServeProcess(run_copy, ["step=2", "serve.best_of_n=4", "serve.max_document_tokens=8192", "serve.max_queue=2",
                                   "judge=openai_compatible", f"judge.api_base={judge.base_url}", "judge.max_retries=0",
                                   "judge.cache_dir=null"], tmp_path / "serve.log")
        try:
            document = "The Orchard Street library reopened on May 3, 2025 after a 52,000 dollar repair."
            reply = summarize(served.url, document, key=None).json()
            assert (reply["best_of_n"], reply["selector"], reply["step"], reply["fallback"]) == (4, "ruler", 2, None)
            ranked = re.findall(r'<trajectory id="(\d+)">\n(.*?)\n</trajectory>', judge.requests[-1]["messages"][-1]["content"],
                                re.S)
            assert len(ranked) == 4  # the judge saw the four samples; the fake ranks them by length
            best = max(ranked, key=lambda t: len(t[1]))[1]  # ties: the first, as max keeps it
            assert reply["summary"] == json.loads(best)[-1]["content"]
            assert reply["rank_score"] == pytest.approx(min(1.0, len(best) / 1000), abs=1e-6)
            judge.script.append(Reply(status=500))  # the judge fails: the first sample, and why; never a 500
            failed = summarize(served.url, document, key=None)
            assert failed.status_code == 200 and failed.json()["fallback"].startswith("the judge failed")
            assert failed.json()["chosen"] == 0 and failed.json()["rank_score"] is None

            bad = httpx.post(f"{served.url}/v1/summarize", content=b"{not json", timeout=30,
                             headers={"content-type": "application/json"})
            assert bad.status_code == 400 and "bad request" in bad.json()["error"]["message"]
            missing = httpx.post(f"{served.url}/v1/summarize", json={"text": "x"}, timeout=30)
            assert missing.status_code == 400 and "document" in missing.json()["error"]["message"]
            empty = httpx.post(f"{served.url}/v1/summarize", json={"document": "  "}, timeout=30)
            assert empty.status_code == 400 and empty.json()["error"]["message"].startswith("document: empty")
            # zero-width and NUL characters were summarized and recorded to the inbox as a document
            invisible = httpx.post(f"{served.url}/v1/summarize", json={"document": "\u00a0\u200b\ufeff\u0000"},
                                   timeout=30)
            assert invisible.status_code == 400 and invisible.json()["error"]["message"].startswith("document: empty")
            for seed in ("12", 1.0):  # read as 12 and 1: the client's mistake is said
                typed = httpx.post(f"{served.url}/v1/summarize", json={"document": document, "seed": seed}, timeout=30)
                assert typed.status_code == 400 and "seed: Input should be a valid integer" in typed.text, typed.text
            # every error in OpenAI's shape, whichever check refused it
            assert [(r.json()["error"]["type"], r.json()["error"]["code"]) for r in (bad, missing, empty)] == [
                ("invalid_request_error", 400)] * 3
            # what `curl -d '{"document": ...}'` sends, as the README shows it: JSON under a form Content-Type
            as_curl = httpx.post(f"{served.url}/v1/summarize", content=json.dumps({"document": document}).encode(),
                                 headers={"content-type": "application/x-www-form-urlencoded"}, timeout=120)
            assert as_curl.status_code == 200 and as_curl.json()["summary"], as_curl.text
            long = summarize(served.url, " ".join(["word"] * 9000), key=None)
            assert long.status_code == 413 and "serve.max_document_tokens=8192" in long.json()["error"]["message"]
            # within the limit, but not within SmolLM2's 8192 positions once the instructions and the summary's
            # tokens are added: refused here, before the embedded server refuses it (a 500, and a burst held 10 s)
            longer_than_context = summarize(served.url, " ".join(["word"] * 8150), key=None)
            assert longer_than_context.status_code == 413, longer_than_context.text
            assert re.match(r"document: 8150 tokens; with the instructions \(\d+ in all\) and trainer\.max_summary_"
                            r"tokens=\d+ it needs more than the model's context of 8192 tokens; split it",
                            longer_than_context.json()["error"]["message"])

            async def burst() -> list[httpx.Response]:
                async with httpx.AsyncClient(timeout=120) as client:
                    return await asyncio.gather(*(client.post(f"{served.url}/v1/summarize", json={"document": document})
                                                  for _ in range(6)))

            statuses = [r.status_code for r in asyncio.run(burst())]
            assert 429 in statuses and 200 in statuses  # serve.max_queue=2: the rest are told to come back
            limited = next(r for r in asyncio.run(burst()) if r.status_code == 429)
            # whole seconds, from how long the requests before it took (test_requests_waiting_behind_a_reload_...)
            assert int(limited.headers["retry-after"]) >= 1 and "serve.max_queue=2" in limited.json()["error"]["message"]
            assert (limited.json()["error"]["type"], limited.json()["error"]["code"]) == ("rate_limit_error", 429)
            assert httpx.get(f"{served.url}/health").json()["step"] == 2  # still serving

            async def beside_a_bad_seed() -> list[httpx.Response]:  # both in one burst, were the bad one let through
                async with httpx.AsyncClient(timeout=120) as client:
                    return await asyncio.gather(*(client.post(f"{served.url}/v1/summarize", json={"document": document,
                                                                                                   "seed": seed})
                                                  for seed in (2**64, 7)))

            bad_seed, good = asyncio.run(beside_a_bad_seed())
            assert bad_seed.status_code == 400 and "seed: Input should be less than or equal to" in bad_seed.text
            assert good.status_code == 200 and good.json()["summary"], good.text

            # a client gone before its samples are ranked (a timeout, a cancelled job): the judge is not paid for it
            body = json.dumps({"document": document}).encode()
            gone_line = r"the client disconnected before its (summaries were generated|4 samples were ranked)"
            for attempt in range(5):  # a request takes about 0.4 s: a test paused past it closes too late, and retries
                asked, seen = len(judge.requests), len(re.findall(gone_line, served.log.read_text()))
                deadline = time.monotonic() + 120
                with socket.create_connection(("127.0.0.1", served.port)) as gone:
                    gone.sendall(b"POST /v1/summarize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                    # closed once read: closed before, uvicorn drops the unread body and the request never starts
                    while httpx.get(f"{served.url}/health").json()["in_flight"] == 0:
                        assert time.monotonic() < deadline, served.log.read_text()[-2000:]
                        time.sleep(0.05)
                # seen while its samples were generated, they stop there; seen after, they are not ranked
                while len(re.findall(gone_line, served.log.read_text())) == seen and not (
                        len(judge.requests) > asked and httpx.get(f"{served.url}/health").json()["in_flight"] == 0):
                    assert time.monotonic() < deadline, served.log.read_text()[-2000:]
                    time.sleep(0.2)
                if len(re.findall(gone_line, served.log.read_text())) > seen:
                    break
            else:
                pytest.fail("every request was ranked before its client's close was seen")
            time.sleep(0.5)  # (a judge call would be on its way by now)
            assert len(judge.requests) == asked
            assert summarize(served.url, document, key=None).json()["fallback"] is None  # the next one is ranked
            assert len(judge.requests) == asked + 1
        finally:
            served.stop()


def test_plus_settings_change_the_runs_own_backend_and_judge_and_are_checked_as_training_checks_them(shared_run,
                                                                                                      monkeypatch):
    """The serve config has no backend or judge until the run's is read: ``+backend.<key>`` changes one setting of
    the run's own; without the ``+`` Hydra can't override it, and the line says to add it."""
    from summrl.checkpoints import run_config, trained_run
    from summrl.config import compose
    from summrl.errors import ConfigError
    from summrl.serve.config import validate_serve

    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    run = f"run_dir={shared_run.run_dir}"
    saved = run_config(trained_run(str(shared_run.run_dir), "run_dir"))
    config = validate_serve(compose("serve", [run, "+backend.batch_window_ms=300", "+judge.max_retries=0"]))
    assert config.train.backend == dataclasses.replace(saved.backend, batch_window_ms=300.0)
    assert config.train.judge == dataclasses.replace(saved.judge, max_retries=0)
    for override, message in [("+backend.device=gpu", "backend.device: must be auto, cpu, cuda, cuda:N or mps"),
                              ("+backend.max_batch_siz=8", "Did you mean backend.max_batch_size?"),
                              ("+backend.kind=local_gpu", "choose it with backend=<option>"),
                              # it said it would follow the run, and served step 1 for ever
                              ("serve.reload=auto step=2", "serve.reload=auto follows the run's new checkpoints, but "
                                                           "step=2 is fixed"),
                              # each request sampled 4 summaries, then fell back to the first for want of the key
                              ("serve.best_of_n=4 serve.selector=ruler judge=gemini_flash",
                               "serve.selector=ruler ranks the samples with the judge (gemini/gemini-2.5-flash), whose "
                               "key GEMINI_API_KEY is not set"),
                              # one greedy summary 4 times, ranked by the judge
                              ("serve.shutdown_grace_s=-1", "serve.shutdown_grace_s: must be >= 0, got -1"),
                              ("serve.best_of_n=4 serve.temperature=0",
                               "serve.temperature: is 0 (greedy), so serve.best_of_n=4 would sample one summary 4 times"),
                              # it said the run had been trained with it, and then a torch traceback for a device
                              ("backend=skypilot", "backend: backend=skypilot can't serve a checkpoint; serve it"),
                              ("+backend.device=cuda:7", "backend.device=cuda:7: torch sees "),
                              ("backend=local_gpu judge=local serve.best_of_n=2 serve.selector=ruler",
                               "judge=local uses the embedded model: serve with backend=embedded")]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            validate_serve(compose("serve", [run, *override.split()]))
    # with no judge to ask (one sample, or the length selector), the run's judge=local was refused on vLLM all the same
    for override in ("backend=local_gpu judge=local", "backend=local_gpu judge=local serve.best_of_n=2 "
                     "serve.selector=length"):
        assert validate_serve(compose("serve", [run, *override.split()])).train.backend.kind == "local_gpu"
    result = subprocess.run([sys.executable, "-m", "summrl.serve", run, "backend.device=cpu"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines()[0] == ("summrl: config error: backend.device is not in the config (backend is "
                                             "empty here), so it can't be overridden: add it with +backend.device=cpu")


def test_a_port_in_use_or_a_host_not_this_machines_is_refused_before_the_model_loads(shared_run):
    """uvicorn binds after the model starts loading and exits 1 with its own line; the server binds first."""
    import socket

    def serve(*overrides: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "summrl.serve", f"run_dir={shared_run.run_dir}", *overrides],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        in_use = serve(f"serve.port={port}")
    assert in_use.returncode == 2, in_use.stderr
    assert in_use.stderr.splitlines()[-1] == (f"summrl: config error: serve.port={port}: 127.0.0.1:{port} is in use "
                                              "(another server is listening there): stop it, or choose another "
                                              "serve.port")
    foreign = serve("serve.host=192.0.2.1")  # TEST-NET-1: no machine's own address
    assert foreign.returncode == 2, foreign.stderr
    assert foreign.stderr.splitlines()[-1].startswith("summrl: config error: serve.host=192.0.2.1: can't listen there")


def test_a_client_that_connects_while_the_server_starts_waits_for_it_rather_than_being_refused():
    """The socket listens once it is bound, before the model's libraries import (about 6 s): a health check sent then
    is queued for the server, where it was refused."""
    import socket

    from summrl.serve.__main__ import listening_socket

    with listening_socket("127.0.0.1", 0) as sock, \
            socket.create_connection(sock.getsockname(), timeout=5) as client:
        client.sendall(b"GET /health HTTP/1.1\r\nHost: summrl\r\n\r\n")
        accepted, _ = sock.accept()  # what uvicorn does once it runs
        with accepted:
            assert accepted.recv(64).startswith(b"GET /health HTTP/1.1")


def test_sigterm_while_the_server_starts_ends_it_with_one_line(run_copy):
    """SIGTERM (a supervisor stopping it) once the socket listens, while the model's libraries import and it loads:
    one line naming the signal and exit 0, as once it serves. Python's default ended it at once (-15), Ctrl-C there
    printed a cancelled lifespan's traceback, and then it said 'interrupted' with 143 (130 for Ctrl-C) while the
    README says exit 0."""
    import signal
    import socket
    import time

    from summrl.backends.embedded.server import free_port

    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "summrl.serve", f"run_dir={run_copy}", f"serve.port={port}"],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:  # listening: the config is checked and the handlers are in place, the model not yet loaded
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline, process.communicate()[1][-3000:]
                time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, err[-3000:]
    assert (out + err).strip() == "summrl: the server stopped (SIGTERM)"


def test_a_request_whose_client_gives_up_stops_generating_and_the_next_is_served(run_copy, tmp_path):
    """A client that times out on a chat of 16 choices: its rows stop at the next decode step (through summrl.serve's
    handler, its OpenAI client's connection, the embedded server's handler and its batcher), where they ran to
    max_tokens for no one and every request behind them waited (36 s for 16 x 400 tokens of SmolLM2)."""
    import re

    served = ServeProcess(run_copy, ["step=latest", "serve.shutdown_grace_s=1"], tmp_path / "serve.log")
    try:
        model = httpx.get(f"{served.url}/v1/models", timeout=10).json()["data"][0]["id"]
        chat = {"model": model, "messages": [{"role": "user", "content": "Write a long story."}]}
        with pytest.raises(httpx.TimeoutException):  # the tiny model's 16 x 3000 tokens: most of a minute
            httpx.post(f"{served.url}/v1/chat/completions", json={**chat, "n": 16, "max_tokens": 3000}, timeout=2)
        after = httpx.post(f"{served.url}/v1/chat/completions", json={**chat, "max_tokens": 3}, timeout=120)
        assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 3
        # stopped while generated, or (a slow machine) dropped before its call started; a row that reached its end
        # of text before the client left is not abandoned (15 of 16, under load)
        stopped = re.findall(r"summrl: (\d+) of 16 rows were abandoned \(their clients disconnected\) and generated "
                             r"no further: the call ran (\d+) of 3000 tokens", served.log.read_text())
        dropped = "summrl: 16 rows were abandoned (their clients disconnected) before they were generated"
        assert (len(stopped) == 1 and int(stopped[0][0]) >= 1 and int(stopped[0][1]) < 3000
                ) or dropped in served.log.read_text(), served.log.read_text()
        # a streamed chat its client closes (a chat UI's stop button) once text has come: it is generating, so stopped
        with httpx.stream("POST", f"{served.url}/v1/chat/completions", timeout=120,
                          json={**chat, "n": 8, "max_tokens": 3000, "stream": True}) as stream:
            pieces = (line for line in stream.iter_lines() if '"content":' in line and '"content": ""' not in line)
            next(pieces), next(pieces)
        deadline = time.monotonic() + 60
        while not (ran := re.findall(r"summrl: [1-8] of 8 rows were abandoned \(their clients disconnected\) and "
                                     r"generated no further: the call ran (\d+) of 3000 tokens", served.log.read_text())):
            assert time.monotonic() < deadline, served.log.read_text()[-2000:]
            time.sleep(0.2)
        assert int(ran[0]) < 3000
        after = httpx.post(f"{served.url}/v1/chat/completions", json={**chat, "max_tokens": 3}, timeout=120)
        assert after.status_code == 200  # and its place in flight was given back
        # Ctrl-C while a stream is open: it gets serve.shutdown_grace_s to end, then is cut, and the server stops (it
        # waited for the stream's 8 x 3000 tokens, over 2 minutes, with no word); a request not streamed gets a 503
        import concurrent.futures

        waiting = concurrent.futures.ThreadPoolExecutor(1).submit(
            httpx.post, f"{served.url}/v1/chat/completions", json={**chat, "max_tokens": 3000}, timeout=120)
        with httpx.stream("POST", f"{served.url}/v1/chat/completions", timeout=120,
                          json={**chat, "n": 8, "max_tokens": 3000, "stream": True}) as stream:
            lines = stream.iter_lines()
            while '"content":' not in next(lines):
                pass
            served.process.send_signal(signal.SIGINT)
            stopping = time.monotonic()
            with pytest.raises(httpx.RemoteProtocolError):  # cut: no [DONE]
                for _ in lines:
                    pass
        served.process.wait(timeout=60)
        assert time.monotonic() - stopping < 20 and served.process.returncode == 0
        cut = waiting.result(timeout=60)
        assert cut.status_code == 503 and cut.json()["error"]["message"].startswith("the server is stopping: ")
        assert ("summrl: POST /v1/chat/completions was cut: still in flight serve.shutdown_grace_s=1 s after the "
                "server was told to stop") in served.log.read_text()
    finally:
        served.stop()
    assert "Traceback" not in served.log.read_text() and "never retrieved" not in served.log.read_text()
    assert served.log.read_text().rstrip().endswith("summrl: the server stopped (SIGINT)")


def test_perf_serve_refuses_what_the_server_would_before_starting_one(tmp_path):
    result = subprocess.run([sys.executable, "-m", "summrl.perf", "serve", "--run-dir", str(tmp_path / "nowhere")],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == (f"summrl: config error: run_dir: {tmp_path / 'nowhere'} is not a folder (a "
                                     "training run folder, e.g. runs/<run.name>)")
    # a relative --run-dir is the user's, from where they typed it (the server runs in the project's folder: a folder
    # checked here was another there, found by an audit)
    relative = subprocess.run([sys.executable, "-m", "summrl.perf", "serve", "--run-dir", "runs/nowhere"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert relative.returncode == 2 and f"run_dir: {tmp_path / 'runs' / 'nowhere'} is not a folder" in relative.stderr
    # a count of 0 is a usage error before anything loads (it was a traceback after minutes of measuring)
    for args in (["step", "--steps", "0"], ["serve", "--run-dir", ".", "--concurrency", "0"],
                 ["first-sample", "--processes", "-1"], ["judge", "--documents", "x"]):
        zero = subprocess.run([sys.executable, "-m", "summrl.perf", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
        assert zero.returncode == 2 and "must be a whole number of at least 1" in zero.stderr, (args, zero.stderr)


def test_an_inbox_run_with_no_checkpoint_and_no_inbox_is_refused_naming_run_name(tmp_path):
    """A mistyped run.name: nothing was trained or recorded under it, so there is nothing to continue or wait for."""
    result = run_cli(["experiment=local", "run.name=local1x", "dataset=inbox", f"hydra.run.dir={tmp_path / 'local1x'}"],
                     cwd=ROOT, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"summrl: config error: dataset=inbox: run.name=local1x has no checkpoint and no inbox "
        f"({tmp_path / 'local1x' / 'inbox'}): name the run that python -m summrl.serve records for "
        "(serve.record=true), e.g. run.name=local1 for runs/local1")


def test_a_second_inbox_run_of_one_run_is_refused_while_the_first_trains(tmp_path):
    """Two at once (a scheduled run overlapping the last) read the same watermark and trained the same documents
    twice; the second must not touch the first's record either."""
    from summrl import inbox

    run_dir = tmp_path / "local1"
    (run_dir / "inbox").mkdir(parents=True)
    record = b'{"status": "running", "steps": 3}'
    (run_dir / "result.json").write_bytes(record)
    (run_dir / ".hydra").mkdir()
    (run_dir / ".hydra" / "overrides.yaml").write_text("- the first run's overrides\n")
    held = inbox.hold_training(run_dir)  # the first run
    try:
        result = run_cli(["experiment=local", "run.name=local1", "dataset=inbox", "reward=rubric",
                          f"hydra.run.dir={run_dir}"], cwd=ROOT, timeout=300)
    finally:
        held.close()
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"summrl: config error: dataset=inbox: another process is training this run on its inbox "
        f"({run_dir / inbox.TRAIN_LOCK} is locked): two would train the same documents; run again once it has ended")
    assert (run_dir / "result.json").read_bytes() == record
    # refused before Hydra saved this config over the training run's (serve, export and benchmark read it)
    assert (run_dir / ".hydra" / "overrides.yaml").read_text() == "- the first run's overrides\n"
    assert sorted(p.name for p in (run_dir / ".hydra").iterdir()) == ["overrides.yaml"]
    assert not (run_dir / "train.log").exists()
    inbox.hold_training(run_dir).close()  # released with its file


def test_serve_record_with_an_inbox_that_cant_be_made_is_refused_with_one_line(shared_run, tmp_path):
    """runs/<name>/inbox a file (or the run folder read-only): a 56-line FileExistsError traceback, exit 1, where
    every other startup problem is one line and exit 2. The server makes its recorder before the model loads."""
    import subprocess

    from summrl.backends.embedded.server import free_port

    run = tmp_path / "run"
    shutil.copytree(shared_run.run_dir, run)
    (run / "inbox").write_text("not a folder")
    done = subprocess.run([sys.executable, "-m", "summrl.serve", f"run_dir={run}", "step=latest", "serve.record=true",
                           f"serve.port={free_port()}"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    said = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode == 2, said
    assert said == [f"summrl: config error: serve.record=true: can't create the run's inbox {run / 'inbox'} (File "
                    "exists): make that path a writable folder, or leave serve.record off"]


def test_the_length_selector_returns_the_shortest_summary_within_the_limit_never_an_empty_one():
    """A sample that stopped at once (an eos first, or only whitespace) has 0 words: the shortest, and it was returned."""
    from types import SimpleNamespace

    import summrl.serve.app as app
    from summrl.data import Document
    from summrl.serve.config import ServeConfig, ServeSection
    from tests.conftest import compose_config

    train = compose_config(["experiment=local"])
    service = app.Service(ServeConfig(run=SimpleNamespace(name="r", run_dir=Path("runs/r")), step=1, follow="fixed",
                                      train=train, serve=ServeSection(best_of_n=4, selector="length")))
    document = Document(id="d", topic="", text="The ferry runs twice a day.", questions=())
    over = " ".join(["word"] * (train.trainer.max_words + 1))
    assert asyncio.run(service.select(document, [over, " \n", "The ferry runs twice daily.", "Twice a day."]))[0] == 3
    assert asyncio.run(service.select(document, ["", over, " ", over + " more"]))[0] == 1  # none within: the shortest
    assert asyncio.run(service.select(document, ["", " "]))[0] == 0  # nothing said at all: the first


def test_a_judge_failure_told_to_the_client_never_carries_part_of_a_secret(monkeypatch):
    """The failure was cut at 200 characters before its secrets were masked: a key that straddled the cut was no
    longer found whole, and its first characters reached the client."""
    from types import SimpleNamespace

    import summrl.serve.app as app
    from summrl.data import Document
    from summrl.errors import first_line
    from summrl.serve.config import ServeConfig, ServeSection
    from tests.conftest import compose_config

    secret = "sk-live-" + "7q2W" * 10
    monkeypatch.setenv("JUDGE_API_KEY", secret)
    failure = RuntimeError("x" * 180 + f" {secret} was refused")  # the old cut fell 19 characters into the key

    class Failing:
        async def score_group(self, document, samples):
            raise failure

    service = app.Service(ServeConfig(run=SimpleNamespace(name="r", run_dir=Path("runs/r")), step=1, follow="fixed",
                                      train=compose_config(["experiment=local"]), serve=ServeSection(best_of_n=2)))
    service.selector = Failing()
    document = Document(id="d", topic="", text="The ferry runs twice a day.", questions=())
    chosen, score, fallback, _ = asyncio.run(service.select(document, ["Twice a day.", "The ferry runs."]))
    assert (chosen, score) == (0, None) and fallback.startswith("the judge failed")
    assert "sk-li" not in fallback and "xx ***" in fallback
    assert "sk-li" not in first_line(failure)  # every one-line quote of an error, the same way


def test_requests_that_arrive_together_reach_the_embedded_server_as_one_burst(monkeypatch):
    """The first of concurrent requests reaches the engine's server well before the rest (it rides the one warm
    connection while this app and that server tokenize the others: 153 ms on a 2-core Zen 3, past the batcher's
    window), so /v1/summarize tags the requests that arrive together as one burst, which the batcher collects whole.
    The door's window restarts at each arrival, as the batcher's does. vLLM (backend=local_gpu) is sent no tag, nor is
    the chat pass-through (a request the engine's server refused would hold its burst back)."""
    from types import SimpleNamespace

    import summrl.serve.app as app
    from summrl.serve.config import ServeConfig, ServeSection
    from tests.conftest import compose_config

    with FakeLLM() as fake:
        in_front_of(fake, monkeypatch)

        def tags(overrides: list[str], arrivals: list[float], chat: bool = False) -> list:
            """The summrl_burst each best-of-2 request carried to the backend, for requests arriving at these times."""
            service = app.Service(ServeConfig(run=SimpleNamespace(name="r", run_dir=Path("runs/r")), step=1, follow="fixed",
                                              train=compose_config(overrides),
                                              serve=ServeSection(best_of_n=2, selector="length")))

            async def arrive(at: float) -> None:
                await asyncio.sleep(at)
                if chat:
                    await service.generate([{"role": "user", "content": f"document {at}"}], 2, max_tokens=8)
                else:
                    await service.summarize(app.SummarizeRequest(document=f"document {at}"))

            async def main() -> None:
                await service.start()
                await asyncio.gather(*(arrive(at) for at in arrivals))

            fake.requests.clear()
            asyncio.run(main())
            ordered = sorted(fake.requests, key=lambda r: r["messages"][-1]["content"])
            return [request.get("summrl_burst") for request in ordered]

        embedded = ["experiment=local", "backend.batch_window_ms=250"]
        # the third arrives 0.3 s after the first (past the 0.25 s window) but 0.15 s after the second
        together = tags(embedded, [0.0, 0.15, 0.3])
        assert [t["size"] for t in together] == [6, 6, 6] and len({t["id"] for t in together}) == 1
        alone = tags(embedded, [0.0, 0.6])  # a group closes: the next request starts another
        assert [t["size"] for t in alone] == [2, 2] and alone[0]["id"] != alone[1]["id"]
        assert tags(embedded, [0.0, 0.15], chat=True) == [None, None]
        assert tags(["experiment=local", "backend=local_gpu", "judge=lexical", "model.weights=null"],
                    [0.0, 0.15]) == [None, None]


def test_the_online_loop_serve_record_train_reload(run_copy, tmp_path, tiny_weights):
    """The real openai client (chat with n=2, a wrong key), then: post 8 documents with recording on, train one
    step on the inbox offline, the server reloads step 4 by itself, the watermark advances, and a second train
    with nothing new trains nothing."""
    env = {"SERVE_KEY": SERVE_KEY}
    served = ServeProcess(run_copy, ["step=latest", "serve.record=true", "serve.reload=auto", "serve.reload_check_s=0.2",
                               "serve.api_key_env=SERVE_KEY"], tmp_path / "serve.log", env=env)
    try:
        client = openai.OpenAI(base_url=f"{served.url}/v1", api_key=SERVE_KEY)
        (model,) = client.models.list().data
        assert model.id == "shared@3"
        chat = client.chat.completions.create(model="shared@3", n=2, max_tokens=8, temperature=1.0, seed=1,
                                              messages=[{"role": "user", "content": "Summarize: the bridge reopened."}])
        assert len(chat.choices) == 2 and chat.model == "shared@3" and all(c.message.content for c in chat.choices)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{served.url}/v1", api_key="wrong", max_retries=0).models.list()
        assert summarize(served.url, "A document.", key=None).status_code == 401
        # a parameter the backend refuses is the client's 400, naming it (not a 500 for the whole batch)
        strict = openai.OpenAI(base_url=f"{served.url}/v1", api_key=SERVE_KEY, max_retries=0)
        for refused, match in [({"seed": 2**64}, "seed: Input should be less than or equal to"),
                               # one request asking for 100,000 choices held the server for minutes
                               ({"n": 100_000}, r"n: must be an integer in 1\.\.16 \(serve\.max_n\), got 100000"),
                               ({"temperature": 5}, "temperature: Input should be less than or equal to 2"),
                               ({"top_p": 0}, "top_p: Input should be greater than 0"),
                               ({"stop": list("abcde")}, "stop: Value error, at most 4 sequences"),
                               # past SmolLM2's 8192 positions, as vLLM refuses it (the engine decoded on, untrained)
                               ({"max_tokens": 8190}, r"maximum context length is 8192 tokens\. However, you "
                                                      r"requested \d+ tokens \(\d+ in the messages, 8190 in the "
                                                      r"completion\)\. Please reduce .* max_tokens \(at most \d+"),
                               # an image part: the chat template failed on content parts, a 500
                               ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {
                                   "url": "data:,"}}]}]}, r"messages.0.content: only text parts .* got a part of "
                                                         r"type .+image_url"),
                               # a role the template printed and the model was sampled from
                               ({"messages": [{"role": "robot", "content": "a"}]},
                                r"messages.0.role: must be one of system, user, assistant, developer .* got .+robot")]:
            with pytest.raises(openai.BadRequestError, match=match):
                strict.chat.completions.create(**{"model": "shared@3", "max_tokens": 8,
                                                  "messages": [{"role": "user", "content": "Summarize: a."}],
                                                  **refused})
        # text parts, as OpenAI's clients send them, are the text a line each, as vLLM joins them: the same greedy
        # reply as the plain string
        replies = [strict.chat.completions.create(model="shared@3", max_tokens=8, temperature=0, messages=[
            {"role": "developer", "content": system}, {"role": "user", "content": content}]).choices[0].message.content
            for system, content in (("Be brief.", "Summarize: a bridge reopened."),
                                    ("Be brief.", "Summarize: a bridge\nreopened."),
                                    ([{"type": "text", "text": "Be brief."}],
                                     [{"type": "text", "text": "Summarize: a bridge"}, {"type": "text", "text": "reopened."}]))]
        assert replies[0] and replies[1] == replies[2]
        # streamed, as chat UIs ask: the same greedy text, in pieces as it is drawn, under the served model's name
        chunks = list(strict.chat.completions.create(model="shared@3", max_tokens=8, temperature=0, stream=True,
                                                     messages=[{"role": "system", "content": "Be brief."},
                                                               {"role": "user", "content": "Summarize: a bridge reopened."}]))
        pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
        assert "".join(pieces) == replies[0] and len(pieces) > 1 and {c.model for c in chunks} == {"shared@3"}
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
        # a stop sequence: the text ends before it, answered as soon as it is drawn
        stop = replies[0][3:6]
        cut = strict.chat.completions.create(model="shared@3", max_tokens=8, temperature=0, stop=stop, messages=[
            {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Summarize: a bridge reopened."}])
        assert (cut.choices[0].message.content, cut.choices[0].finish_reason) == (
            replies[0][:replies[0].find(stop)], "stop")

        for i in range(8):
            reply = summarize(served.url, f"Report {i}. The Harbor Festival in Port {i} drew {100 + i} visitors on "
                                          f"June {i + 1}, 2024, and Mayor Ruth Okafor opened it.", id=f"r{i}")
            assert reply.status_code == 200 and reply.json()["step"] == 3
            # as the training prompt's limit counts them (a character each in Chinese: the tiny model writes some)
            assert reply.json()["words"] == word_count(reply.json()["summary"])
        recorded = [json.loads(line) for line in (run_copy / "inbox" / "documents.jsonl").read_text().splitlines()]
        assert [r["id"] for r in recorded] == [f"r{i}" for i in range(8)] and {r["step"] for r in recorded} == {3}
        assert set(recorded[0]) == {"id", "text", "time", "step"}  # nothing of the request but the document

        with FakeLLM() as judge:
            online = ["experiment=local", tiny_weights, "run.name=shared", f"hydra.run.dir={run_copy}",
                      "dataset=inbox", "reward=ruler", "judge=openai_compatible", f"judge.api_base={judge.base_url}",
                      "dataset.questions.confirm=false", f"dataset.questions.cache_dir={tmp_path / 'questions'}",
                      "storage.enabled=false", "trainer.max_summary_tokens=16", "trainer.val_rollouts_per_doc=1",
                      "trainer.rollouts_per_group=2", "trainer.groups_per_step=4"]
            first = run_cli(online, cwd=ROOT)
            assert first.returncode == 0, first.stderr[-3000:]
            assert "4 new inbox documents, 1 step(s) from step 3" in first.stdout
            last = hashlib.sha256((run_copy / "inbox" / "documents.jsonl").read_bytes().split(b"\n")[7]).hexdigest()
            assert json.loads((run_copy / "inbox" / "watermark.json").read_text()) == {
                "consumed": {"4": 8}, "last_line": {"4": last[:16]}, "val_size": 4, "val_lines": [0, 1, 2, 3]}
            # online val is its own val set and reward: step 3 scored again on it, and best compares like with like
            # (it compared RULER on the inbox with QA on the original val split)
            online_record = json.loads((run_copy / "result.json").read_text())
            scored = [(h["step"], h.get("val_set")) for h in online_record["val_history"]]
            assert [s for s, _ in scored[-2:]] == [3, 4] and (3, None) in scored
            assert scored[-1][1] == scored[-2][1] and scored[-1][1].startswith("inbox:ruler:")  # + its documents
            assert online_record["best_val_score"] == max(h["val_reward"] for h in online_record["val_history"][-2:])
            deadline = time.monotonic() + 30
            # reloaded with no request to prompt it (GET /health loads nothing), no restart
            while httpx.get(f"{served.url}/health").json()["step"] != 4:
                assert time.monotonic() < deadline, served.log.read_text()[-2000:]
                time.sleep(0.3)
            assert "reloaded: serving step 4 (was 3)" in served.log.read_text()
            assert client.models.list().data[0].id == "shared@4"
            checkpoints = run_copy / "art" / "summrl" / "models" / "shared" / "checkpoints"
            greedy = lambda: client.chat.completions.create(  # noqa: E731
                model="shared@4", messages=[{"role": "user", "content": "Say something."}], max_tokens=8,
                temperature=0).choices[0].message.content
            before = greedy()
            # a step 5 that is not this adapter (half its tensors, changed), written whole as training does: peft
            # copied what fit, so the server answered with weights of no step while it said step 4
            from safetensors.torch import load_file, save_file

            broken = checkpoints / ".0005.tmp"
            shutil.copytree(checkpoints / "0004", broken)
            tensors = load_file(broken / "adapter_model.safetensors")
            save_file({k: v + 1.0 for k, v in list(tensors.items())[:len(tensors) // 2]},
                      broken / "adapter_model.safetensors")
            broken.rename(checkpoints / "0005")
            time.sleep(0.5)  # the server looks every 0.2 s
            assert client.models.list().data[0].id == "shared@4"  # the failed reload keeps serving step 4
            assert greedy() == before  # with step 4's weights, untouched
            assert summarize(served.url, "Still answering.", id="still").json()["step"] == 4
            assert served.log.read_text().count("reload of step 5 failed, still serving step 4: ValueError: ") == 1
            assert "is not this model's adapter (" in served.log.read_text()
            shutil.rmtree(checkpoints / "0005")
            (run_copy / "inbox" / "documents.jsonl").write_text(  # what step 4 consumed; the probe above was new
                "".join(line + "\n" for line in (run_copy / "inbox" / "documents.jsonl").read_text().splitlines()[:8]))

            trained = json.loads((run_copy / "result.json").read_text())
            second = run_cli(online, cwd=ROOT)
            assert second.returncode == 0, second.stderr[-3000:]
            # the run's record keeps its scores (it was rewritten with this invocation's fields alone, for report)
            kept = json.loads((run_copy / "result.json").read_text())
            for key in ("steps", "final_val_score", "best_val_score", "rollouts", "val_history", "wall_s"):
                assert kept[key] == trained[key], key
            assert kept["status"] == "completed" and kept["online"]["new_documents"] == 0
            assert "0 new document(s), fewer than trainer.min_new_documents=1: nothing to train" in second.stdout
            assert sorted(p.name for p in (run_copy / "art" / "summrl" / "models" / "shared" / "checkpoints").iterdir()
                          )[-1] == "0004"
        served.stop()  # Ctrl-C: uvicorn's re-raised SIGINT cancelled closing the backend (two tracebacks, exit 1)
        assert served.process.returncode == 0 and "Traceback" not in served.log.read_text()
        assert served.log.read_text().rstrip().endswith("summrl: the server stopped (SIGINT)")
    finally:
        served.stop()


def test_a_checkpoint_that_cant_be_loaded_ends_the_server_with_one_line(run_copy, tmp_path):
    """It stayed up answering 503 to everything, so no supervisor saw it fail."""
    from safetensors.torch import load_file, save_file

    run = tmp_path / "run"
    checkpoints = run / "art" / "summrl" / "models" / "shared" / "checkpoints"
    shutil.copytree(run_copy, run, ignore=shutil.ignore_patterns("inbox"))
    shutil.copytree(checkpoints / "0003", checkpoints / "0009")
    tensors = load_file(checkpoints / "0009" / "adapter_model.safetensors")
    save_file(dict(list(tensors.items())[1:]), checkpoints / "0009" / "adapter_model.safetensors")  # one missing
    from summrl.backends.embedded.server import free_port

    result = subprocess.run([sys.executable, "-m", "summrl.serve", f"run_dir={run}", "step=9", f"serve.port={free_port()}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"summrl: config error: step=9: the model could not be loaded (ValueError: {checkpoints}/"
                           "0009/adapter_model.safetensors is not this model's adapter (1 tensors missing, 0 unknown")
    assert line.endswith("): serve another step, or check the run's model settings") and "Traceback" not in result.stderr


def test_a_gpu_served_model_gets_its_chat_template_kwargs_in_every_request(monkeypatch, tmp_path):
    """vLLM renders a chat with the chat_template_kwargs a request carries, and ART adds the model's only in
    model.openai_client(): qwen3_8b, trained with thinking off, was served (and benchmarked) with it on."""
    from types import SimpleNamespace

    from fastapi.testclient import TestClient

    import summrl.serve.app as app
    from summrl.backends.serving import LocalGPUServer
    from summrl.serve.config import ServeConfig, ServeSection
    from tests.conftest import compose_config

    train = compose_config(["experiment=local", "backend=local_gpu", "model=qwen3_8b", "judge=lexical"])
    extra = LocalGPUServer(train, None).extra_body
    assert extra == {"chat_template_kwargs": {"enable_thinking": False}}
    assert LocalGPUServer(compose_config(["backend=local_gpu"]), None).extra_body is None  # Qwen2.5: none
    with FakeLLM() as fake:
        in_front_of(fake, monkeypatch, extra_body=extra)
        service = app.Service(ServeConfig(run=SimpleNamespace(name="r", run_dir=tmp_path), step=1, follow="fixed",
                                          train=train, serve=ServeSection()))
        with TestClient(app.build_app(service)) as client:
            client.portal.call(service.start)
            assert client.post("/v1/summarize", json={"document": "A short text."}).status_code == 200
            chat = {"model": "r@1", "messages": [{"role": "user", "content": "hi"}]}
            assert client.post("/v1/chat/completions", json=chat).status_code == 200
    assert [r.get("chat_template_kwargs") for r in fake.requests] == [{"enable_thinking": False}] * 2


def test_the_server_refuses_by_name_what_it_does_not_do_and_goes_on(monkeypatch, tmp_path, caplog):
    """Found by an audit against a running server: a 216 MB body was read whole (killed at 24 GB); stop, tools and
    logit_bias were dropped silently; a lowercase 'bearer' was refused; the router's 404/405 and a recording failure
    (a full disk) were not in OpenAI's error shape, the latter losing the summary. In front of the loopback fake."""
    from types import SimpleNamespace

    from fastapi.testclient import TestClient

    import summrl.serve.app as app
    from summrl.serve.config import ServeConfig, ServeSection
    from tests.conftest import compose_config

    monkeypatch.setenv("SERVE_TEST_KEY", "k-123")
    with FakeLLM() as fake:
        in_front_of(fake, monkeypatch)
        section = ServeSection(api_key_env="SERVE_TEST_KEY", record=True, max_document_tokens=100)
        service = app.Service(ServeConfig(run=SimpleNamespace(name="r", run_dir=tmp_path), step=1, follow="fixed",
                                          train=compose_config(["experiment=local", "backend=local_gpu",
                                                                "judge=lexical", "model.weights=null"]),
                                          serve=section))
        with TestClient(app.build_app(service)) as client:
            client.portal.call(service.start)
            key = {"Authorization": "bearer k-123"}  # the scheme is case-insensitive (RFC 7235)

            def error(response, status: int) -> str:
                assert response.status_code == status, response.text
                return response.json()["error"]["message"]

            limit = app.max_body_bytes(section)
            assert limit == 1 << 20
            assert error(client.post("/v1/summarize", headers=key, content=b"x" * (limit + 1)), 413).startswith(
                f"request body over {limit} bytes")
            chat = {"model": "r@1", "messages": [{"role": "user", "content": "hi"}]}
            assert error(client.post("/v1/chat/completions", headers=key, json={**chat, "logit_bias": {"1": 5}, "tools": [
                {"type": "function", "function": {"name": "f"}}]}), 400).startswith(
                "bad request: tools, logit_bias: not supported by this server")
            assert client.post("/v1/chat/completions", headers=key, json={**chat, "stop": ["x"]}).status_code == 200
            assert fake.requests[-1]["stop"] == ["x"]  # passed on: vLLM and the embedded engine stop there
            parts = [{"type": "text", "text": "Summarize: a bridge"}, {"type": "text", "text": "reopened."}]
            assert client.post("/v1/chat/completions", headers=key,
                               json={**chat, "messages": [{"role": "user", "content": parts}]}).status_code == 200
            # a line each, as vLLM joins text parts: "bridgereopened." was one word to the model
            assert fake.requests[-1]["messages"] == [{"role": "user", "content": "Summarize: a bridge\nreopened."}]
            # a message's tool fields were passed to the template, which never read them, and the reply came as if
            # they had been (a serve audit); empty ones, as an OpenAI client echoes an assistant message, are fine
            called = {"role": "assistant", "content": "x", "tool_calls": [{"id": "c1", "type": "function"}]}
            assert error(client.post("/v1/chat/completions", headers=key, json={**chat, "messages": [called]}),
                         400) == ("bad request: messages.0: tool_calls not supported (this server has no tools): send "
                                  "role, content and optionally name")
            echoed = {"role": "assistant", "content": "x", "name": "a", "tool_calls": None, "refusal": None,
                      "annotations": []}
            assert client.post("/v1/chat/completions", headers=key,
                               json={**chat, "messages": [echoed, *chat["messages"]]}).status_code == 200
            assert fake.requests[-1]["messages"][0] == {"role": "assistant", "content": "x", "name": "a"}
            assert error(client.post("/v1/chat/completions", headers=key, json={"messages": chat["messages"]}),
                         400) == "bad request: model: required, the served model's id (r@1)"
            assert client.post("/v1/chat/completions", headers=key, json={**chat, "temperature": 0}).status_code == 200
            # "false" as a string was refused as if it asked to stream; a false boolean is what OpenAI's clients send
            assert error(client.post("/v1/chat/completions", headers=key, json={**chat, "stream": "false"}),
                         400) == "bad request: stream: must be true or false, got 'false'"
            assert client.post("/v1/chat/completions", headers=key, json={**chat, "stream": False}).status_code == 200
            # the embedded server's lenient parsing took true as 1 token and "1.5" as a temperature (found by an audit)
            for field, value, kind in (("max_tokens", True, "an integer of at least 1"), ("max_completion_tokens", 0,
                                       "an integer of at least 1"), ("temperature", "1.5", "a number"),
                                       ("top_p", False, "a number"), ("seed", 1.5, "an integer")):
                assert error(client.post("/v1/chat/completions", headers=key, json={**chat, field: value}),
                             400) == f"bad request: {field}: must be {kind}, got {value!r}"
            assert client.post("/v1/chat/completions", headers=key,
                               json={**chat, "max_tokens": 4, "temperature": 1, "seed": 3}).status_code == 200
            untyped = {**chat, "messages": [{"role": "user", "content": [{"text": "hi"}]}]}  # read as text, sampled
            assert error(client.post("/v1/chat/completions", headers=key, json=untyped), 400).endswith(
                "only text parts ({\"type\": \"text\", \"text\": ...}) are read by a summarizer, got a part of type "
                "None")
            lone = b'{"model": "r@1", "messages": [{"role": "user", "content": "hi \\ud83d there"}]}'
            assert error(client.post("/v1/chat/completions", headers=key, content=lone), 400) == (
                "bad request: the body escapes a lone UTF-16 surrogate (e.g. \\ud83d), which is no character: send "
                "whole characters")  # it was a 500 with a traceback, from the backend's client
            # numbers JSON can't write, and arrays nested past Python's recursion limit: each was a 500 (an audit)
            for text, said in (("NaN", "NaN is not a JSON number"), ("Infinity", "Infinity is not a JSON number"),
                               ("1e400", "1e400 is out of a number's range")):
                body = b'{"model": "r@1", "messages": [{"role": "user", "content": "hi"}], "temperature": %s}' % (
                    text.encode())
                assert error(client.post("/v1/chat/completions", headers=key, content=body), 400) == (
                    f"bad request: the body is not JSON ({said})")
            deep = b'{"model": "r@1", "messages": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
            assert error(client.post("/v1/chat/completions", headers=key, content=deep), 400) == (
                "bad request: the body is not JSON")
            # flags the backend reads as truthy: "yes" gave logprobs
            assert error(client.post("/v1/chat/completions", headers=key, json={**chat, "logprobs": "yes"}),
                         400) == "bad request: logprobs: must be true or false, got 'yes'"
            assert error(client.post("/v1/chat/completions", headers=key, json={
                **chat, "stream": True, "stream_options": {"include_usage": 1}}), 400) == (
                "bad request: stream_options.include_usage: must be true or false, got 1")
            assert error(client.post("/v1/chat/completions", headers=key, json={
                **chat, "stream": True, "stream_options": "usage"}), 400) == (
                "bad request: stream_options: must be an object, got 'usage'")

            def streamed(reply: Reply) -> list:
                fake.script.append(reply)
                with client.stream("POST", "/v1/chat/completions", headers=key, json={**chat, "stream": True}) as sse:
                    assert sse.headers["content-type"].startswith("text/event-stream")
                    return [line[6:] for line in sse.iter_lines() if line.startswith("data: ")]

            # the backend's stream relayed piece by piece (vLLM's, or the embedded engine's), under the served name
            events = streamed(Reply("Alpha beta gamma."))
            chunks = [json.loads(event) for event in events[:-1]]
            assert events[-1] == "[DONE]" and {c["model"] for c in chunks} == {"r@1"}
            assert [c["choices"][0]["delta"].get("content") for c in chunks] == ["", "Alpha ", "beta ", "gamma.", None]
            assert chunks[-1]["choices"][0]["finish_reason"] == "stop" and service.in_flight == 0
            # the backend failing mid-stream: an error event in OpenAI's shape (its client raises it), and it goes on
            events = streamed(Reply("Alpha beta gamma.", stream_error="the engine fell over"))
            assert json.loads(events[-1])["error"]["message"] == "internal error: APIError: the engine fell over"
            assert [json.loads(e)["choices"][0]["delta"]["content"] for e in events[:-1]] == ["", "Alpha "]
            assert service.in_flight == 0 and "a streamed chat failed: APIError: the engine fell over" in caplog.text
            # the backend's connection cut mid-stream (httpx's error, which the openai client does not wrap): the same
            # error event, where the exception escaped the relay and the client's read failed
            events = streamed(Reply("Alpha beta gamma.", stream_cut=True))
            assert json.loads(events[-1])["error"]["message"].startswith("internal error: RemoteProtocolError")
            assert [json.loads(e)["choices"][0]["delta"]["content"] for e in events[:-1]] == ["", "Alpha "]
            assert service.in_flight == 0
            # OpenAI's bounds, checked here: vLLM would take 5 stops, an empty one, and stream_options unstreamed
            asked = len(fake.requests)
            assert error(client.post("/v1/chat/completions", headers=key, json={**chat, "stop": list("abcde")}),
                         400).startswith("bad request: stop: Value error, at most 4 sequences")
            assert error(client.post("/v1/chat/completions", headers=key, json={**chat, "stop": ["x", ""]}),
                         400).startswith("bad request: stop: Value error, at most 4 sequences, none of them empty")
            assert error(client.post("/v1/chat/completions", headers=key, json={**chat, "stop": 7}), 400).startswith(
                "bad request: stop: Input should be a valid string")
            assert error(client.post("/v1/chat/completions", headers=key, json={
                **chat, "stream_options": {"include_usage": True}}), 400) == (
                "bad request: stream_options: only with stream: true")
            assert len(fake.requests) == asked
            assert error(client.get("/v1/nothing"), 404) == "Not Found"
            assert error(client.get("/v1/summarize", headers=key), 405) == "Method Not Allowed"
            card = client.get("/v1/models/r@1", headers=key).json()
            assert card["id"] == "r@1" and isinstance(card["created"], int) and card == client.get(
                "/v1/models", headers=key).json()["data"][0]
            assert error(client.get("/v1/models/other", headers=key), 404).startswith("model 'other' is not served")
            (tmp_path / "inbox" / "documents.jsonl").mkdir(parents=True)  # the inbox can't be written
            reply = client.post("/v1/summarize", headers=key, json={"document": "A short document."})
            assert reply.status_code == 200 and reply.json()["summary"] and reply.json()["recorded"] is False
            # a summary cut at trainer.max_summary_tokens says so, as a chat completion does
            fake.script.append(Reply("The memo says the ferry", finish_reason="length"))
            cut = client.post("/v1/summarize", headers=key, json={"document": "A memo about the ferry."}).json()
            assert (cut["summary"], cut["finish_reason"]) == ("The memo says the ferry", "length")
            # vLLM's refusal where the server can't count the context (local_gpu, max_model_len null): a 500 before
            fake.script.append(Reply("This model's maximum context length is 32768 tokens. However, you requested "
                                     "33000 tokens.", status=400))
            assert error(client.post("/v1/summarize", headers=key, json={"document": "A long document."}), 413) == (
                "document: 3 tokens; bad request: This model's maximum context length is 32768 tokens. However, you "
                "requested 33000 tokens.; split it")
            # a field /v1/summarize does not take was ignored, the server's settings answering; an id naming a part
            assert error(client.post("/v1/summarize", headers=key, json={"document": "A text.", "temperature": 0}),
                         400) == "bad request: temperature: Extra inputs are not permitted"
            assert error(client.post("/v1/summarize", headers=key, json={"document": "A text.", "id": "memo#part2"}),
                         400).startswith("bad request: id: Value error, must not end with #part<k>")
            assert client.post("/v1/summarize", headers=key, json={"document": "A text.", "id": "memo#party"}
                               ).status_code == 200
            assert error(client.post("/v1/chat/completions", headers=key, json={**chat, "reasoning_effort": "low"}),
                         400).startswith("bad request: reasoning_effort: not supported by this server")
            # vLLM's sampling extensions were dropped without a word (top_k=1 still sampled); OpenAI's no-op fields pass
            assert error(client.post("/v1/chat/completions", headers=key, json={**chat, "top_k": 1, "min_tokens": 30}),
                         400).startswith("bad request: min_tokens, top_k: not supported by this server")
            assert client.post("/v1/chat/completions", headers=key, json={**chat, "user": "u1", "store": False}
                               ).status_code == 200
            # an earlier step's name (a reload replaced it) says which name follows the served step
            assert error(client.post("/v1/chat/completions", headers=key, json={**chat, "model": "r@0"}), 404) == (
                "model 'r@0' is not served here: step 1 is (r@1); to follow the step served as it changes "
                "(serve.reload=auto), name the model 'r'")
            # checked before the queue: an unknown model with the queue full was a 429 (after waiting behind a reload)
            service.in_flight += section.max_queue
            assert error(client.post("/v1/chat/completions", headers=key, json={**chat, "model": "other"}),
                         404).startswith("model 'other' is not served here")
            service.in_flight -= section.max_queue
            # the API's description answered without the key
            for path in ("/docs", "/redoc", "/openapi.json"):
                assert client.get(path).status_code == 404


def test_requests_waiting_behind_a_reload_count_against_max_queue():
    """They were let in uncounted: 22 ran against serve.max_queue=3 while a reload held the gate."""
    from types import SimpleNamespace

    import summrl.serve.app as app
    from fastapi import HTTPException
    from summrl.serve.config import ServeConfig, ServeSection

    service = app.Service(ServeConfig(run=SimpleNamespace(name="r", run_dir=Path("runs/r")), step=1, follow="fixed",
                                      train=None, serve=ServeSection(max_queue=2)))
    service.ready = True

    async def main() -> int:
        async with service.gate:  # a reload under way
            waiting = [asyncio.create_task(service.enter()) for _ in range(2)]
            await asyncio.sleep(0.05)
            with pytest.raises(HTTPException) as refused:
                await asyncio.wait_for(service.enter(), 2)  # refused at once, not queued behind the reload
            assert refused.value.status_code == 429 and refused.value.headers == {"Retry-After": "1"}  # none done
        entered = await asyncio.gather(*waiting)
        assert service.in_flight == 2
        for took in (2.5, 7.2, 9.0):  # Retry-After: about when a place frees, the recent requests' median time in
            service.leave(time.monotonic() - took)  # flight, rounded up (it said 1 s however long they took)
            service.in_flight += 1
        with pytest.raises(HTTPException) as refused:
            await service.enter()
        assert refused.value.headers == {"Retry-After": "8"}
        return entered

    assert len(asyncio.run(main())) == 2


def test_a_stream_opened_as_its_client_went_is_closed():
    """The backend's stream came back while the client's disconnect was being read: it was dropped open, and the
    backend went on generating its rows for no one (until garbage collection closed the socket)."""
    import asyncio

    from fastapi import HTTPException

    from summrl.backends.disconnect import unless_disconnected

    closed = []

    class Stream:
        async def close(self) -> None:
            closed.append(True)

    async def main() -> None:
        opened = asyncio.Event()

        async def work() -> Stream:
            await opened.wait()
            return Stream()

        async def gone() -> bool:  # the work ends while the disconnect is read
            opened.set()
            await asyncio.sleep(0.05)
            return True

        with pytest.raises(HTTPException) as refused:
            await unless_disconnected(work(), gone)
        assert refused.value.status_code == 499

    asyncio.run(main())
    assert closed == [True]


def test_an_unexpected_failure_is_one_masked_line_in_the_log_not_uvicorns_unmasked_traceback(monkeypatch, tmp_path,
                                                                                              capfd, caplog):
    """Starlette's handler for Exception answered the client (masked) and logged one line, then raised the exception
    again: uvicorn logged "Exception in ASGI application" with the whole traceback and the backend URL's key in clear,
    at every 500 (found by an audit)."""
    import io
    import logging
    import threading
    import time
    from types import SimpleNamespace

    import openai
    import uvicorn

    import summrl.serve.app as app
    from summrl.backends.embedded.server import free_port
    from summrl.serve.config import ServeConfig, ServeSection
    from tests.conftest import compose_config

    secret = "sk-planted-" + "a1b2" * 6
    monkeypatch.setenv("PLANTED_API_KEY", secret)
    with FakeLLM() as fake:
        in_front_of(fake, monkeypatch)
        service = app.Service(ServeConfig(run=SimpleNamespace(name="r", run_dir=tmp_path), step=1, follow="fixed",
                                          train=compose_config(["experiment=local", "judge=lexical"]),
                                          serve=ServeSection()))

        async def generate(*args, **kwargs):  # the model's server gone, its URL carrying a key
            raise openai.APIConnectionError(message=f"Connection error to http://u:{secret}@127.0.0.1:1/v1",
                                            request=httpx.Request("POST", "http://127.0.0.1:1"))

        port = free_port()
        # loop="asyncio": uvicorn's default installs uvloop's policy for the whole process, and every later test of
        # this worker that applies nest_asyncio (ART) failed with "Can't patch loop of type uvloop.Loop"
        server = uvicorn.Server(uvicorn.Config(app.build_app(service), host="127.0.0.1", port=port,
                                               log_level="warning", lifespan="off", loop="asyncio"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        try:
            deadline = time.monotonic() + 30
            while not server.started and time.monotonic() < deadline:
                time.sleep(0.05)
            service.ready, service.generate = True, generate  # (no model: what a request does first fails)
            # a log handler that fails to write (a closed stream) prints its own traceback: logged inside the except
            # block, that traceback went on with the error's, key and all (seen in the suite)
            closed = io.StringIO()
            failing = logging.StreamHandler(closed)
            closed.close()
            logging.getLogger("summrl").addHandler(failing)
            try:
                reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=30,
                                   json={"model": "r@1", "messages": [{"role": "user", "content": "hi"}]})
            finally:
                logging.getLogger("summrl").removeHandler(failing)
        finally:
            server.should_exit = True
            thread.join(10)
    assert reply.status_code == 500 and reply.json()["error"]["type"] == "server_error"
    assert reply.json()["error"]["message"] == ("internal error: APIConnectionError: Connection error to "
                                                "http://***@127.0.0.1:1/v1")
    logged = capfd.readouterr().err + caplog.text  # uvicorn's own handlers, and what pytest's capture took
    assert "summrl: POST /v1/chat/completions failed: APIConnectionError: Connection error to http://***@" in logged
    assert secret not in logged and "Exception in ASGI application" not in logged
    assert "During handling of the above exception" not in logged  # the failing handler's traceback alone
