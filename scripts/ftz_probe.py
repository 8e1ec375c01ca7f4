"""Which float32 operations flush subnormals to zero on this backend (CuPy compiles with -ftz=true).

Prints one line per operation: the op, whether its result equals NumPy's bit for bit.
"""
import numpy as np
import cupy as cp

sub = np.array([1e-45, -1e-45, 5.9e-39, -5.9e-39, 1.1754942e-38, 0.0, 1.0, -2.5e-40], np.float32)
d = cp.asarray(sub)
tiny = np.float32(2.0 ** -126)


def same(name, got, want):
    got = cp.asnumpy(got)
    want = np.asarray(want)
    if got.dtype != want.dtype:
        print(f"{name:34s} dtype {got.dtype} vs {want.dtype}")
        return
    eq = got.view(f"u{got.dtype.itemsize}") == want.view(f"u{want.dtype.itemsize}") \
        if got.dtype.kind == "f" else got == want
    print(f"{name:34s} {'same' if eq.all() else 'DIFFERS'}  got {got.tolist()}  want {want.tolist()}")


same("copy (asarray/asnumpy)", d, sub)
same("astype float64", d.astype(cp.float64), sub.astype(np.float64))
same("astype float16", d.astype(cp.float16), sub.astype(np.float16))
same("view uint32", d.view(cp.uint32), sub.view(np.uint32))
same("abs", cp.abs(d), np.abs(sub))
same("negative", -d, -sub)
same("copysign(x, -1)", cp.copysign(d, -1), np.copysign(sub, np.float32(-1)))
same("x * 1", d * cp.float32(1), sub * np.float32(1))
same("x + 0", d + cp.float32(0), sub + np.float32(0))
same("x * 2", d * cp.float32(2), sub * np.float32(2))
same("tiny * 0.5 (subnormal out)", cp.asarray(tiny) * cp.float32(0.5), tiny * np.float32(0.5))
same("x == 0", d == 0, sub == 0)
same("x < 0", d < 0, sub < 0)
same("x > 0", d > 0, sub > 0)
same("isfinite", cp.isfinite(d), np.isfinite(sub))
same("signbit", cp.signbit(d), np.signbit(sub))
same("where(True, x, 0)", cp.where(d == d, d, cp.float32(0)), np.where(sub == sub, sub, np.float32(0)))
same("maximum(x, 0)", cp.maximum(d, cp.float32(0)), np.maximum(sub, np.float32(0)))
same("frexp mantissa", cp.frexp(d)[0], np.frexp(sub)[0])
same("frexp exponent", cp.frexp(d)[1], np.frexp(sub)[1])
same("ldexp(1, -130) float32", cp.ldexp(cp.ones(1, cp.float32), cp.asarray([-130], cp.int32)),
     np.ldexp(np.ones(1, np.float32), np.array([-130], np.int32)))
same("float64 -> float32 (subnormal)", d.astype(cp.float64).astype(cp.float32), sub)
same("float64 2^-130 -> float32", cp.asarray([2.0 ** -130]).astype(cp.float32),
     np.asarray([2.0 ** -130]).astype(np.float32))
same("uint32 bits -> view float32", cp.asarray(sub.view(np.uint32)).view(cp.float32), sub)
same("sum", d.sum(), sub.sum())
same("max", d.max(), sub.max())
same("sort", cp.sort(d), np.sort(sub))
same("rint(x * 2^149) (f32)", cp.rint(d * cp.float32(2.0 ** 126) * cp.float32(2.0 ** 23)),
     np.rint(sub * np.float32(2.0 ** 126) * np.float32(2.0 ** 23)))
same("float64 x * 2^149", d.astype(cp.float64) * 2.0 ** 149, sub.astype(np.float64) * 2.0 ** 149)
same("reciprocal of 3.3e38", cp.float32(1) / cp.asarray([3.3e38], cp.float32),
     np.float32(1) / np.asarray([3.3e38], np.float32))
same("float16 -> float32", cp.asarray(np.array([6e-8], np.float16)).astype(cp.float32),
     np.array([6e-8], np.float16).astype(np.float32))
