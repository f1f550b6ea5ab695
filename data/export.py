"""Export a scene as one local data file per client, to rehearse a real deployment with simulation data.

``export_clients`` writes ``<folder>/client_<k>.npz`` for every client k; a SuperNode then gets
``--node-config 'data-path="<folder>/client_<k>.npz"'``. Without true labels each file holds exactly
what a real node would have. The command line is ``export.py`` at the repository root.
"""

from __future__ import annotations

from pathlib import Path

from data.client_data import client_data
from data.local_file import check_in_memory, write_local_file
from data.scene import Scene
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
