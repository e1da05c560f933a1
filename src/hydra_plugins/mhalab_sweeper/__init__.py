"""mhalab's grid sweeper (`hydra/sweeper=grid`, `mhalab.runs.sweeper`) where Hydra takes plugins from: Hydra
instantiates a plugin only from the `hydra_plugins` namespace package."""

from mhalab.runs.sweeper import GridSweeper as _GridSweeper


class GridSweeper(_GridSweeper):
    """`mhalab.runs.sweeper.GridSweeper`, under the name Hydra instantiates."""
