"""Where compression pays: time to accuracy when the link between the two workers is slow for real.

Two network namespaces, each holding one worker, joined by a veth pair whose both ends are shaped
with ``tc`` (token bucket) to the given rate; nothing is slowed in code. Horovod's Gloo rendezvous
server runs in the first namespace (as ``horovodrun`` would on the first host); each worker is an
ordinary ``hvdtrain recipe`` process with Horovod's launcher variables, its Gloo traffic on its veth
end. Needs root (``ip netns``, ``tc``: package iproute2); the namespaces are created for each
setting and removed afterwards, also on failure. Addresses: 10.213.0.1/2 on the veth only.

    .venv/bin/python benchmarks/compression_link.py --rates 1gbit,100mbit   # ~25 min on 2 cores

For each rate, every setting trains the image recipe (torch, small_cnn, MNIST subset, a few epochs,
validation after each); the time to accuracy of a setting is the training time (sum of epoch
times) until its validation accuracy first reaches the uncompressed run's final accuracy at the
same rate. Results go to benchmarks/compression_results.json ("link") and benchmarks/sections/compression.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(HERE)]

NS = ("hvdtrain-bench-a", "hvdtrain-bench-b")
VETH = ("hvdbench-a", "hvdbench-b")
ADDR = ("10.213.0.1", "10.213.0.2")
BIN = Path(sys.executable).parent
SETTINGS = {
    "none": [],
    "powersgd-r4": ["comm.compression=powersgd", "comm.powersgd_rank=4"],
    "local-sgd-h4": ["comm.local_sgd_steps=4"],
    "topk-1%": ["comm.compression=topk", "comm.topk_ratio=0.01"],
}
TRAIN = ["data.max_train_samples=12000", "data.max_val_samples=2000", "train.epochs=3", "train.threads=1",
         "train.log_every=0", "checkpoint.enabled=false", "train.tensorboard=false", "train.progress_bar=false"]


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def setup(rate: str) -> None:
    """Two namespaces, a veth pair between them, both ends shaped to ``rate`` (e.g. 100mbit).

    Inside each namespace this machine's hostname resolves to that namespace's veth address
    (``ip netns exec`` mounts ``/etc/netns/NS/hosts`` over ``/etc/hosts``): Horovod 0.28 builds
    its process-set Gloo contexts, the global one included, on the address of the hostname and
    not on ``HOROVOD_GLOO_IFACE`` (``GlooContext::InitializeForProcessSet`` reads an iface it
    never set), and here the hostname resolves to 127.0.0.1."""
    teardown()
    for ns, addr in zip(NS, ADDR):
        sh("ip", "netns", "add", ns)
        etc = Path("/etc/netns") / ns
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(f"127.0.0.1 localhost\n{addr} {socket.gethostname()}\n")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
    sh("ip", "link", "add", VETH[0], "type", "veth", "peer", "name", VETH[1])
    bits = float(rate.lower().replace("gbit", "e9").replace("mbit", "e6"))
    burst = max(int(bits / 8 / 100), 32_000)  # 10 ms worth of bytes
    for ns, dev, addr in zip(NS, VETH, ADDR):
        sh("ip", "link", "set", dev, "netns", ns)
        sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{addr}/24", "dev", dev)
        sh("ip", "netns", "exec", ns, "ip", "link", "set", dev, "up")
        sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
           "burst", str(burst), "latency", "50ms")


def teardown() -> None:
    """Remove the namespaces (their veth ends go with them)."""
    for ns in NS:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)


def launch_in_namespaces(out: Path, overrides: list[str], log: Path) -> None:
    """Run inside NS[0]: Horovod's rendezvous server here, worker 0 here, worker 1 in NS[1]."""
    from horovod.runner.common.util import hosts
    from horovod.runner.http.http_server import RendezvousServer

    server = RendezvousServer(verbose=0)
    port = server.start()
    server.init(hosts.get_host_assignments(hosts.parse_hosts("hosta:1,hostb:1"), 2))
    procs = []
    for rank in range(2):
        env = dict(os.environ, HOROVOD_GLOO_RENDEZVOUS_ADDR=ADDR[0], HOROVOD_GLOO_RENDEZVOUS_PORT=str(port),
                   HOROVOD_CONTROLLER="gloo", HOROVOD_CPU_OPERATIONS="gloo", HOROVOD_GLOO_IFACE=VETH[rank],
                   HOROVOD_HOSTNAME=("hosta", "hostb")[rank], HOROVOD_RANK=str(rank), HOROVOD_SIZE="2",
                   HOROVOD_LOCAL_RANK="0", HOROVOD_LOCAL_SIZE="1", HOROVOD_CROSS_RANK=str(rank),
                   HOROVOD_CROSS_SIZE="2", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        cmd = [str(BIN / "hvdtrain"), "recipe", "image-classification", "--framework", "torch", "--output", str(out),
               *[x for o in overrides for x in ("--set", o)]]
        if rank == 1:
            cmd = ["ip", "netns", "exec", NS[1], *cmd]
        procs.append(subprocess.Popen(cmd, env=env, stdout=open(log, "a"), stderr=subprocess.STDOUT))
    codes = [p.wait() for p in procs]
    server.stop()
    if any(codes):
        raise RuntimeError(f"workers exited {codes}; see {log}")


def time_to(history: list[dict], target: float) -> float | None:
    elapsed = 0.0
    for record in history:
        elapsed += record["epoch_time_sec"]
        if record["val_accuracy"] >= target:
            return elapsed
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="1gbit,100mbit")
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--launch", nargs=2, metavar=("OUT", "SETTING"), help=argparse.SUPPRESS)
    parser.add_argument("--keep", default=None)
    parser.add_argument("--reanalyse", action="store_true",
                        help="train nothing: recompute the rows from the runs kept in --keep by an earlier launch")
    args = parser.parse_args()
    if args.launch:  # inside the first namespace
        out, setting = args.launch
        launch_in_namespaces(Path(out), TRAIN + SETTINGS[setting], Path(out).with_suffix(".log"))
        return
    raw = Path(args.keep or tempfile.mkdtemp(prefix="hvdtrain-link-"))
    raw.mkdir(parents=True, exist_ok=True)
    rows = []
    if args.reanalyse:
        for rate in args.rates.split(","):
            rows += summarise(rate, {setting: (read_history(raw / f"{rate}_{setting.replace('%', 'pct')}"), None)
                                     for setting in args.settings.split(",")})
    else:
        rows = train_all(args, raw)
    results_file = HERE / "compression_results.json"
    results = json.loads(results_file.read_text()) if results_file.is_file() else {}
    date = results.get("link", {}).get("date") if args.reanalyse else None
    results["link"] = {"date": date or datetime.date.today().isoformat(),
                       "command": f"python benchmarks/compression_link.py --rates {args.rates}", "train": TRAIN,
                       "rows": rows}
    results_file.write_text(json.dumps(results, indent=1))
    print(json.dumps(rows, indent=1))
    subprocess.run([sys.executable, HERE / "compression.py", "report"], check=True)


