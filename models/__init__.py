"""Networks for federated noisy-label experiments and a name registry. Never imports Flower."""

from models.registry import MODEL_NAMES, ModelSpec, build_model, check_model_name, check_model_options

__all__ = ["MODEL_NAMES", "ModelSpec", "build_model", "check_model_name", "check_model_options"]
