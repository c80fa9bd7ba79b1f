"""What every test shares: one thread per xdist worker, emulated reduced precision, the Hypothesis profile, the
longest files first, a seed per test, a private cache, and the offline corpora. Code the tests share lives in
tests/helpers/; fixtures that one folder uses, in that folder's conftest.py."""

import os
from pathlib import Path

import pytest
import torch
from hypothesis import settings

from helpers.corpora import SHARED_DATA
from helpers.models import TEST_DEVICE
from helpers.profiles import PROFILE

# Under pytest-xdist (the README's `-n auto`), each worker process computes on one thread, and so does every
# command it starts: the workers already fill the cores, and OpenMP threads that outnumber them spin against
# each other (on this 2-core machine two workers of two threads each took 8.1 min, of one thread 4.1 min).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

# Every bf16/fp16 promise is checked on every machine: where the CPU has no units for a reduced precision (or
# PyTorch's and oneDNN's dispatch is capped below them, as in tests/test_capped_isa.py), decoding in it is refused
# to users, and allowed here, emulated: slow, the same numbers (tformer.precision.EMULATION_SWITCH).
os.environ["TFORMER_EMULATED_PRECISION"] = "1"

# The Hypothesis profiles (tests/helpers/profiles.py registers them): HYPOTHESIS_PROFILE picks one.
settings.load_profile(PROFILE)


def pytest_configure(config):
    if TEST_DEVICE.type == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError(f"TFORMER_TEST_DEVICE={TEST_DEVICE} but PyTorch sees no CUDA device here")


# The longest test files first. Under `-n auto` (with --dist loadfile and --no-loadscope-reorder in pyproject.toml)
# pytest-xdist hands whole files to the workers in collection order; by default it sorts them by how many tests
# they hold, so the documentation build (one file of a few tests, minutes of work) started last and the other
# worker sat idle at the end. Longest first, the short files fill in around them. Ordered by the slowest tests of
# fresh-clone runs (`--durations`, benchmarks/RESULTS.md); the rest keep their order.
LONGEST_FIRST = ["test_docs.py", "test_readme.py", "test_faults.py", "test_train_modes.py", "test_capped_isa.py",
                 "test_export.py", "test_distributed.py", "test_speech.py", "test_documents.py", "test_install.py"]


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file's own order is kept


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The offline corpora (../shared/data, or $TFORMER_SHARED_DATA); tests skip, saying why, without them."""
    if not (SHARED_DATA / "multi30k" / "train.en.gz").exists():
        pytest.skip(f"real corpora not found in {SHARED_DATA}; set TFORMER_SHARED_DATA to the shared/data folder")
    return SHARED_DATA


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Encoded-data cache in a temporary folder, never the user's ~/.cache: for the whole session, so that
    module-scoped fixtures (a server whose explorer reads examples from the data) use it too."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TFORMER_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
        yield


