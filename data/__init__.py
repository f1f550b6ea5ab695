"""Datasets, federated partitions, label-noise models and reproducible scenes.

Imports only ``common`` of the project: never Flower, never the Hydra configuration. Callers hand
in typed specs (``data.scene.SceneSpec``); the command lines that compose them live above.
"""
