"""Export a scene as one local data file per client, to rehearse a real deployment with simulation data.

Command line (Hydra overrides, as for ``python -m data.scene``):
    python -m data.export dataset=fashion_mnist num_clients=100 seed=1 out_dir=DIR [export.true_labels=false]
builds or reuses DIR/scene.npz and writes DIR/clients/client_<k>.npz for every client k; a SuperNode
then gets ``--node-config 'data-path="DIR/clients/client_<k>.npz"'``. With ``export.true_labels=false``
each file holds exactly what a real node would have: no ground truth.
"""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import DictConfig

from conf import compose_config
from data.client_data import client_data
from data.errors import ConfigError
from data.local_file import check_in_memory, write_local_file
from data.scene import Scene, load_configured_dataset, prepare_scene, scene_spec
from data.sources.base import Dataset

CLIENTS_DIR = "clients"


def client_file_name(k: int, num_clients: int) -> str:
    """``client_007.npz`` for k=7 of 1000 clients: zero-padded so the files sort by client."""
    return f"client_{k:0{len(str(num_clients - 1))}d}.npz"


def export_clients(scene: Scene, dataset: Dataset, folder: str | Path, *, true_labels: bool = True) -> list[Path]:
    """Write every client's local data file into ``folder``; returns their paths in client order."""
    check_in_memory(dataset.train.images, dataset.name)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for k in range(scene.num_clients):
        data = client_data(scene, dataset, k)
        path = folder / client_file_name(k, scene.num_clients)
        write_local_file(
            path, images=data.images, labels=data.labels, classes=dataset.classes, mean=dataset.mean,
            std=dataset.std, dataset_name=dataset.name, partition_id=k,
            true_labels=data.true_labels if true_labels else None,
        )
        paths.append(path)
    return paths


def _true_labels_option(cfg: DictConfig) -> bool:
    value = cfg.export.true_labels
    if not isinstance(value, bool):
        raise ConfigError(f"export.true_labels={value!r} is invalid: allowed are true, false")
    return value


def main(argv: list[str]) -> int:
    """Build or reuse the scene for the overrides in ``argv`` and export its clients' files."""
    try:
        cfg = compose_config(argv)
        keep_truth = _true_labels_option(cfg)
        scene_spec(cfg)  # a bad scene override fails before the dataset is even read
        # Checked before prepare_scene, which may write the scene: a refusal leaves nothing behind.
        check_in_memory(load_configured_dataset(cfg).train.images, cfg.dataset.name)
        scene, dataset, _ = prepare_scene(cfg)
        paths = export_clients(scene, dataset, Path(cfg.out_dir) / CLIENTS_DIR, true_labels=keep_truth)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    sizes = scene.client_sizes()
    for path, size in zip(paths, sizes):
        print(f"wrote {path} ({size} samples)")
    truth = "with" if keep_truth else "without"
    print(f"total: {len(paths)} client files, {sizes.sum()} samples, {truth} true labels")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
