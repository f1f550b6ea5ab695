"""Export a scene as one local data file per client, to rehearse a real deployment with simulation data.

    python export.py dataset=fashion_mnist num_clients=100 seed=1 out_dir=DIR [export.true_labels=false]

builds or reuses DIR/scene.npz and writes DIR/clients/client_<k>.npz for every client k; a SuperNode
then gets ``--node-config 'data-path="DIR/clients/client_<k>.npz"'``. With ``export.true_labels=false``
each file holds exactly what a real node would have: no ground truth. Bad input is one ``error:``
line and exit status 2, before anything is written.
"""

from __future__ import annotations

import sys
from pathlib import Path

from common.errors import ConfigError
from common.text import counted
from common.validation import Flag
from data.export import CLIENTS_DIR, export_clients
from data.local_file import check_in_memory
from data.scene import prepare_scene
from settings.command_line import one_job
from settings.scene import out_dir, scene_spec


def main(argv: list[str]) -> int:
    """Build or reuse the scene for the overrides in ``argv`` and export its clients' files."""
    try:
        cfg = one_job(argv)
        keep_truth = cfg.export.true_labels
        Flag().check("export.true_labels", keep_truth)
        spec, folder = scene_spec(cfg), out_dir(cfg)  # a bad scene override fails before the data is read
        # Checked before prepare_scene, which may write the scene: a refusal leaves nothing behind.
        check_in_memory(spec.dataset.load().train.images, spec.dataset.name)
        scene, dataset, _ = prepare_scene(spec, folder)
        paths = export_clients(scene, dataset, Path(folder) / CLIENTS_DIR, true_labels=keep_truth)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    sizes = scene.client_sizes()
    for path, size in zip(paths, sizes):
        print(f"wrote {path} ({size} samples)")
    truth = "with" if keep_truth else "without"
    print(f"total: {counted(len(paths), 'client file')}, {counted(int(sizes.sum()), 'sample')}, {truth} true labels")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
