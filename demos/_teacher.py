"""The small regression task of the data-parallel demos (18, 25): a 3-layer tanh MLP
learning y = tanh(x @ teacher) for a fixed random teacher."""


def tanh_mlp(width: int):
    """Linear -> tanh -> Linear -> tanh -> Linear, all width x width, seed 0."""
    from minidist.backend import Generator
    from minidist.nn import Linear, Sequential

    class Tanh(Sequential):
        def forward(self, x):
            return x.tanh()

    gen = Generator(0)
    return Sequential(Linear(width, width, generator=gen), Tanh(),
                      Linear(width, width, generator=gen), Tanh(),
                      Linear(width, width, generator=gen))


def teacher(width: int):
    """The fixed (width, width) teacher matrix, seed 1."""
    from minidist.backend import Generator
    return Generator(1).normal((width, width), std=width ** -0.5)
