"""Pictures drawn from the same data the model computes on (matplotlib, no display needed)."""
