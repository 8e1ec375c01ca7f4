"""Every differentiable op, one ``Function`` subclass each (forward + backward together)."""
from minidist.autograd.ops.arithmetic import Add, Div, Mul, Neg, Pow, Sub
from minidist.autograd.ops.cast import Cast
from minidist.autograd.ops.dropout import Dropout
from minidist.autograd.ops.indexing import Embedding, GetItem
from minidist.autograd.ops.layer_norm import LayerNorm
from minidist.autograd.ops.loss import CrossEntropy
from minidist.autograd.ops.matmul import Linear, MatMul
from minidist.autograd.ops.reduction import Max, Mean, Sum, Var
from minidist.autograd.ops.rms_norm import RMSNorm
from minidist.autograd.ops.select import MaskedFill, Where
from minidist.autograd.ops.shape import Concat, Permute, Reshape, Split, Stack
from minidist.autograd.ops.softmax import LogSoftmax, Softmax
from minidist.autograd.ops.unary import Exp, Gelu, Log, Relu, Sigmoid, Silu, Sqrt, Tanh

__all__ = ["Add", "Sub", "Mul", "Div", "Neg", "Pow", "Cast", "Dropout", "Embedding",
           "GetItem", "LayerNorm", "RMSNorm", "CrossEntropy", "Linear", "MatMul", "Max", "Mean",
           "Sum", "Var", "MaskedFill", "Where", "Concat", "Permute", "Reshape", "Split",
           "Stack", "LogSoftmax", "Softmax", "Exp", "Gelu", "Log", "Relu", "Sigmoid",
           "Silu", "Sqrt", "Tanh"]
