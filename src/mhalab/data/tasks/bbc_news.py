"""BBC News, read offline (`mhalab.data.bbc_news`): topic classification, and its text for language modelling."""

from __future__ import annotations

from mhalab.data import bbc_news
from mhalab.data.tasks.base import Task, TaskInfo


class BbcNews(Task):
    """Topic classification of the 2,127 deduplicated articles (5 topics); BPE by default."""

    name = "bbc_news"
    info = TaskInfo("classification", "bbc_news", tuple(bbc_news.LABEL_NAMES), default_tokenizer="bpe")

    def load(self, cfg):
        from datasets import DatasetDict

        return DatasetDict({"train": bbc_news.load_bbc_news()})

    def where(self, cfg) -> str:
        return "BBC News"

    def fingerprint(self) -> dict:
        """The content of the files the text is read from (part of the cache key)."""
        from mhalab.data import cache

        return {"bbc_news": cache.tree_digest(bbc_news.corpus_dir())}


class BbcNewsMlm(BbcNews):
    """Masked language modelling on the same documents (the same document split: it is stratified by topic)."""

    name = "bbc_news_mlm"
    info = TaskInfo("mlm", "bbc_news")


class BbcNewsLm(BbcNews):
    """The default job: next byte, causal, on the same documents."""

    name = "bbc_news_lm"
    info = TaskInfo("clm", "bbc_news")
