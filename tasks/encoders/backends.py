"""CPU runtimes for encoding: ONNX Runtime and OpenVINO next to torch.

An encoder is exported once to ONNX by torch's exporter (eager attention, the last hidden state as
its one output), in the layout sentence-transformers reads with `backend="onnx"` / `"openvino"`
(`onnx/model.onnx`, `openvino/openvino_model.xml`). OpenVINO converts that ONNX file. Both
runtimes then compute what torch computes, to float32 rounding: evaluation with them changes no
score beyond the fourth decimal (benchmarks/eval_encode.py checks it), only the time.

int8 (`quantized`): ONNX Runtime's dynamic quantisation (int8 weights, activations quantised per
batch) and OpenVINO's data-free int8 weight compression (NNCF). Neither needs calibration data;
both change the scores a little, which `embforge export` measures and writes in the model card.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModel, AutoTokenizer

# Where sentence-transformers looks for each backend's model inside a model folder.
FILES = {"onnx": "onnx/model.onnx", "openvino": "openvino/openvino_model.xml"}
QUANTIZED_FILES = {"onnx": "onnx/model_qint8.onnx", "openvino": "openvino/openvino_model_qint8.xml"}
# OpenVINO runs inference in the precision asked; ONNX Runtime on a CPU is float32 only.
OPENVINO_PRECISIONS = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}
ONNX_OPSET = 17


class LastHiddenState(torch.nn.Module):
    """The encoder with positional inputs and one output: what the exported graph computes."""

    def __init__(self, encoder: torch.nn.Module, input_names: list[str]):
        super().__init__()
        self.encoder, self.input_names = encoder, input_names

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.encoder(**dict(zip(self.input_names, inputs))).last_hidden_state  # (batch, tokens, dim)


def export_onnx(model_folder: str, target: Path) -> Path:
    """The encoder at `model_folder` (a transformers or sentence-transformers folder) as ONNX."""
    tokenizer = AutoTokenizer.from_pretrained(model_folder)
    # Eager attention: the SDPA path is traced with the example's padding and then ignores the mask.
    encoder = AutoModel.from_pretrained(model_folder, dtype=torch.float32, attn_implementation="eager").eval()
    example = tokenizer(["an example", "a longer example text"], padding=True, return_tensors="pt")
    names = [n for n in tokenizer.model_input_names if n in example]
    dynamic = {"batch": 0, "tokens": 1}
    target.parent.mkdir(parents=True, exist_ok=True)
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on shapes, which become the dynamic axes
        torch.onnx.export(LastHiddenState(encoder, names), tuple(example[n] for n in names), str(target),
                          input_names=names, output_names=["last_hidden_state"], opset_version=ONNX_OPSET,
                          dynamic_axes={n: {v: k for k, v in dynamic.items()} for n in [*names, "last_hidden_state"]},
                          dynamo=False)
    return target


def quantize_onnx(source: Path, target: Path) -> Path:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8)
    return target


def export_openvino(onnx_file: Path, target: Path, quantized: bool = False) -> Path:
    import openvino as ov

    model = ov.convert_model(str(onnx_file))
    if quantized:
        import nncf

        model = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_ASYM)
    target.parent.mkdir(parents=True, exist_ok=True)
    ov.save_model(model, str(target), compress_to_fp16=False)
    return target


def backend_file(model_folder: str, backend: str, into: Path, quantized: bool = False) -> Path:
    """The backend's model file inside `model_folder` if it has one (an exported folder), else
    exported into `into` (the same layout)."""
    name = (QUANTIZED_FILES if quantized else FILES)[backend]
    if (Path(model_folder) / name).is_file():
        return Path(model_folder) / name
    onnx_file = Path(model_folder) / FILES["onnx"]
    if not onnx_file.is_file():
        onnx_file = export_onnx(model_folder, into / FILES["onnx"])
    if backend == "onnx":
        return quantize_onnx(onnx_file, into / name) if quantized else onnx_file
    return export_openvino(onnx_file, into / name, quantized)


class Runtime:
    """An exported encoder run by ONNX Runtime or OpenVINO on the CPU, with torch's thread count:
    tokenised numpy inputs → last hidden state (batch, tokens, dim) as float32."""

    def __init__(self, model_file: Path, backend: str, dtype: torch.dtype):
        threads = torch.get_num_threads()  # what the stage was given (run.workers, Dask's workers)
        self.dtype = torch.float32 if backend == "onnx" else dtype  # what it computes in
        if backend == "onnx":  # float32 (EvaluateConfig refuses another dtype for it)
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            session = ort.InferenceSession(str(model_file), options, providers=["CPUExecutionProvider"])
            self.input_names = [i.name for i in session.get_inputs()]
            self._run = lambda inputs: session.run(None, inputs)[0]
        else:
            import openvino as ov

            core = ov.Core()
            compiled = core.compile_model(core.read_model(str(model_file)), "CPU", {
                "PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads,
                "INFERENCE_PRECISION_HINT": OPENVINO_PRECISIONS[dtype]})
            self.input_names = [i.get_any_name() for i in compiled.inputs]
            self._run = lambda inputs: compiled(inputs)[0]

    def __call__(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        return np.asarray(self._run({n: batch[n].astype(np.int64) for n in self.input_names}), dtype=np.float32)
