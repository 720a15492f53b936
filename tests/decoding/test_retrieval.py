"""Retrieval drafting: the trie tree, a corpus-backed drafter that accepts, and losslessness."""

import numpy as np
import pytest
from tiny_models import greedy_target

from warpdecode.decoding.drafters.retrieval import RetrievalDrafter, corpus_datastore, trie_tree
from warpdecode.decoding.generate import build_method, generate
from warpdecode.errors import ConfigError
from warpdecode.models.tokenizer import Tokenizer, train_bpe


def test_trie_keeps_the_most_supported_nodes_best_first():
    rows = np.array([[1, 2], [1, 3], [1, 2], [4, 5]])
    tree = trie_tree(rows, num_nodes=3)
    assert tree.tokens.tolist() == [1, 2, 3] and tree.parents.tolist() == [-1, 0, 0]
    padded = trie_tree(np.array([[7, -1], [7, 8]]), num_nodes=8)
    assert padded.tokens.tolist() == [7, 8] and padded.parents.tolist() == [-1, 0]


def test_retrieval_drafts_what_the_corpus_continues_and_stays_lossless(tmp_path, single_thread):
    """The target's own greedy continuation is the corpus: retrieval drafts it and it is accepted."""
    target = greedy_target()
    prompt = [3, 9, 27, 17, 51, 25]
    plain = generate(target, None, prompt, max_new_tokens=40, stop_at_eos=False)
    corpus = tmp_path / "corpus.npy"
    rng = np.random.default_rng(0)
    np.save(corpus, np.concatenate([rng.integers(0, 64, 500), prompt + plain.token_ids, rng.integers(0, 64, 500)]))
    method = build_method("retrieval", options={"corpus": str(corpus)})
    out = generate(target, None, prompt, max_new_tokens=40, stop_at_eos=False, method=method)
    assert out.token_ids == plain.token_ids
    assert out.stats.tau > 3


def test_missing_corpus_and_bad_options_are_config_errors(tmp_path, single_thread):
    with pytest.raises(ConfigError, match="not found"):
        generate(greedy_target(), None, [1, 2], max_new_tokens=2,
                 method=build_method("retrieval", options={"corpus": str(tmp_path / "none.npy")}))
    with pytest.raises(ConfigError, match="max_ngram"):
        RetrievalDrafter(max_ngram=1)


def test_a_text_corpus_is_tokenised_into_the_datastore(tmp_path, monkeypatch):
    """A folder source goes through `data.corpus` (the training DataModule is not involved): the
    datastore holds the train split's blocks, at most `max_tokens` of them, in the tokenizer's ids."""
    monkeypatch.setenv("WARPDECODE_CACHE", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "kappa", "sigma", "omega", "theta"]
    folder = tmp_path / "texts"
    folder.mkdir()
    for i in range(60):
        (folder / f"doc{i}.txt").write_text(" ".join(rng.choice(words, 600)) + "\n")
    tokenizer_dir = tmp_path / "tokenizer"
    train_bpe(iter(" ".join(words) for _ in range(10)), 300).save(tokenizer_dir)
    vocab = Tokenizer.load(tokenizer_dir).vocab_size
    store = corpus_datastore.__wrapped__(str(folder), str(tokenizer_dir), 100_000, vocab)
    small = corpus_datastore.__wrapped__(str(folder), str(tokenizer_dir), 2048, vocab)
    assert store.num_tokens > small.num_tokens == 2 * 1024
    short = tmp_path / "short"
    short.mkdir()
    for i in range(60):
        (short / f"doc{i}.txt").write_text("alpha beta\n")
    with pytest.raises(ConfigError, match="has no complete block"):
        corpus_datastore.__wrapped__(str(short), str(tokenizer_dir), 100_000, vocab)
