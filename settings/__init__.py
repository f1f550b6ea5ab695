"""The edge: the Hydra configuration composed from ``conf/`` and checked once into frozen settings.

Layers below (``task``, ``data``, ``models``) never see a ``DictConfig``: they take the dataclasses
built here. Strategy settings are built one layer up, by ``server.config``, from the strategy registry.
"""
