"""Gradient compression and local SGD: bytes on the wire and accuracy next to the uncompressed run,
both frameworks. Writes benchmarks/compression_results.json and reports/benchmarks/compression.md (every
table and command; BENCHMARKS.md's section, benchmarks/sections/compression.md, is its summary and links it).

    .venv/bin/python benchmarks/compression.py bytes      # socket bytes per step, small_cnn and resnet18 (~8 min)
    .venv/bin/python benchmarks/compression.py accuracy   # the MNIST demo config, 2 ranks (~3 min per epoch and run)
    .venv/bin/python benchmarks/compression.py ddp        # torch PowerSGD vs DDP's powerSGD_hook (~5 min)
    .venv/bin/python benchmarks/compression.py report     # re-render the report and BENCHMARKS.md
    .venv/bin/python benchmarks/compression_link.py       # time to accuracy over a tc-shaped veth (root)

Bytes: each setting runs in its own ``horovodrun -np 2 --gloo`` job on the image recipe's model with
a fixed random batch (32 per worker, 1x32x32); each rank counts the bytes it passes to write() (its
Gloo sockets; /proc/self/io ``wchar``, as item 7 does for fp16) over 6 steps after 2 warm-up steps.
Byte counts do not depend on the machine's load, so the settings run one after the other.
Accuracy: `hvdtrain recipe image-classification` with its defaults (the README's MNIST demo: 60,000
images, small_cnn, SGD; ``--epochs`` to shorten) at np=2, once per setting; the validation accuracy
on the 10,000 test images.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(HERE)]

import report  # noqa: E402
from run import BIN, launch, machine  # noqa: E402

OUT = HERE / "compression_results.json"
MARKDOWN = REPO / "reports" / "benchmarks" / "compression.md"  # the whole record; the section summarises it
BYTES_SETTINGS = {
    "none": [],
    "powersgd-r4": ["comm.compression=powersgd", "comm.powersgd_rank=4"],
    "topk-1%": ["comm.compression=topk", "comm.topk_ratio=0.01"],
    "powersgd-r4-fp16": ["comm.compression=powersgd", "comm.powersgd_rank=4", "train.fp16_allreduce=true"],
}
ACCURACY_SETTINGS = {
    "none": [],
    "powersgd-r4": ["comm.compression=powersgd", "comm.powersgd_rank=4"],
    "local-sgd-h4": ["comm.local_sgd_steps=4"],
    "topk-1%": ["comm.compression=topk", "comm.topk_ratio=0.01"],
}


def hvdrun(*args) -> list:
    return [BIN / "horovodrun", "-np", 2, "-H", "localhost:2", "--gloo", *args]


def measure_bytes(raw: Path, log: Path, frameworks: list[str], models: list[str], settings: list[str]) -> list[dict]:
    rows = []
    for framework in frameworks:
        for model in models:
            for name in settings:
                overrides = BYTES_SETTINGS[name]
                out = raw / f"bytes_{framework}_{model}_{name.replace('%', 'pct')}.json"
                launch(hvdrun(sys.executable, HERE / "workers" / "compression_bytes.py", framework, model, out,
                              *overrides), log)
                data = json.loads(out.read_text())
                wire = sum(r["wire_bytes_per_step"] for r in data["ranks"]) / len(data["ranks"])
                rows.append({"framework": framework, "model": model, "setting": name, "overrides": overrides,
                             "params": data["params"], "gradient_bytes": data["gradient_bytes"],
                             "wire_bytes_per_step": wire})
    return rows


def measure_accuracy(raw: Path, log: Path, frameworks: list[str], settings: list[str], epochs: int | None,
                     parallel: bool) -> list[dict]:
    """One run per framework and setting; with ``parallel`` all at once (on a shared machine each
    then gets its share of the cores; the accuracy does not depend on timing)."""
    import subprocess

    from run import job_env

    jobs = []
    for framework in frameworks:
        for name in settings:
            out = raw / f"acc_{framework}_{name.replace('%', 'pct')}"
            sets = [x for o in ACCURACY_SETTINGS[name] for x in ("--set", o)]
            command = ["hvdtrain", "recipe", "image-classification", "--framework", framework, "--output", out,
                       *(["--epochs", epochs] if epochs else []), "--set", "train.tensorboard=false", *sets]
            shown = "horovodrun -np 2 -H localhost:2 --gloo " + " ".join(str(c) for c in command[:5] + command[7:])
            jobs.append((framework, name, out, [str(c) for c in hvdrun(*command)], shown))
    if parallel:
        procs = [subprocess.Popen(cmd, stdout=open(out.with_suffix(".log"), "w"), stderr=subprocess.STDOUT,
                                  env=job_env(), cwd=REPO) for _, _, out, cmd, _ in jobs]
        codes = [p.wait() for p in procs]
        if any(codes):
            raise RuntimeError(f"exit codes {codes}; logs in {raw}")
    else:
        for _, _, out, cmd, _ in jobs:
            launch(cmd, log)
    rows = []
    for framework, name, out, _, shown in jobs:
        history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        rows.append({"framework": framework, "setting": name, "overrides": ACCURACY_SETTINGS[name],
                     "val_accuracy": history[-1]["val_accuracy"], "epochs": len(history),
                     "epoch_time_sec": history[-1]["epoch_time_sec"], "command": shown.replace("--output " + str(out),
                                                                                              "--output runs/x")})
    return rows


def measure_ddp(raw: Path, log: Path, rank: int = 4, start: int = 10) -> list[str]:
    out = raw / "ddp.json"
    launch(hvdrun(sys.executable, HERE / "workers" / "compression_ddp.py", out, "--rank", rank, "--start", start), log)
    ranks = json.loads(out.read_text())["ranks"]
    mean = {k: sum(r[k] for r in ranks) / len(ranks) for k in ranks[0]}
    acc_h, acc_d = ranks[0]["acc_hvdtrain"], ranks[0]["acc_ddp"]
    return [f"| bytes/step/rank (rank {rank}, {start} warm-up steps) | {mean['wire_hvdtrain'] / 1e3:.1f} kB | "
            f"{mean['wire_ddp'] / 1e3:.1f} kB | **{mean['wire_hvdtrain'] / mean['wire_ddp']:.3f}** |",
            f"| MNIST val accuracy, 1 epoch | {100 * acc_h:.2f}% | {100 * acc_d:.2f}% | "
            f"**{100 * (acc_h - acc_d):+.2f} points** |",
            f"| epoch time (s, shared machine) | {ranks[0]['time_hvdtrain']:.0f} | {ranks[0]['time_ddp']:.0f} | |"]


def render(results: dict) -> str:
    lines = ["# Gradient compression and local SGD: every measurement (benchmarks/compression.py)", "",
             "Written by `python benchmarks/compression.py` from `benchmarks/compression_results.json`; what holds "
             "now: [BENCHMARKS.md, Gradient compression and local SGD]"
             "(../../BENCHMARKS.md#gradient-compression-and-local-sgd-benchmarkscompressionpy).", ""]
    if results.get("bytes"):
        b = results["bytes"]
        lines += [f"Measured by `{b['command']}` on {b['date']} ({b['machine']}). Bytes each rank wrote to "
                  "its Gloo sockets per training step (/proc/self/io `wchar`, mean of the 2 ranks, 6 steps after "
                  "2 warm-up steps), np=2, batch 32 of 1x32x32 per worker. Ratio = uncompressed bytes / "
                  "setting's bytes; target >= 10x for PowerSGD rank 4 and top-k 1%.", "",
                  "| framework | model | parameters | setting | bytes/step/rank | x fewer than uncompressed |",
                  "|---|---|---|---|---|---|"]
        base = {(r["framework"], r["model"]): r["wire_bytes_per_step"] for r in b["rows"] if r["setting"] == "none"}
        for r in b["rows"]:
            ratio = base[(r["framework"], r["model"])] / max(1.0, r["wire_bytes_per_step"])
            lines.append(f"| {r['framework']} | {r['model']} | {r['params']:,} | {r['setting']} | "
                         f"{r['wire_bytes_per_step'] / 1e6:.3f} MB | **{ratio:.1f}x** |")
        lines.append("")
    if results.get("accuracy"):
        a = results["accuracy"]
        lines += [f"Accuracy: the MNIST demo config (`hvdtrain recipe image-classification` defaults: 60,000 "
                  f"images, small_cnn, batch 64 per worker, SGD momentum 0.9, peak LR 0.05 x 2 workers, cosine; "
                  f"the recipe's default is 2 epochs, the table says how many ran), np=2 Gloo, one run per setting, "
                  f"validation on the 10,000 test images, measured on {a['date']}. Target: >= 98% with PowerSGD "
                  f"rank 4 and local SGD H=4.", "",
                  "| framework | setting | epochs | val accuracy | command |",
                  "|---|---|---|---|---|"]
        for r in a["rows"]:
            lines.append(f"| {r['framework']} | {r['setting']} | {r.get('epochs', '?')} | "
                         f"{100 * r['val_accuracy']:.2f}% | `{r['command']}` |")
        lines.append("")
    if results.get("link"):
        k = results["link"]
        lines += [f"Time to accuracy over a slow link (`{k['command']}`, {k['date']}): the two workers in two network "
                  "namespaces joined by a veth pair shaped with `tc` (token bucket, both directions); torch, "
                  f"small_cnn, `{' '.join(k['train'])}`. Target = the uncompressed run's final validation accuracy "
                  "at that rate; time = training time (sum of epoch times, evaluation included) until a setting "
                  "first reaches it; ratio = that time / the uncompressed run's (lower is better). A setting that "
                  "ends below the target has no time; the common target (the lowest final accuracy of the "
                  "settings at that rate, which all reach) compares them all.", "",
                  "| link | setting | accuracy per epoch | epoch times (s) | time to target (s) | ratio | "
                  "common target | time to it (s) | ratio |",
                  "|---|---|---|---|---|---|---|---|---|"]

        def seconds(value):
            return f"{value:.0f}" if value else "not reached"

        def ratio(value):
            return f"**{value:.2f}**" if value else "-"

        for r in k["rows"]:
            accs = ", ".join(f"{100 * a:.2f}%" for a in r["accuracies"])
            times = ", ".join(f"{t:.0f}" for t in r.get("epoch_times", []))
            common = f"{100 * r['common_target']:.2f}%" if r.get("common_target") else "-"
            lines.append(f"| {r['rate']} | {r['setting']} | {accs} | {times} | {seconds(r['time_to_target'])} | "
                         f"{ratio(r['ratio_to_uncompressed'])} | {common} | {seconds(r.get('time_to_common'))} | "
                         f"{ratio(r.get('ratio_common'))} |")
        lines.append("")
    if results.get("ddp"):
        d = results["ddp"]
        lines += [f"Against PyTorch's reference (`{d['command']}`, {d['date']}): hvdtrain's torch PowerSGD and DDP's "
                  "`powerSGD_hook`, same rank and warm-up, same processes; bytes per step as above (small_cnn, "
                  "batch 32); accuracy after one epoch of MNIST with the same model, optimizer and LR schedule. "
                  "Targets: bytes within 10%, accuracy within 0.3 points.", "",
                  "| | hvdtrain PowerSGD | DDP powerSGD_hook | ratio / difference |", "|---|---|---|---|"]
        for row in d["rows"]:
            lines.append(row)
        lines.append("")
    lines += results.get("notes", [])
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("bytes", "accuracy", "ddp", "report"))
    parser.add_argument("--frameworks", default="torch,tensorflow")
    parser.add_argument("--models", default="small_cnn,resnet18")
    parser.add_argument("--bytes-settings", default=",".join(BYTES_SETTINGS))
    parser.add_argument("--settings", default=",".join(ACCURACY_SETTINGS))
    parser.add_argument("--epochs", type=int, default=None, help="accuracy: epochs (default: the recipe's)")
    parser.add_argument("--parallel", action="store_true", help="accuracy: run the settings at the same time")
    parser.add_argument("--keep", default=None, help="keep raw job outputs and logs in this folder")
    args = parser.parse_args()
    results = json.loads(OUT.read_text()) if OUT.is_file() else {}
    frameworks = args.frameworks.split(",")
    if args.what != "report":
        raw = Path(args.keep or tempfile.mkdtemp(prefix="hvdtrain-compression-"))
        raw.mkdir(parents=True, exist_ok=True)
        log = raw / "jobs.log"
        cpu = machine()
        stamp = {"date": datetime.date.today().isoformat(),
                 "machine": f"{cpu['cores']}-core {cpu['cpu']}, torch {cpu['versions']['torch']}, "
                            f"TensorFlow {cpu['versions']['tensorflow']}, Horovod {cpu['versions']['horovod']}",
                 "command": f"python benchmarks/compression.py {args.what}"}
        if args.what == "bytes":
            rows = measure_bytes(raw, log, frameworks, args.models.split(","), args.bytes_settings.split(","))
            results["bytes"] = {**stamp, "rows": rows}
        elif args.what == "ddp":
            results["ddp"] = {**stamp, "rows": measure_ddp(raw, log)}
        else:
            rows = measure_accuracy(raw, log, frameworks, args.settings.split(","), args.epochs, args.parallel)
            old = [r for r in results.get("accuracy", {}).get("rows", [])
                   if (r["framework"], r["setting"]) not in {(x["framework"], x["setting"]) for x in rows}]
            results["accuracy"] = {**stamp, "rows": old + rows}
        OUT.write_text(json.dumps(results, indent=1))
        print(f"raw outputs and job log: {raw}")
    MARKDOWN.write_text(render(results))
    report.write(json.loads((HERE / "results.json").read_text()), REPO / "BENCHMARKS.md", HERE / "benchmarks.png")
    print(f"wrote {MARKDOWN} and BENCHMARKS.md")


if __name__ == "__main__":
    main()
