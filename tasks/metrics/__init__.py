"""Evaluation maths: kNN accuracy, STS correlation. Plain NumPy/PyTorch; no Prefect."""
