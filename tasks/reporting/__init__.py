"""What a run shows people: the report's pictures and the MLflow log. Imports no stage."""
