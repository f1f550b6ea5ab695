r"""Build (or reuse) and inspect a federated scene: partition + noisy labels + ground truth.

    python scene.py dataset=fashion_mnist num_clients=100 partition=iid noise=fedcorr \
        noise.rho=0.6 noise.tau=0.5 seed=1 out_dir=DIR [scene.plot=true]

writes DIR/scene.npz (and DIR/partition.png with scene.plot=true) and prints a per-client summary.
An existing DIR/scene.npz made from the same spec is reused; one made from another spec is an error.
Bad input is one ``error:`` line and exit status 2, before anything is written.
"""

from __future__ import annotations

import sys
from pathlib import Path

from common.errors import ConfigError
from common.validation import Flag
from data.scene import SCENE_FILE, prepare_scene
from data.summary import format_summary
from settings.command_line import one_job
from settings.scene import out_dir, scene_spec


def main(argv: list[str]) -> int:
    """Build or reuse the scene for the overrides in ``argv``; print its summary."""
    try:
        cfg = one_job(argv)
        plot = cfg.scene.plot
        Flag().check("scene.plot", plot)
        spec, folder = scene_spec(cfg), out_dir(cfg)
        scene, _, reused = prepare_scene(spec, folder)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    path = Path(folder) / SCENE_FILE
    print(format_summary(scene))
    print(f"{'reused' if reused else 'wrote'} {path}")
    if plot:
        from data.plot import plot_partition  # matplotlib is slow to import; only when asked

        png = path.with_name("partition.png")
        plot_partition(
            scene.client, scene.reference_labels(),
            scene.num_clients, int(scene.spec["dataset"]["num_classes"]), png,
            noise_rate=scene.true_noise_rate(), title=f"{scene.spec['dataset']['name']} {scene.spec['partition']}",
        )
        print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
