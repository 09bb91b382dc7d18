"""Low-precision formats: element types, the format table, reference codecs, packing."""

from infergen.formats.codec import dequantize, quantize, sqnr_db
from infergen.formats.elements import ELEMENT_TYPES, Minifloat
from infergen.formats.qtensor import QuantizedTensor
from infergen.formats.spec import FORMATS, PER_CHANNEL, PER_TENSOR, FormatSpec

__all__ = [
    "ELEMENT_TYPES",
    "FORMATS",
    "PER_CHANNEL",
    "PER_TENSOR",
    "FormatSpec",
    "Minifloat",
    "QuantizedTensor",
    "dequantize",
    "quantize",
    "sqnr_db",
]
