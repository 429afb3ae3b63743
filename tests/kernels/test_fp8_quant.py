"""kernels.fp8_quant: the Triton FP8 activation quantiser against its torch reference, per
token, per 1x128 tile (outer-dim-major scales, padded rows) and with a static scale.

On CPU (Triton interpreter, small shapes) the scales, shapes and layouts are equal, but the
interpreter's float8 conversion is not faithful (it truncates, and a round-up that should carry
into the exponent, 126.3 -> 128, gives 64), so only the sign and |q| <= |q_ref| are checked
there; CPU runs never use the kernel (they quantise with the reference). On the GPU (``gpu``
marker, real shapes) the scales and every normal code (|q| >= 2^-6) are equal bit for bit;
Triton's float32 -> e4m3 conversion rounds some subnormal ties the other way from torch
(measured on the H200: x/s = 3.5 * 2^-9 gave 3 * 2^-9, torch 4 * 2^-9, and 3.49999 * 2^-9 gave
4 * 2^-9), so subnormal codes may differ by one step, 2^-9 of the scale: about 5e-6 of a row's
absolute maximum."""

from __future__ import annotations

import pytest
import torch

from turnout.kernels.fp8_quant import quantize_fp8, quantize_fp8_ref

# Triton's interpreter runs the kernel on CPU tensors; compiled, it needs CUDA ones.
KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CASES = {
    "per-token": {},
    "tiles": {"group_size": 128, "pad_rows_to": 4},
    "static": {"static_scale": torch.tensor(0.05)},
    "per-token-padded": {"pad_rows_to": 4},
}


def _x(m: int, k: int, device: str, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(m + k)
    return (torch.randn(m, k, generator=gen) * torch.logspace(-3, 2, k)).to(dtype).to(device)


def _compare(x: torch.Tensor, kwargs: dict, *, exact: bool) -> None:
    kwargs = {k: (v.to(x.device) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    q, s = quantize_fp8(x, **kwargs)
    qr, sr = quantize_fp8_ref(x, **kwargs)
    assert q.shape == qr.shape and s.shape == sr.shape and s.stride() == sr.stride()
    assert torch.equal(s, sr)
    if exact:
        a, b = q.float(), qr.float()
        assert torch.equal(a[b.abs() >= 2**-6], b[b.abs() >= 2**-6])  # every normal code
        assert (a - b).abs().max() <= 2**-9  # subnormals: at most one step
    else:
        a, b = q.float(), qr.float()
        assert (a.abs() <= b.abs()).all() and (a * b >= 0).all()
    assert (q[x.shape[0] :].float() == 0).all()  # padding rows quantise zeros


@pytest.mark.parametrize("case", sorted(CASES))
def test_quantize_fp8_equals_its_reference(case: str) -> None:
    _compare(_x(5, 256, KERNEL_DEVICE, torch.float32), CASES[case], exact=False)


def test_bad_arguments_are_named() -> None:
    x = torch.randn(4, 256)
    with pytest.raises(ValueError, match="group_size 100 must divide K = 256"):
        quantize_fp8_ref(x, group_size=100)
    with pytest.raises(ValueError, match="static_scale must be float32"):
        quantize_fp8(x, static_scale=torch.tensor(1.0, dtype=torch.float64))
    with pytest.raises(ValueError, match="unit inner stride"):
        quantize_fp8(x.t())


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize(("m", "k"), [(1, 4096), (7, 1024), (300, 12288)])
def test_quantize_fp8_equals_its_reference_on_cuda(case: str, m: int, k: int) -> None:
    _compare(_x(m, k, "cuda", torch.bfloat16), CASES[case], exact=True)
