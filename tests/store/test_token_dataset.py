"""TokenDataset: the contract's windows, batched reads, doc info, pickling, errors."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from toyformat import EOT, FailingReader, NpyReader, write_tokens

from lmdata.store.dataset import TokenDataset, doc_ids, doc_positions
from lmdata.errors import LmdataError


@pytest.mark.parametrize("L", [1, 7, 64, 1000])
def test_windows_are_contract_slices(reader, tokens, L):
    ds = TokenDataset(reader, L)
    assert len(ds) == (len(tokens) - 1) // L
    for k in [0, 1, len(ds) // 2, len(ds) - 1]:
        assert ds[k].dtype == np.int64
        assert np.array_equal(ds[k], tokens[k * L:k * L + L + 1])
    idx = [len(ds) - 1, 0, 3 % len(ds), 3 % len(ds)]
    batch = ds.__getitems__(idx)
    assert batch.shape == (4, L + 1)
    assert all(np.array_equal(batch[i], ds[k]) for i, k in enumerate(idx))
    assert np.array_equal(ds[-1], ds[len(ds) - 1])
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_one_reader_call_per_batch(reader):
    calls = []

    class Counting(NpyReader):
        def windows(self, starts, length):
            calls.append(len(starts))
            return super().windows(starts, length)

    ds = TokenDataset(Counting(reader.path), 16)
    ds.__getitems__(list(range(32)))
    assert calls == [32]


def test_seq_len_longer_than_split(tmp_path):
    r = write_tokens(tmp_path / "t.npy", np.arange(10, dtype=np.uint16))
    assert len(TokenDataset(r, 9)) == 1
    with pytest.raises(LmdataError, match="seq_len 10 is too long"):
        TokenDataset(r, 10)
    with pytest.raises(LmdataError, match="eot_id"):
        TokenDataset(r, 2, doc_info="positions")
    with pytest.raises(LmdataError, match="doc_info"):
        TokenDataset(r, 2, doc_info="segments", eot_id=1)


def test_doc_info_positions_and_ids(reader, tokens):
    L = 50
    pos_ds = TokenDataset(reader, L, doc_info="positions", eot_id=EOT)
    id_ds = TokenDataset(reader, L, doc_info="doc_ids", eot_id=EOT)
    for k in range(0, len(pos_ds), 37):
        window, pos = pos_ds[k]
        _, ids = id_ds[k]
        assert pos.shape == ids.shape == (L,)
        # reference: walk the inputs
        p, d = 0, 0
        for i, t in enumerate(window[:L]):
            assert pos[i] == p and ids[i] == d
            p, d = (0, d + 1) if t == EOT else (p + 1, d)
    w, info = pos_ds.__getitems__([0, 1, 2])
    assert w.shape == (3, L + 1) and info.shape == (3, L)


def test_doc_helpers_edge_cases():
    x = np.array([[9, 9, 1, 2], [1, 2, 3, 4]])
    assert doc_positions(x, 9).tolist() == [[0, 0, 0, 1], [0, 1, 2, 3]]
    assert doc_ids(x, 9).tolist() == [[0, 1, 2, 2], [0, 0, 0, 0]]


def test_pickled_dataset_is_small(tmp_path):
    r = write_tokens(tmp_path / "big.npy", np.zeros(2_000_000, dtype=np.uint16))
    ds = TokenDataset(r, 1024)
    ds[5]  # opens the memmap in this process; it must not travel
    blob = pickle.dumps(ds)
    assert len(blob) < 2048
    again = pickle.loads(blob)
    assert np.array_equal(again[5], ds[5])


def test_reader_error_names_the_sample(tmp_path, tokens):
    path = tmp_path / "t.npy"
    np.save(path, tokens)
    L = 100
    ds = TokenDataset(FailingReader(path, bad=L * 17 + 5), L)
    with pytest.raises(LmdataError, match=r"sample 17 \(tokens \[1700, 1801\)\).*tokens-00000.bin"):
        ds.__getitems__([3, 4, 17, 20])


def test_short_reader_output_is_an_error(reader):
    class Short(NpyReader):
        def windows(self, starts, length):
            return super().windows(starts, length)[:, :-1]

    with pytest.raises(LmdataError, match="shape"):
        TokenDataset(Short(reader.path), 8)[0]
