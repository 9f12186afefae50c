"""Training maths: losses and training loops. Plain PyTorch; nothing here imports Prefect."""
