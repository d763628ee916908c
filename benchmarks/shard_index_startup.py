"""Start-up at ImageNet scale from WebDataset shards: writes 1,281,167 tiny real JPEG samples in 1,024 tars
(once), then times the cold index build and the cached load, each in a fresh process.

    python benchmarks/shard_index_startup.py /tmp/wds     (the cache goes to /tmp/cache)
"""
import io, os, subprocess, sys, tarfile, time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
import numpy as np
from PIL import Image

ROOT = Path(sys.argv[1]); N = 1_281_167; SHARDS = 1024
def jpeg():
    b = io.BytesIO(); Image.fromarray(np.full((8, 8, 3), 120, np.uint8)).save(b, format="JPEG"); return b.getvalue()
def write(k):
    data = jpeg(); start, stop = k * N // SHARDS, (k + 1) * N // SHARDS
    path = ROOT / f"train-{k:06d}.tar"
    if path.exists(): return
    with tarfile.open(path.with_suffix(".tmp"), "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(start, stop):
            for ext, payload in (("jpg", data), ("cls", str(i % 1000).encode())):
                info = tarfile.TarInfo(f"n{i % 1000:08d}_{i}.{ext}"); info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    os.rename(path.with_suffix(".tmp"), path)
if __name__ == "__main__":
    ROOT.mkdir(parents=True, exist_ok=True)
    t = time.time()
    with ProcessPoolExecutor(2) as ex: list(ex.map(write, range(SHARDS), chunksize=8))
    print(f"wrote shards in {time.time() - t:.0f}s", flush=True)
    code = ("import time, sys; t=time.perf_counter(); from hvdtrain.data.shards import load_shard_index; "
            "from hvdtrain.data import braces; s=braces.resolve(sys.argv[1]); "
            "i=load_shard_index(s, 'webdataset'); print(f'{len(i):,} samples in {len(s)} shards: built={i.built} "
            "{time.perf_counter()-t:.1f}s index {i.nbytes/1e6:.1f} MB ({i.nbytes/len(i):.1f} B/sample)')")
    env = {**os.environ, "HVDTRAIN_DATA_CACHE": str(ROOT.parent / "cache")}
    for _ in range(2):
        subprocess.run([sys.executable, "-c", code, str(ROOT / "train-{000000..001023}.tar")], env=env, check=True)
