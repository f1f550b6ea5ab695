"""The ML core both apps share: plain PyTorch and NumPy, no Flower.

Model and transform building from typed specs, device choice, the local training loop, evaluation,
and the estimators methods run on predictions (LID, FedCorr's relabelling). Flower's app templates
call this layer ``task``.
"""
