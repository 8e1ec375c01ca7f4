"""Binary floating-point formats, described by their bits: ``FloatFormat``.

A format with ``E`` exponent bits, ``M`` mantissa bits and bias ``B`` stores a
sign ``s``, a biased exponent field ``e`` and a mantissa field ``m``:

    normal     (e >= 1):  (-1)^s * 2^(e - B) * (1 + m / 2^M)
    subnormal  (e == 0):  (-1)^s * 2^(1 - B) * (m / 2^M)

So the smallest normal exponent is ``emin = 1 - B``, and between two powers of
two 2^k and 2^(k+1) (k >= emin) the representable values are 2^(k-M) apart:
the *gap*. Below 2^emin the gap stays 2^(emin-M) (the subnormals).

Formats differ in what the top of the exponent range encodes (``special``):

- ``"ieee"``: the all-ones exponent is inf (m == 0) and NaN (m != 0), as in
  float16, bfloat16 and fp8 e5m2.  max = 2^emax * (2 - 2^-M), emax = 2^E - 2 - B.
- ``"fn"`` (finite + NaN): no inf; only all-ones exponent *and* mantissa is
  NaN, the other all-ones-exponent patterns are ordinary numbers. fp8 e4m3fn:
  max = 2^8 * 1.75 = 448 (0x7E), NaN = 0x7F / 0xFF.
- ``"fnuz"`` (finite, NaN, unsigned zero): no inf and no -0; the pattern of -0
  (sign bit alone, 0x80) is the one NaN. All other patterns are numbers.
- ``"finite"``: no inf and no NaN; every pattern is a number, and overflow
  always saturates to +-max (the OCP MX element types FP6 E2M3 / E3M2 and FP4
  E2M1: max 7.5, 28 and 6; FP4 E3M0, signed powers of two up to 16 and zero). These formats cannot hold a NaN: the emulation
  (``quantize``) lets a NaN input through as NaN, ``encode`` refuses it.
- ``"fnu"`` (finite, NaN, unsigned): exponent only (M = 0), no sign bit, no
  zero: field e is 2^(e - B) for e < 2^E - 1, the all-ones field is NaN. E8M0,
  the MX block scale: 2^-127 .. 2^127, NaN = 0xFF. Rounding is to the nearer
  power of two, a tie 1.5 * 2^e going up (as ml_dtypes does).

    >>> FP8_E4M3FN.max, FP8_E5M2.max, FP16.max, FP16.smallest_subnormal
    (448.0, 57344.0, 65504.0, 5.960464477539063e-08)
"""
from __future__ import annotations

from dataclasses import dataclass

SPECIALS = ("ieee", "fn", "fnuz", "finite", "fnu")


