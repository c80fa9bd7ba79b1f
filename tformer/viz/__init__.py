"""Pictures drawn from the same data the model computes on (matplotlib, no display needed).

The library leaves matplotlib's backend to the caller: a notebook shows the figures inline, the command line
writes files with Agg (tformer.cli sets MPLBACKEND=Agg unless it is set)."""
