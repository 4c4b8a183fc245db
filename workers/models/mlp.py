"""A plain multi-layer perceptron for vector regression."""

from torch import nn


class MLPRegressor(nn.Sequential):
    def __init__(self, in_features: int, hidden: int, out_features: int, n_layers: int):
        layers: list[nn.Module] = []
        width = in_features
        for _ in range(n_layers):
            layers += [nn.Linear(width, hidden), nn.GELU()]
            width = hidden
        layers.append(nn.Linear(width, out_features))
        super().__init__(*layers)
