"""Mixed precision for training and encoding: the dtype autocast runs in, and fp16's gradient scaler.

Weights and optimiser state stay float32 (master weights); only the forward pass and the loss run
in the lower precision. On CUDA, TF32 matmuls are allowed too: float32 work that is left (the
optimiser, the loss's softmax) runs on the tensor cores. Attention is PyTorch's SDPA, which
transformers picks by default for the encoders used here.
"""

from __future__ import annotations

import contextlib

import torch

from tasks.config.base import InputError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def cpu_has_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX): autocast in bf16 then trains a MiniLM about 2x
    and encodes 2.5x as fast as fp32 (benchmarks/cpu_precision.py); without them bf16 is emulated, and slower."""
    # torch.cpu's capability probes are private; a torch without them gets fp32, the safe answer
    probes = (getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))
    return any(probe() for probe in probes if probe is not None)


def autocast_dtype(precision: str, device: str | torch.device) -> torch.dtype:
    """`auto`: bf16 on a CUDA GPU that supports it or a CPU that multiplies it natively, else fp32."""
    kind = torch.device(device).type
    if kind == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if precision == "auto":
        native = torch.cuda.is_bf16_supported() if kind == "cuda" else kind == "cpu" and cpu_has_bf16()
        return torch.bfloat16 if native else torch.float32
    return DTYPES[precision]


def dtype_name(dtype: torch.dtype) -> str:
    """`bfloat16`, `float32`, ...: what a log line or a manifest says a precision resolved to."""
    return str(dtype).removeprefix("torch.")


def autocast(device: str | torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager:
    """The forward pass in `dtype`; nothing changes for float32."""
    return torch.autocast(torch.device(device).type, dtype=dtype, enabled=dtype != torch.float32)


class MixedPrecision:
    """A training step's precision: the forward and loss under autocast, then backward and step,
    through a gradient scaler for fp16 (whose small gradients would underflow to 0 without it)."""

    def __init__(self, precision: str, device: torch.device):
        self.device = device
        if precision == "fp16" and device.type != "cuda":  # encoding in fp16 runs on a CPU; training does not
            raise InputError("train.precision: fp16 training needs a CUDA GPU (its gradient scaler); "
                             "use bf16 on the CPU")
        self.dtype = autocast_dtype(precision, device)
        self.scaler = torch.amp.GradScaler(device.type) if self.dtype == torch.float16 else None

    def autocast(self) -> contextlib.AbstractContextManager:
        return autocast(self.device, self.dtype)

    def backward_and_step(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer,
                          max_grad_norm: float | None = None) -> float:
        """Backward, clip the gradients' total norm to `max_grad_norm` (None: no clipping), step;
        the norm before clipping is returned. Under the norm the gradients are multiplied by exactly 1."""
        self.backward(loss)
        return self.step(optimizer, max_grad_norm)

    def backward(self, loss: torch.Tensor) -> None:
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def step(self, optimizer: torch.optim.Optimizer, max_grad_norm: float | None = None) -> float:
        """`backward_and_step` after the backward pass."""
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if self.scaler is None:
            norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm or float("inf"))
            optimizer.step()
            return float(norm)
        self.scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
        norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm or float("inf"))
        self.scaler.step(optimizer)  # skipped when the scaled gradients overflowed
        self.scaler.update()
        return float(norm)

    def state_dict(self) -> dict | None:
        return self.scaler.state_dict() if self.scaler else None  # the scale grows and shrinks: resume needs it

    def load_state_dict(self, state: dict | None) -> None:
        if self.scaler and state:
            self.scaler.load_state_dict(state)
