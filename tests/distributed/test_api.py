"""hvdtrain.run from Python: a worker that fails in the middle of training (its peer waiting in an
allreduce) reaches the caller as a WorkerError with that worker's traceback, every worker is gone
afterwards, and the caller's Ctrl-C handler is back. Meanwhile a network peer (a thread that finds
every port the caller opens for the job, as a port scan would) PUTs pickles whose ``__reduce__``
writes a marker file and a forged failure report, and GETs the job: no marker, no forged report,
nothing of the job read; the job's own channel listens on loopback only. (The success path,
results and np=1 run in the quickstart notebook test.)"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import uuid

import pytest

from jobs import REPO, run

SCRIPT = textwrap.dedent('''
    import base64, json, os, signal, sys, threading, time, urllib.error, urllib.request
    import cloudpickle
    import hvdtrain


    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {sys.argv[2]}",))


    EVIL = base64.b64encode(cloudpickle.dumps(Evil()))
    FORGED = json.dumps({"rank": 0, "size": 2, "host": "attacker", "time": 0.0, "type": "ValueError",
                         "module": "builtins", "message": "forged", "traceback": "forged"}).encode()
    # what hvdtrain's channel and Horovod's function-mode store would accept, were they open
    # (reads first: a read must not find the attacker's own write)
    ATTACKS = [("GET", "/job", b""), ("GET", "/runfunc/func", b"")] + [("PUT", f"/{scope}/{key}", body) for
        scope, key, body in [("hvdtrain-failures", "0", EVIL), ("hvdtrain-failures", "1", EVIL),
                             ("runfunc", "func", EVIL), ("runfunc_result", "0", EVIL), ("failure", "0", FORGED),
                             ("result", "0", b"{}")]]


    def listening():
        """(address, port) of the TCP sockets this process listens on."""
        inodes = set()
        for fd in os.listdir("/proc/self/fd"):
            try:
                link = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
        found = set()
        for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
            for line in open(table).read().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:
                    address, port = fields[1].split(":")
                    found.add((address, int(port, 16)))
        return found


    def attack(done, seen, answers):
        before = listening()
        while not done.is_set():
            for address, port in listening() - before - seen:  # each new port once, as soon as it listens
                seen.add((address, port))
                for method, path, body in ATTACKS:
                    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                                     data=body if method == "PUT" else None, method=method)
                    try:
                        with urllib.request.urlopen(request, timeout=5) as response:
                            status, got = response.status, len(response.read())
                    except urllib.error.HTTPError as e:
                        status, got = e.code, 0
                    except Exception as e:
                        status, got = type(e).__name__, 0
                    answers.append([address, port, method, path, status, got])
            time.sleep(0.2)

    hvdtrain.define_recipe("failing-cnn", replace=True)


    @hvdtrain.register_recipe("failing-cnn", framework="torch", replace=True)
    def build(config, ctx):
        from hvdtrain_recipes.image_classification import build_torch

        task = build_torch(config, ctx)
        calls, real_loss = [0], task.loss_fn

        def failing_loss(logits, labels):
            calls[0] += 1
            if ctx.rank == 1 and calls[0] == 3:
                raise ArithmeticError("loss exploded on rank 1 at its third batch")
            return real_loss(logits, labels)

        task.loss_fn = failing_loss
        return task


    def interrupt_button(signum, frame):  # the caller's own handler, as a notebook kernel installs one
        raise KeyboardInterrupt


    if __name__ == "__main__":
        signal.signal(signal.SIGINT, interrupt_button)  # whatever SIGINT was at start (ignored in a background job)
        done, seen, answers = threading.Event(), set(), []
        threading.Thread(target=attack, args=(done, seen, answers), daemon=True).start()
        try:
            hvdtrain.run("failing-cnn", framework="torch", np=2, output=sys.argv[1], train__epochs=1,
                         train__batch_size=16, data__max_train_samples=256, data__max_val_samples=64)
        except hvdtrain.WorkerError as err:
            print("REPORT " + json.dumps({
                "rank": err.rank, "type": err.exc_type, "message": err.message, "text": str(err),
                "original": repr(err.exception),
                "sigint_restored": signal.getsignal(signal.SIGINT) is interrupt_button,
                "ports": sorted(seen), "answers": answers}))
        done.set()
''')


def _processes_with(marker: str) -> list[str]:
    """Command lines of live processes whose environment holds ``marker``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker.encode() in f.read():
                    with open(f"/proc/{pid}/cmdline", "rb") as c:
                        found.append(c.read().replace(b"\0", b" ").decode())
        except OSError:
            continue
    return found


@pytest.mark.distributed
def test_worker_failure_reaches_the_caller_with_its_traceback(tmp_path, monkeypatch):
    script = tmp_path / "notebook_like.py"
    script.write_text(SCRIPT)
    marker = f"HVDTRAIN_TEST_MARKER={uuid.uuid4().hex}"
    monkeypatch.setenv(*marker.split("="))
    pwned = tmp_path / "pwned"
    proc = run([sys.executable, script, tmp_path / "out", pwned], timeout=300, cwd=REPO)
    assert not pwned.exists(), "a pickle PUT by a network peer ran in the caller or a worker"
    report = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("REPORT "))[7:])
    assert report["rank"] == 1 and report["type"] == "ArithmeticError"
    assert report["message"] == "loss exploded on rank 1 at its third batch"
    assert report["original"] == "ArithmeticError('loss exploded on rank 1 at its third batch')"
    text = report["text"]
    assert text.startswith("worker 1 of 2 ")
    assert "Traceback from worker 1:" in text
    for frame in ("in train_step", "in failing_loss", 'raise ArithmeticError("loss exploded'):
        assert frame in text, text
    assert report["sigint_restored"]
    assert _processes_with(marker) == []  # no worker outlived the call

    # the network peer: it reached every port the caller opened, and none ran its code or took its report
    answers = report["answers"]
    assert report["ports"] and answers, report
    assert not [a for a in answers if a[2] == "GET" and a[4] == 200], answers  # nothing of the job read
    channel = {(a[0], a[1]) for a in answers if a[3] == "/job" and a[4] == 403}
    assert len(channel) == 1, answers  # hvdtrain's channel refuses what is not signed with the job's key
    assert channel.pop()[0] == "0100007F", answers  # listening on 127.0.0.1 only (a job on this machine)
