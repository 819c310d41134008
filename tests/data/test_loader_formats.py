"""The loader over every registered format (built-ins + a toy format registered here).

The store is written directly with each format's writer (no ingest needed), so every
format holds the same stream; batches must equal slices of that stream for every format,
worker count and start method.
"""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest
import torch

registry = pytest.importorskip("lmdata.store.registry")
from formats import FORMATS as ALL_FORMATS  # noqa: E402
from toyformat import ToyReader, ToyWriter, build_store  # noqa: E402

from lmdata.data import TokenDataset, make_loader  # noqa: E402
from lmdata.store.dataset import doc_positions  # noqa: E402
from lmdata.data.loader import EpochSampler  # noqa: E402
from lmdata.store import open_store  # noqa: E402

L, B, N_BATCHES = 32, 8, 6
# Registered only while this module's tests run, so other test modules that parametrize
# over the registered formats do not see the toy.
FORMATS = [*ALL_FORMATS, "toy"]


@pytest.fixture(scope="module", autouse=True)
def toy_format():
    registry.register_format("toy", ToyWriter, ToyReader)
    yield
    registry.unregister_format("toy")


@pytest.fixture(scope="module")
def store(tmp_path_factory, toy_format):
    path = tmp_path_factory.mktemp("store")
    stream = build_store(path, FORMATS)
    return open_store(path), stream


def expected(stream, n_batches=N_BATCHES, seed=1, start=0):
    """The contract, computed from the stream: window k = stream[k*L : k*L + L + 1]."""
    sampler = EpochSampler((len(stream) - 1) // L, B, seed=seed, rank=0, world_size=1,
                           sampling="sequential-shuffle", drop_last=True)
    out = []
    for b in range(start, start + n_batches):
        w = np.stack([stream[k * L:k * L + L + 1] for k in sampler.batch(0, b)])
        out.append((torch.from_numpy(w[:, :-1]), torch.from_numpy(w[:, 1:])))
    return out


def take(loader, n):
    return [b for _, b in zip(range(n), loader)]


def same(a, b):
    return len(a) == len(b) and all(all(torch.equal(x, y) for x, y in zip(p, q)) for p, q in zip(a, b))


def test_toy_format_is_registered(store):
    assert {"memmap", "parquet", "lance", "toy"} <= set(FORMATS)
    assert set(store[0].formats("train")) == set(FORMATS)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("workers", [0, 1])
def test_batches_equal_stream_slices(store, fmt, workers):
    st, stream = store
    ds = st.dataset("train", L, format=fmt)
    assert isinstance(ds, TokenDataset) and len(ds) == (len(stream) - 1) // L
    assert same(take(make_loader(ds, B, seed=1, num_workers=workers), N_BATCHES), expected(stream))


@pytest.mark.parametrize("start_method", ["fork", "forkserver", "spawn"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_start_methods(store, fmt, start_method):
    """A reader that is not fork-safe (Lance) gets forkserver workers when fork is asked for."""
    st, stream = store
    ds = st.dataset("train", L, format=fmt)
    ds.reader.windows(np.array([0]), 4)  # open files in the parent first: workers must not inherit them
    workers = 1 if start_method == "spawn" else 2  # a spawned worker imports torch afresh: seconds each
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*fork-safe")
        loader = make_loader(ds, B, seed=1, num_workers=workers, start_method=start_method)
        assert same(take(loader, N_BATCHES), expected(stream))


@pytest.mark.parametrize("fmt", FORMATS)
def test_resume_every_format(store, fmt):
    st, stream = store
    ds = st.dataset("train", L, format=fmt)
    first = make_loader(ds, B, seed=1, num_workers=2, start_method="forkserver")
    take(first, 3)
    fresh = make_loader(ds, B, seed=1, num_workers=2, start_method="forkserver")
    fresh.load_state_dict(first.state_dict())
    assert same(take(fresh, 4), expected(stream, 4, start=3))


@pytest.mark.parametrize("fmt", FORMATS)
def test_pickled_dataset_is_small(store, fmt):
    ds = store[0].dataset("train", L, format=fmt)
    ds[3]  # after use, open handles must not travel
    blob = pickle.dumps(ds)
    assert len(blob) < 8192, len(blob)
    assert np.array_equal(pickle.loads(blob)[3], ds[3])


@pytest.mark.parametrize("fmt", FORMATS)
def test_positions_from_the_store(store, fmt):
    st, stream = store
    ds = st.dataset("train", L, format=fmt, doc_info="positions")
    inputs, targets, pos = next(iter(make_loader(ds, B, seed=2)))
    assert torch.equal(pos, torch.from_numpy(doc_positions(inputs.numpy(), st.eot_id)))
    assert (inputs[pos == 0][1:] >= 0).all() and pos.shape == inputs.shape
