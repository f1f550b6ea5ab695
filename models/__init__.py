"""Networks for federated noisy-label experiments and a name registry. Never imports Flower."""

from models.registry import MODEL_NAMES, build_model, check_model_name

__all__ = ["MODEL_NAMES", "build_model", "check_model_name"]
