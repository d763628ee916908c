"""Fine-tuning a pretrained ResNet-18 against training it from scratch, on the real-photo tree,
both frameworks, 2 ranks under horovodrun: validation accuracy after 1 and 3 epochs.

No pretrained vision checkpoint can be downloaded here, so the backbone is pretrained here, on
other images: a ResNet-18 (64 pixels, torchvision's 7x7 stem) trained by hvdtrain's own recipe
(torch, 2 ranks) to tell apart crops of 12 scikit-image pictures that are NOT among the 4 classes
of the fine-tuning tree (motorcycle, Hubble deep field, retina, IHC stain, brick, grass, gravel,
camera man, coins, horse, page, moon), then written in torchvision's layout (``conv1.weight``,
``layer1.0.bn1.*``, ..., ``fc.*``; its 12-class ``fc`` is re-initialised for the 4 classes).

Then, per framework, three runs on the 4-class tree (astronaut, cat, coffee, rocket: the first
four of benchmarks/photo_tree.PHOTOS, as tests/distributed/test_image_photos.py uses):

* ``scratch``: random initialisation;
* ``pretrained``: ``model.pretrained=<the file>``, everything trains from epoch 1;
* ``pretrained+freeze``: also ``model.freeze_backbone_epochs=1`` and ``optim.backbone_lr_factor=0.1``.

    .venv/bin/python benchmarks/finetune.py /tmp/finetune-bench --json benchmarks/finetune.json
    # more seeds with the same backbone:
    .venv/bin/python benchmarks/finetune.py /tmp/finetune-bench --seeds 1,2 \
        --weights /tmp/finetune-bench/resnet18-other-photos.pth --json benchmarks/finetune_seeds.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import photo_tree  # noqa: E402

PRETRAIN_PHOTOS = ("motorcycle_left.png", "hubble_deep_field.jpg", "retina.jpg", "ihc.png", "brick.png", "grass.png",
                   "gravel.png", "camera.png", "coins.png", "horse.png", "page.png", "moon.png")
BIN = Path(sys.executable).parent
COMMON = ["--model", "resnet18", "--batch-size", "32", "--set", "image.size=64", "--set", "image.workers=1",
          "--set", "train.log_every=0"]
VARIANTS = {"scratch": [], "pretrained": ["model.pretrained={weights}"],
            "pretrained+freeze": ["model.pretrained={weights}", "model.freeze_backbone_epochs=1",
                                  "optim.backbone_lr_factor=0.1"]}


def _env(cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2",
               HVDTRAIN_DATA_CACHE=str(cache))
    return env


def train(framework: str, data: Path, output: Path, epochs: int, lr: float, overrides: list[str], cache: Path,
          seed: int) -> tuple[list[dict], float]:
    """One 2-rank run of the image recipe; its metrics.jsonl rows and wall time."""
    cmd = [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", str(BIN / "hvdtrain"), "recipe",
           "image-classification", "--framework", framework, "--data", str(data), "--output", str(output),
           "--epochs", str(epochs), "--lr", str(lr), *COMMON, "--set", f"train.seed={seed}"]
    for item in overrides:
        cmd += ["--set", item]
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(cache), cwd=REPO)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return rows, wall


def pretrain(root: Path, epochs: int, cache: Path) -> tuple[Path, dict]:
    """The backbone: hvdtrain's torch ResNet-18 trained on the 12 other pictures, saved in
    torchvision's layout."""
    from safetensors.torch import load_file

    from hvdtrain_recipes.image_classification import torch_models
    from hvdtrain_recipes.image_classification.torchvision_weights import save_torchvision_resnet

    data = photo_tree.make_tree(root / "pretrain-photos", classes=len(PRETRAIN_PHOTOS), train=100, val=10,
                                size=(200, 150), seed=1, photos=PRETRAIN_PHOTOS)
    rows, wall = train("torch", data, root / "pretrain-run", epochs, 0.1, [], cache, 0)
    model = torch_models.build_model("resnet18", 3, (64, 64), len(PRETRAIN_PHOTOS))
    model.load_state_dict(load_file(str(root / "pretrain-run" / "model" / "model.safetensors")))
    weights = root / "resnet18-other-photos.pth"
    save_torchvision_resnet(model, weights)
    return weights, {"epochs": epochs, "classes": len(PRETRAIN_PHOTOS), "train_images": 100 * len(PRETRAIN_PHOTOS),
                     "val_accuracy": rows[-1]["val_accuracy"], "wall_s": round(wall, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--pretrain-epochs", type=int, default=6)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seeds", default="0", help="comma-separated train.seed values (one set of runs each)")
    parser.add_argument("--weights", type=Path, help="an earlier run's resnet18-other-photos.pth: skip pretraining")
    parser.add_argument("--frameworks", default="torch,tensorflow")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    root, cache = args.root, args.root / "cache"
    root.mkdir(parents=True, exist_ok=True)
    if args.weights:
        weights, pre = args.weights, {"weights": str(args.weights)}
    else:
        weights, pre = pretrain(root, args.pretrain_epochs, cache)
        print(f"pretrained on {pre['classes']} other pictures: val_accuracy {pre['val_accuracy']:.3f} "
              f"({pre['wall_s']} s)", flush=True)
    data = photo_tree.make_tree(root / "photos", classes=4, train=60, val=25, size=(200, 150))
    results = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for framework in args.frameworks.split(","):
            for variant, overrides in VARIANTS.items():
                out = root / f"{framework}-{variant}-{seed}"
                rows, wall = train(framework, data, out, args.epochs, args.lr,
                                   [o.format(weights=weights) for o in overrides], cache, seed)
                acc = [r["val_accuracy"] for r in rows]
                results.append({"framework": framework, "variant": variant, "seed": seed, "val_accuracy": acc,
                                "wall_s": round(wall, 1)})
                print(f"{framework:10s} {variant:18s} seed {seed}: val_accuracy by epoch "
                      + " ".join(f"{a:.3f}" for a in acc) + f" ({wall:.0f} s)", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"pretrain": pre, "runs": results, "epochs": args.epochs, "lr": args.lr},
                                        indent=1) + "\n")


if __name__ == "__main__":
    main()
