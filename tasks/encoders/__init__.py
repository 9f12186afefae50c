"""Encoders: loading models (Hub names, packages, random ones), pooling and batched encoding, and
the CPU runtimes (ONNX Runtime, OpenVINO). Imports no stage."""