def read_history(out: Path) -> list[dict]:
    """A run's metrics.jsonl rows."""
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def summarise(rate: str, runs: dict[str, tuple[list[dict], float | None]]) -> list[dict]:
    """One row per setting at ``rate``: time to the uncompressed run's final accuracy, and time to
    the common target (the lowest final accuracy of all settings, which every one reaches)."""
    target = runs["none"][0][-1]["val_accuracy"]
    common = min(history[-1]["val_accuracy"] for history, _ in runs.values())
    base, base_common = time_to(runs["none"][0], target), time_to(runs["none"][0], common)
    rows = []
    for setting, (history, wall) in runs.items():
        reached, reached_common = time_to(history, target), time_to(history, common)
        rows.append({"rate": rate, "setting": setting, "target": target, "time_to_target": reached,
                     "ratio_to_uncompressed": (reached / base) if reached and base else None,
                     "common_target": common, "time_to_common": reached_common,
                     "ratio_common": (reached_common / base_common) if reached_common and base_common else None,
                     "final_accuracy": history[-1]["val_accuracy"],
                     "train_sec": sum(r["epoch_time_sec"] for r in history),
                     "epoch_times": [r["epoch_time_sec"] for r in history],
                     "accuracies": [r["val_accuracy"] for r in history], "wall_sec": wall})
    return rows


def train_all(args: argparse.Namespace, raw: Path) -> list[dict]:
    """Every setting at every rate, each rate in its own pair of namespaces."""
    rows = []
    try:
        for rate in args.rates.split(","):
            setup(rate)
            runs = {}
            for setting in args.settings.split(","):
                out = raw / f"{rate}_{setting.replace('%', 'pct')}"
                started = time.perf_counter()
                subprocess.run(["ip", "netns", "exec", NS[0], sys.executable, __file__, "--launch", str(out), setting],
                               check=True, env=dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{HERE}"))
                history = read_history(out)
                runs[setting] = (history, time.perf_counter() - started)
                print(f"{rate} {setting}: acc {history[-1]['val_accuracy']:.4f} "
                      f"train {sum(r['epoch_time_sec'] for r in history):.0f}s", flush=True)
            rows += summarise(rate, runs)
            teardown()
    finally:
        teardown()
    return rows


if __name__ == "__main__":
    main()
