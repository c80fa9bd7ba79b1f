"""Pictures are drawn from the kernel's own edge lists: what is drawn is what is computed."""

import torch
from matplotlib.collections import LineCollection

from tformer.cli import main
from tformer.structures import Structure
from tformer.viz.structures import plot_pattern, plot_seed_graphs


def test_seed_graph_picture_draws_every_edge_once():
    fig = plot_seed_graphs(list("abcd"), list("xyz"))
    lines = [c for ax in fig.axes for c in ax.collections if isinstance(c, LineCollection)]
    assert [len(c.get_segments()) for c in lines] == [4 * 4, 3 * 4 // 2, 4 * 3]  # complete, causal, bipartite
    causal = lines[1].get_segments()
    # in the causal graph no line runs from a later key (top row) to an earlier query (bottom row)
    assert all(seg[0][0] <= seg[1][0] for seg in causal)


def test_pattern_picture_is_the_graph_mask(tmp_path):
    fig, graph = plot_pattern([5, 3], Structure(window=1), path=tmp_path / "p.png")
    image = torch.tensor(fig.axes[0].get_images()[0].get_array().data)
    assert torch.equal(image.bool(), graph.dense())
    assert (tmp_path / "p.png").stat().st_size > 0


def test_graph_command_writes_pictures(tmp_path, capsys):
    assert main(["graph", "--out", str(tmp_path / "seed.png")]) == 0
    assert main(["graph", "--pattern", "--window", "2", "--lengths", "6", "4", "--causal",
                 "--out", str(tmp_path / "w.svg")]) == 0
    out = capsys.readouterr().out
    assert "edges: 36 encoder, 15 decoder, 30 cross" in out
    assert f"{Structure(window=2).edges(6, True).shape[0] + Structure(window=2).edges(4, True).shape[0]} edges" in out
    assert (tmp_path / "seed.png").exists() and (tmp_path / "w.svg").exists()
    assert main(["graph", "--pattern", "--lengths", "0", "--out", str(tmp_path / "x.png")]) == 2
