"""Data-layer figures: build a 100-client Fashion-MNIST scene, load one client's slice, peak memory.

    .venv/bin/python bench/data.py [--clients 100] [--repeats 5]

Targets: scene build < 2 s, one client's slice < 100 ms. A client load runs in a fresh process
(as a simulated or deployed client would), with the decoded dataset cache already written; it
is timed from opening the scene file to holding its images and labels (imports not counted).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data.client_data import client_data  # noqa: E402
from data.scene import SCENE_FILE, Scene, build_scene, dataset_fingerprint  # noqa: E402
from data.sources import load_dataset  # noqa: E402
from settings.compose import compose_config  # noqa: E402
from settings.scene import out_dir, scene_spec  # noqa: E402


def peak_rss_mib() -> float:
    """The peak resident memory of the current process so far, in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def load_one_client(cache_dir: str, scene_path: str, k: int, queue: mp.Queue) -> None:
    """Load client ``k``'s slice as a fresh client process would; puts (seconds, samples, peak MiB) on ``queue``."""
    start = time.perf_counter()
    scene = Scene.load(scene_path)
    dataset = load_dataset("fashion_mnist", cache_dir=cache_dir)
    local = client_data(scene, dataset, k)
    elapsed = time.perf_counter() - start
    queue.put((elapsed, len(local), peak_rss_mib()))


def main() -> None:
    """Time the scene builds and the client loads, and print the figures beside their targets."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        overrides = ["dataset=fashion_mnist", f"num_clients={args.clients}", "partition=iid", "noise=fedcorr",
                     f"dataset.cache_dir={tmp}/cache", f"out_dir={tmp}/scene"]
        cfg = compose_config(overrides)
        spec, folder = scene_spec(cfg), out_dir(cfg)

        start = time.perf_counter()
        spec.dataset.load()
        cold = time.perf_counter() - start

        builds = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            dataset = spec.dataset.load()
            scene = build_scene(spec.stored(dataset_fingerprint(dataset)), dataset)
            Path(folder).mkdir(parents=True, exist_ok=True)
            scene.save(Path(folder) / SCENE_FILE)
            builds.append(time.perf_counter() - start)
        build_peak = peak_rss_mib()

        ctx = mp.get_context("spawn")
        loads = []
        for k in range(args.repeats):
            queue = ctx.Queue()
            child = ctx.Process(target=load_one_client, args=(f"{tmp}/cache", f"{folder}/{SCENE_FILE}", k, queue))
            child.start()
            loads.append(queue.get(timeout=120))
            child.join()

    print(f"Fashion-MNIST, {args.clients} clients, IID, FedCorr noise (rho=0.6, tau=0.5); median of {args.repeats}")
    print(f"  first load (decode idx.gz, write cache):     {cold * 1000:8.1f} ms")
    print(f"  scene build (cached data + partition + noise + save): {statistics.median(builds) * 1000:8.1f} ms"
          f"   target < 2000 ms")
    print(f"  one client's slice in a fresh process ({loads[0][1]} samples): "
          f"{statistics.median(t for t, _, _ in loads) * 1000:8.1f} ms   target < 100 ms")
    print(f"  peak RSS: builder {build_peak:.0f} MiB, client {max(m for _, _, m in loads):.0f} MiB")


if __name__ == "__main__":
    main()
