"""Readers, the embedded corpus, `prepare`, prepared datasets, the sequence loader and corpus statistics."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import meshlm.data.prepare as prep
from meshlm.data import (
    ReadStats,
    SequenceLoader,
    TokenDataset,
    default_cache_dir,
    embedded_corpus_size,
    embedded_documents,
    ensure_embedded_dataset,
    iter_documents,
    prepare_dataset,
    split_position,
    token_dtype,
    unigram_entropy,
)
from meshlm.errors import DataError
from meshlm.fileio import sha256_file
from meshlm.tokenizer import MeshTokenizer

VOCAB = 512
SHARD_TOKENS = 20_000  # small, so that the train split spans several shards


@pytest.fixture(scope="module")
def docs() -> list[str]:
    return embedded_documents()[:400]


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory, docs) -> Path:
    out = tmp_path_factory.mktemp("prepared") / "ds"
    prepare_dataset(None, out, documents=docs, vocab_size=VOCAB, num_workers=1, shard_tokens=SHARD_TOKENS)
    return out


@pytest.fixture(scope="module")
def ds(dataset_dir) -> TokenDataset:
    return TokenDataset(dataset_dir)


def _write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


# --- readers ------------------------------------------------------------------------------------------------------
def test_text_files_are_one_document_each_and_exact(tmp_path):
    a = _write(tmp_path / "a.txt", "\ufeffline one\r\n  line two\r\n")  # BOM dropped, \r\n and spaces kept
    b = _write(tmp_path / "b.md", "# Title\n\nbody")
    c = _write(tmp_path / "README", "no extension")
    assert list(iter_documents([a, b, c])) == ["line one\r\n  line two\r\n", "# Title\n\nbody", "no extension"]


def test_jsonl_reads_the_text_field_and_skips_blank_lines(tmp_path):
    lines = [json.dumps({"content": "first", "id": 1}), "", "   ", json.dumps({"content": "second 中文"})]
    path = _write(tmp_path / "d.jsonl", "\n".join(lines) + "\n")
    assert list(iter_documents([path], text_field="content")) == ["first", "second 中文"]


@pytest.mark.parametrize(
    "bad_line, message",
    [("{not json", r"d\.jsonl:3: invalid JSON"), ('{"body": "x"}', r"d\.jsonl:3: no 'text' field.*--text-field"),
     ('{"text": 5}', r"d\.jsonl:3: field 'text' is a int")],
)  # fmt: skip
def test_bad_jsonl_line_names_file_and_line(tmp_path, bad_line, message):
    path = _write(tmp_path / "d.jsonl", '{"text": "a"}\n{"text": "b"}\n' + bad_line + "\n")
    with pytest.raises(DataError, match=message):
        list(iter_documents([path]))


def test_non_utf8_documents_are_skipped_and_counted(tmp_path):
    good = _write(tmp_path / "good.txt", "fine")
    bad = _write(tmp_path / "bad.txt", b"latin-1 caf\xe9")
    lines = b'{"text": "ok 1"}\n{"text": "caf\xe9"}\n{"text": "lone \\ud800 surrogate"}\n{"text": "ok 2"}\n'
    jsonl = _write(tmp_path / "mixed.jsonl", lines)
    stats = ReadStats()
    assert list(iter_documents([good, bad, jsonl], stats=stats)) == ["fine", "ok 1", "ok 2"]
    assert stats.skipped_non_utf8 == 3
    assert stats.non_utf8_examples == [str(bad), f"{jsonl}:2", f"{jsonl}:3"]
    assert stats.documents == 3


def test_parquet_reads_a_string_column_and_applies_the_same_policies(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": ["alpha", None, "", "βeta"], "n": [1, 2, 3, 4]}), path)
    stats = ReadStats()
    assert list(iter_documents([path], stats=stats)) == ["alpha", "βeta"]
    assert stats.skipped_empty == 2
    raw = tmp_path / "raw.parquet"
    pq.write_table(pa.table({"body": pa.array([b"ok", b"\xff\xfe", b"fine"], pa.binary())}), raw)
    stats = ReadStats()
    assert list(iter_documents([raw], text_field="body", stats=stats)) == ["ok", "fine"]
    assert stats.skipped_non_utf8 == 1
    with pytest.raises(DataError, match=r"d\.parquet: no column 'body' \(columns: text, n\)"):
        list(iter_documents([path], text_field="body"))


def test_folders_are_read_recursively_in_sorted_order(tmp_path):
    root = tmp_path / "corpus"
    _write(root / "b.txt", "B")
    _write(root / "a" / "z.md", "AZ")
    _write(root / "a" / "y.jsonl", '{"text": "AY1"}\n{"text": "AY2"}\n')
    pq.write_table(pa.table({"text": ["C"]}), _write(root / "c.parquet", b""))
    _write(root / ".hidden" / "x.txt", "hidden")
    _write(root / ".dot.txt", "hidden")
    _write(root / "notes.csv", "ignored")
    stats = ReadStats()
    assert list(iter_documents([root], stats=stats)) == ["AY1", "AY2", "AZ", "B", "C"]
    assert (stats.files, stats.ignored_files) == (4, 1)


def test_missing_or_unsupported_inputs_are_data_errors(tmp_path):
    with pytest.raises(DataError, match="nope.txt does not exist"):
        list(iter_documents([tmp_path / "nope.txt"]))
    with pytest.raises(DataError, match=r"table\.csv has unsupported type '\.csv'"):
        list(iter_documents([_write(tmp_path / "table.csv", "a,b")]))


# --- embedded corpus ----------------------------------------------------------------------------------------------
def test_embedded_corpus_is_sizeable_unique_and_independent_of_caller_imports():
    size = embedded_corpus_size()
    docs = embedded_documents()
    assert size["documents"] == len(docs) > 3000
    assert size["chars"] > 1_000_000  # about 2 MB on CPython 3.11
    assert len(set(docs)) == len(docs) and all(docs)
    # torch is imported here (it patches inspect/typing); a fresh process without it must see the same corpus.
    code = "import json,sys; from meshlm.data.corpus import embedded_documents as e; sys.stdout.write(json.dumps(e()))"
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True, text=True).stdout
    assert json.loads(fresh) == docs
    assert "torch" in sys.modules


# --- prepare ------------------------------------------------------------------------------------------------------
def test_manifest_describes_shards_with_valid_checksums(dataset_dir, docs):
    m = json.loads((dataset_dir / "manifest.json").read_text())
    tok = MeshTokenizer.load(dataset_dir / "tokenizer.json")
    assert m["format_version"] == 1 and m["dtype"] == "uint16" and m["vocab_size"] == tok.vocab_size == VOCAB
    assert m["tokenizer_sha256"] == sha256_file(dataset_dir / "tokenizer.json")
    assert m["eos_id"] == tok.eos_id and m["special_ids"] == tok.special_ids
    assert m["documents"] == len(docs) == m["splits"]["train"]["documents"] + m["splits"]["val"]["documents"]
    assert m["splits"]["val"]["documents"] >= 1
    assert len(m["splits"]["train"]["shards"]) >= 2
    for split in m["splits"].values():
        assert sum(s["tokens"] for s in split["shards"]) == split["tokens"]
        assert sum(s["documents"] for s in split["shards"]) == split["documents"]
        for shard in split["shards"]:
            raw = np.fromfile(dataset_dir / shard["file"], dtype="<u2")
            assert len(raw) == shard["tokens"] <= SHARD_TOKENS
            assert int((raw == tok.eos_id).sum()) == shard["documents"]  # one eos per document ending here
            assert sha256_file(dataset_dir / shard["file"]) == shard["sha256"]
    assert sorted(p.name for p in dataset_dir.parent.iterdir()) == ["ds"]  # no temp folder left


def test_shards_hold_each_document_then_eos_in_order(ds, docs):
    tok = MeshTokenizer.load(ds.tokenizer_path)
    for split in ("train", "val"):
        expected = [d for i, d in enumerate(docs) if (split_position(d) < 0.01) == (split == "val")]
        if split == "val" and not expected:  # the at-least-one-val rule moved the lowest-hash document
            expected = [min(docs, key=split_position)]
        stream = ds.split(split)[0 : len(ds.split(split))]
        ends = np.flatnonzero(stream == tok.eos_id)
        starts = np.concatenate([[0], ends[:-1] + 1])
        assert [tok.decode(stream[a:b].tolist()) for a, b in zip(starts, ends)] == expected


def test_output_is_identical_for_one_or_two_workers(tmp_path, dataset_dir, docs):
    out = tmp_path / "two"
    prepare_dataset(None, out, documents=docs, vocab_size=VOCAB, num_workers=2, shard_tokens=SHARD_TOKENS)
    names = sorted(p.name for p in dataset_dir.iterdir())
    assert names == sorted(p.name for p in out.iterdir())
    for name in names:
        assert (out / name).read_bytes() == (dataset_dir / name).read_bytes(), name


def test_dtype_is_uint16_up_to_65536_ids_else_uint32():
    assert token_dtype(512) == np.dtype("<u2")
    assert token_dtype(65536) == np.dtype("<u2")  # ids 0..65535
    assert token_dtype(65537) == np.dtype("<u4")
    assert token_dtype(128_256) == np.dtype("<u4")


def test_existing_output_is_refused_unless_overwrite(tmp_path, docs):
    out = tmp_path / "out"
    _write(out / "keep.txt", "user file")
    with pytest.raises(DataError, match="already exists.*--overwrite"):
        prepare_dataset(None, out, documents=docs[:20], vocab_size=300, num_workers=1)
    with pytest.raises(DataError, match="holds no manifest.json, so it is not replaced"):  # never deletes a non-dataset
        prepare_dataset(None, out, documents=docs[:20], vocab_size=300, num_workers=1, overwrite=True)
    assert (out / "keep.txt").read_text() == "user file"
    (out / "keep.txt").unlink()  # an existing empty folder is fine
    first = prepare_dataset(None, out, documents=docs[:20], vocab_size=300, num_workers=1)
    second = prepare_dataset(None, out, documents=docs[20:40], vocab_size=300, num_workers=1, overwrite=True)
    assert first["splits"] != second["splits"]
    assert json.loads((out / "manifest.json").read_text()) == second
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("documents", [[], ["", ""]])
def test_empty_corpus_is_a_data_error(tmp_path, documents):
    with pytest.raises(DataError, match="no documents to prepare"):
        prepare_dataset(None, tmp_path / "out", documents=documents, vocab_size=300)
    assert not (tmp_path / "out").exists()


def test_prepare_reads_files_and_reuses_a_given_tokenizer(tmp_path, dataset_dir):
    _write(tmp_path / "in" / "a.jsonl", '{"text": "hello there"}\n{"text": "caf\xe9"}\n'.encode("latin-1"))
    _write(tmp_path / "in" / "b.txt", "general kenobi")
    m = prepare_dataset([tmp_path / "in"], tmp_path / "out", tokenizer=dataset_dir / "tokenizer.json", num_workers=1)
    assert m["source"] == {"kind": "files", "inputs": [str(tmp_path / "in")], "text_field": "text"}
    assert m["tokenizer_trained"] is False and m["requested_vocab_size"] is None
    assert m["tokenizer_sha256"] == sha256_file(dataset_dir / "tokenizer.json")
    assert (m["documents"], m["skipped_non_utf8"]) == (2, 1)
    assert m["splits"]["train"]["documents"] == m["splits"]["val"]["documents"] == 1  # >= 1 of each


def test_prepare_reports_a_bad_input_line_and_leaves_nothing_behind(tmp_path):
    _write(tmp_path / "in" / "x.jsonl", '{"text": "fine"}\n{broken\n')
    with pytest.raises(DataError, match=r"x\.jsonl:2: invalid JSON"):  # raised inside tokenizer training
        prepare_dataset([tmp_path / "in"], tmp_path / "out", vocab_size=300)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def test_split_rule_edge_cases(tmp_path):
    texts = ["first document", "second document", "third document"]
    none_val = prepare_dataset(None, tmp_path / "a", documents=texts, vocab_size=300, val_fraction=0.0)
    assert none_val["splits"]["val"]["documents"] == 0
    single = prepare_dataset(None, tmp_path / "b", documents=texts[:1], vocab_size=300, val_fraction=0.99)
    assert single["splits"]["train"]["documents"] == 1  # a lone document always trains
    with pytest.raises(DataError, match="val_fraction"):
        prepare_dataset(None, tmp_path / "c", documents=texts, val_fraction=1.0)


def test_ensure_embedded_dataset_builds_once_and_survives_a_race(tmp_path, monkeypatch, docs):
    monkeypatch.setenv("MESHLM_CACHE", str(tmp_path / "cache"))
    assert default_cache_dir() == tmp_path / "cache"
    monkeypatch.setattr(prep, "embedded_documents", lambda: docs[:50])  # keep the test fast
    real_second_pass = prep._second_pass
    target = tmp_path / "cache" / f"embedded-{prep.CORPUS_VERSION}-v300"

    def rival_finishes_first(*args, **kwargs):  # another process publishes while this one tokenizes
        monkeypatch.setattr(prep, "_second_pass", real_second_pass)
        prepare_dataset(None, target, documents=docs[:50], vocab_size=300, num_workers=1, source="rival")
        return real_second_pass(*args, **kwargs)

    monkeypatch.setattr(prep, "_second_pass", rival_finishes_first)
    assert ensure_embedded_dataset(None, 300, num_workers=1) == target
    assert json.loads((target / "manifest.json").read_text())["source"]["description"] == "rival"  # winner kept
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name]  # loser's temp folder removed
    before = (target / "manifest.json").stat().st_mtime_ns
    assert ensure_embedded_dataset(None, 300, num_workers=1) == target
    assert (target / "manifest.json").stat().st_mtime_ns == before  # reused, not rebuilt


# --- dataset ------------------------------------------------------------------------------------------------------
@pytest.fixture
def damaged_copy(tmp_path, dataset_dir) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(dataset_dir, copy)
    return copy


def test_truncated_shard_is_detected(damaged_copy):
    shard = damaged_copy / "train-00001.bin"
    os.truncate(shard, shard.stat().st_size - 2)
    with pytest.raises(DataError, match=r"shard .*train-00001\.bin is corrupted \(size.*re-run `meshlm prepare`"):
        TokenDataset(damaged_copy, verify=False)  # the size check runs even without checksums


def test_flipped_byte_is_detected(damaged_copy):
    shard = damaged_copy / "val-00000.bin"
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    shard.write_bytes(bytes(raw))
    with pytest.raises(DataError, match=r"val-00000\.bin is corrupted \(checksum mismatch\); re-run `meshlm prepare`"):
        TokenDataset(damaged_copy)


def test_missing_or_invalid_manifest_names_the_file(tmp_path, damaged_copy):
    with pytest.raises(DataError, match=r"nothing/manifest\.json not found"):
        TokenDataset(tmp_path / "nothing")
    (damaged_copy / "manifest.json").write_text("{broken")
    with pytest.raises(DataError, match=r"copy/manifest\.json is not a readable JSON manifest"):
        TokenDataset(damaged_copy)


def test_split_stream_reads_across_shard_boundaries(ds, dataset_dir):
    train = ds.split("train")
    files = [s["file"] for s in ds.manifest["splits"]["train"]["shards"]]
    whole = np.concatenate([np.fromfile(dataset_dir / f, dtype="<u2") for f in files])
    assert len(train) == len(whole)
    across = slice(SHARD_TOKENS - 5, 2 * SHARD_TOKENS + 5)  # spans three shards
    assert np.array_equal(train[across], whole[across])
    with pytest.raises(DataError, match="no split 'test'; available: train, val"):
        ds.split("test")


# --- loader -------------------------------------------------------------------------------------------------------
def _batches(loader: SequenceLoader, n: int) -> list[dict[str, torch.Tensor]]:
    return [loader.next_batch() for _ in range(n)]


def _same(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(torch.equal(x[k], y[k]) for x, y in zip(a, b) for k in ("input_ids", "labels"))


def test_windows_are_consecutive_and_labels_are_shifted_inputs(ds):
    loader = SequenceLoader(ds, "train", seq_len=32, global_batch_size=4, shuffle=False)
    tokens = ds.split("train")
    for b, batch in enumerate(_batches(loader, 3)):
        assert batch["input_ids"].shape == batch["labels"].shape == (4, 32)
        assert batch["input_ids"].dtype == batch["labels"].dtype == torch.int64
        assert torch.equal(batch["input_ids"][:, 1:], batch["labels"][:, :-1])
        for row in range(4):
            i = b * 4 + row
            window = torch.from_numpy(tokens[i * 32 : i * 32 + 33].astype(np.int64))
            assert torch.equal(batch["input_ids"][row], window[:-1]) and torch.equal(batch["labels"][row], window[1:])


def test_same_seed_same_batches_other_seed_other_batches(ds):
    make = lambda seed: SequenceLoader(ds, "train", 16, 8, seed=seed)  # noqa: E731
    assert _same(_batches(make(3), 4), _batches(make(3), 4))
    assert not _same(_batches(make(3), 4), _batches(make(4), 4))


def test_dp_ranks_take_disjoint_slices_whose_union_is_the_global_batch(ds):
    reference = _batches(SequenceLoader(ds, "train", 16, 8, seed=7), 3)
    ranks = [SequenceLoader(ds, "train", 16, 8, dp_rank=r, dp_size=4, seed=7) for r in range(4)]
    for step in range(3):
        parts = [loader.next_batch() for loader in ranks]
        assert all(p["input_ids"].shape == (2, 16) for p in parts)
        union = torch.cat([p["input_ids"] for p in parts])
        assert torch.equal(union, reference[step]["input_ids"])
        assert len({tuple(row.tolist()) for row in union}) == 8  # no window on two ranks


def test_resume_from_state_gives_exactly_the_next_batch(ds):
    loader = SequenceLoader(ds, "train", 16, 8, seed=1)
    _batches(loader, 5)
    state = json.loads(json.dumps(loader.state_dict()))  # must survive a JSON round trip
    expected = _batches(loader, 2)
    resumed = SequenceLoader(ds, "train", 16, 8, seed=999)  # the seed comes from the state
    resumed.load_state_dict(state)
    assert _same(_batches(resumed, 2), expected)


def test_resume_with_another_dp_size_continues_the_global_order(ds):
    reference = _batches(SequenceLoader(ds, "train", 16, 8, seed=2), 5)
    two = [SequenceLoader(ds, "train", 16, 8, dp_rank=r, dp_size=2, seed=2) for r in range(2)]
    for _ in range(3):
        for loader in two:
            loader.next_batch()
    assert two[0].state_dict() == two[1].state_dict()  # global terms: identical on every rank
    four = [SequenceLoader(ds, "train", 16, 8, dp_rank=r, dp_size=4, seed=2) for r in range(4)]
    for loader in four:
        loader.load_state_dict(two[0].state_dict())
    for step in (3, 4):
        union = torch.cat([loader.next_batch()["labels"] for loader in four])
        assert torch.equal(union, reference[step]["labels"])


def test_an_epoch_visits_every_window_once_then_reshuffles(ds):
    loader = SequenceLoader(ds, "val", seq_len=256, global_batch_size=1, seed=5)
    n = loader.num_windows
    assert n >= 3
    rows = [tuple(b["input_ids"][0].tolist()) for b in _batches(loader, 2 * n)]
    assert len(set(rows[:n])) == n and set(rows[:n]) == set(rows[n:])
    assert rows[:n] != rows[n:] and loader.epoch == 2


def test_eval_loader_reset_repeats_the_first_batches(ds):
    loader = SequenceLoader(ds, "val", 16, 4, shuffle=False)
    first = _batches(loader, 2)
    loader.reset()
    assert _same(_batches(loader, 2), first)


def test_loader_errors(ds):
    with pytest.raises(DataError, match="global batch size 6 is not divisible by the data-parallel size 4"):
        SequenceLoader(ds, "train", 16, 6, dp_size=4)
    with pytest.raises(DataError, match=r"split 'val' .* too few for one window of seq_len 10000000"):
        SequenceLoader(ds, "val", 10_000_000, 1)
    state = SequenceLoader(ds, "train", 16, 8).state_dict()
    with pytest.raises(DataError, match="seq_len=16 but this loader has 32"):
        SequenceLoader(ds, "train", 32, 8).load_state_dict(state)
    with pytest.raises(DataError, match="global_batch_size=8 but this loader has 16"):
        SequenceLoader(ds, "train", 16, 16).load_state_dict(state)


# --- statistics ---------------------------------------------------------------------------------------------------
def test_unigram_entropy_matches_the_closed_form(tmp_path, dataset_dir):
    # A hand-made dataset whose train stream is [5,5,5,5,6,6,7,8]: p = (1/2, 1/4, 1/8, 1/8).
    out = tmp_path / "hand"
    out.mkdir()
    shutil.copy(dataset_dir / "tokenizer.json", out / "tokenizer.json")
    np.array([5, 5, 6, 5, 7, 6, 5, 8], dtype="<u2").tofile(out / "train-00000.bin")
    manifest = json.loads((dataset_dir / "manifest.json").read_text())
    sha = sha256_file(out / "train-00000.bin")
    shard = {"file": "train-00000.bin", "tokens": 8, "documents": 0, "sha256": sha}
    manifest["splits"] = {"train": {"documents": 0, "tokens": 8, "shards": [shard]}}
    (out / "manifest.json").write_text(json.dumps(manifest))
    expected = -(0.5 * math.log(0.5) + 0.25 * math.log(0.25) + 2 * 0.125 * math.log(0.125))  # 1.75 bits in nats
    assert unigram_entropy(TokenDataset(out)) == pytest.approx(expected, rel=1e-12)


def test_unigram_entropy_of_the_prepared_corpus_is_plausible(ds):
    h = unigram_entropy(ds)
    assert 0 < h < math.log(ds.vocab_size)  # below the uniform distribution's entropy