@dataclass(frozen=True)
class FloatFormat:
    name: str
    exp_bits: int               # E: width of the exponent field
    man_bits: int               # M: width of the stored mantissa (fraction) field
    bias: int | None = None     # B; None means the IEEE choice 2^(E-1) - 1
    special: str = "ieee"       # how inf / NaN are encoded: "ieee", "fn" or "fnuz"

    def __post_init__(self) -> None:
        if self.bias is None:
            object.__setattr__(self, "bias", 2 ** (self.exp_bits - 1) - 1)
        if self.special not in SPECIALS:
            raise ValueError(f"special must be one of {SPECIALS}, got {self.special!r}")
        if not (isinstance(self.exp_bits, int) and 2 <= self.exp_bits <= 11):
            raise ValueError(f"exp_bits must be an int in [2, 11], got {self.exp_bits!r}")
        if not (isinstance(self.man_bits, int) and 0 <= self.man_bits <= 52):
            raise ValueError(f"man_bits must be an int in [0, 52], got {self.man_bits!r}")
        if self.special == "fnu":
            if self.man_bits != 0:
                raise ValueError("an 'fnu' format is exponent only: man_bits must be 0")
        elif self.special in ("ieee", "fn") and self.man_bits == 0:
            # "ieee" needs a mantissa bit to tell NaN from inf, "fn" to have
            # anything but NaN in its top binade (use "finite", "fnu" or "fnuz")
            raise ValueError(f"an {self.special!r} format needs at least one mantissa bit")

    # -- the numbers that describe the range ------------------------------
    @property
    def signed(self) -> bool:
        """False for the exponent-only "fnu" formats (E8M0), which have no sign bit."""
        return self.special != "fnu"

    @property
    def bits(self) -> int:
        """Total width: sign (if any) + exponent + mantissa."""
        return int(self.signed) + self.exp_bits + self.man_bits

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number: 1 - B (-B for "fnu": no subnormals)."""
        return -self.bias if self.special == "fnu" else 1 - self.bias

    @property
    def emax(self) -> int:
        """Exponent of the largest finite binade."""
        top = 2 ** self.exp_bits - 1          # the all-ones field
        return top - 1 - self.bias if self.special in ("ieee", "fnu") else top - self.bias

    @property
    def max_mantissa(self) -> int:
        """Largest mantissa field allowed in the top binade (fn reserves all-ones for NaN)."""
        full = 2 ** self.man_bits - 1
        return full - 1 if self.special == "fn" else full

    @property
    def max(self) -> float:
        """Largest finite value: 2^(emax - M) * (2^M + max_mantissa)."""
        return float(2.0 ** (self.emax - self.man_bits) * (2 ** self.man_bits + self.max_mantissa))

    @property
    def smallest_normal(self) -> float:
        return float(2.0 ** self.emin)

    @property
    def smallest_subnormal(self) -> float:
        """The subnormal gap 2^(emin - M); every value is a multiple of it."""
        return float(2.0 ** (self.emin - self.man_bits))

    @property
    def has_inf(self) -> bool:
        return self.special == "ieee"

    @property
    def has_nan(self) -> bool:
        return self.special != "finite"

    @property
    def has_negative_zero(self) -> bool:
        return self.special not in ("fnuz", "fnu")

    @property
    def code_dtype(self) -> str:
        """The unsigned integer type that holds one encoded value."""
        return "uint8" if self.bits <= 8 else "uint16" if self.bits <= 16 else "uint32"

    def gap(self, exponent: int) -> float:
        """Distance between neighbours in the binade [2^exponent, 2^(exponent+1))."""
        return float(2.0 ** (max(exponent, self.emin) - self.man_bits))

    def fits_in(self, dtype_name: str) -> bool:
        """True if every value of this format is exactly a float32 / float64 value."""
        man, emin, emax = {"float32": (23, -126, 127), "float64": (52, -1022, 1023)}[dtype_name]
        return (self.man_bits <= man and self.emax <= emax
                and self.emin - self.man_bits >= emin - man)

    def __str__(self) -> str:
        return self.name


FP16 = FloatFormat("fp16", 5, 10)                                 # IEEE binary16
BF16 = FloatFormat("bf16", 8, 7)                                  # float32's range, 8 bits of precision
FP8_E4M3FN = FloatFormat("fp8_e4m3fn", 4, 3, special="fn")        # max 448, no inf
FP8_E5M2 = FloatFormat("fp8_e5m2", 5, 2)                          # IEEE-like, max 57344
FP8_E4M3FNUZ = FloatFormat("fp8_e4m3fnuz", 4, 3, bias=8, special="fnuz")   # max 240
FP8_E5M2FNUZ = FloatFormat("fp8_e5m2fnuz", 5, 2, bias=16, special="fnuz")  # max 57344
FP32 = FloatFormat("fp32", 8, 23)                                 # for completeness
# the OCP Microscaling (MX) element and scale types
FP6_E2M3FN = FloatFormat("fp6_e2m3fn", 2, 3, special="finite")   # max 7.5, no inf / NaN
FP6_E3M2FN = FloatFormat("fp6_e3m2fn", 3, 2, special="finite")   # max 28
FP4_E2M1FN = FloatFormat("fp4_e2m1fn", 2, 1, special="finite")   # 0 .5 1 1.5 2 3 4 6
E8M0FNU = FloatFormat("fp8_e8m0fnu", 8, 0, special="fnu")        # 2^-127 .. 2^127, NaN
# signed powers of two and zero: 0 .25 .5 1 2 4 8 16 (Streaming DiLoCo's 4-bit outer
# gradients); with no mantissa a tie 1.5 * 2^e rounds up to 2^(e+1), as E8M0's do
FP4_E3M0 = FloatFormat("fp4_e3m0", 3, 0, special="finite")

PRESETS = {f.name: f for f in (FP16, BF16, FP8_E4M3FN, FP8_E5M2, FP8_E4M3FNUZ,
                               FP8_E5M2FNUZ, FP32, FP6_E2M3FN, FP6_E3M2FN, FP4_E2M1FN,
                               E8M0FNU, FP4_E3M0)}
ALIASES = {"float16": "fp16", "half": "fp16", "bfloat16": "bf16", "e4m3": "fp8_e4m3fn",
           "e4m3fn": "fp8_e4m3fn", "e5m2": "fp8_e5m2", "float32": "fp32",
           "e4m3fnuz": "fp8_e4m3fnuz", "e5m2fnuz": "fp8_e5m2fnuz",
           "e2m3fn": "fp6_e2m3fn", "e3m2fn": "fp6_e3m2fn", "e2m1fn": "fp4_e2m1fn",
           "e8m0fnu": "fp8_e8m0fnu", "e8m0": "fp8_e8m0fnu", "fp4": "fp4_e2m1fn",
           "e3m0": "fp4_e3m0"}
# ml_dtypes' names: float8_e4m3fn, float4_e2m1fn, float8_e8m0fnu, ...
ALIASES.update({"float" + name[2:]: name for name in PRESETS if name.startswith("fp") and "_" in name})


def get_format(fmt: "FloatFormat | str") -> FloatFormat:
    """A ``FloatFormat`` from itself or a name: "fp16", "bf16", "e4m3fn", "e5m2", ..."""
    if isinstance(fmt, FloatFormat):
        return fmt
    if isinstance(fmt, str):
        key = ALIASES.get(fmt.lower(), fmt.lower())
        if key in PRESETS:
            return PRESETS[key]
    raise ValueError(f"unknown float format {fmt!r}; use a FloatFormat or one of "
                     f"{sorted(PRESETS) + sorted(ALIASES)}")
