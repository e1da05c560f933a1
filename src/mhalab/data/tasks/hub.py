"""Tasks read from the Hugging Face Hub (`mhalab.data.hub`: downloads once, then offline from the cache)."""

from __future__ import annotations

from mhalab.data.tasks.base import Task, TaskInfo
from mhalab.errors import ConfigError


class HubTask(Task):
    """A Hub dataset's train/validation/test; splits without labels (e.g. SST-2's test) are left out."""

    def load(self, cfg):
        from datasets import DatasetDict

        from mhalab.data import hub
        from mhalab.data.splits import SPLITS

        info = self.info
        dd = hub.load_hub(cfg.task, info.hub_repo, info.hub_config, cfg.hf_cache_dir)
        out = {}
        for split in SPLITS:
            if split not in dd:
                continue
            ds = dd[split]
            if cfg.text_column not in ds.column_names:
                raise ConfigError(
                    f"data.text_column={cfg.text_column!r} is not a column of {info.hub_repo}; "
                    f"columns are {ds.column_names}."
                )
            keep = {cfg.text_column: "text"}
            if cfg.objective == "classification":
                if cfg.label_column not in ds.column_names:
                    raise ConfigError(
                        f"data.label_column={cfg.label_column!r} is not a column of {info.hub_repo}; "
                        f"columns are {ds.column_names}."
                    )
                if min(ds[cfg.label_column]) < 0:  # unlabelled split (labels -1)
                    continue
                keep[cfg.label_column] = "label"
            ds = ds.select_columns(list(keep)).rename_columns({k: v for k, v in keep.items() if k != v})
            out[split] = ds.add_column("id", [f"{split}-{i}" for i in range(len(ds))])
        if "train" not in out:
            raise ConfigError(f"the Hub dataset {info.hub_repo} has no labelled 'train' split for "
                              f"data.task={cfg.task}.")
        return DatasetDict(out)

    def where(self, cfg) -> str:
        return self.info.hub_repo


class AgNews(HubTask):
    name = "ag_news"
    info = TaskInfo("classification", "hub", ("World", "Sports", "Business", "Sci/Tech"), "fancyzhx/ag_news")


class Imdb(HubTask):
    name = "imdb"
    info = TaskInfo("classification", "hub", ("neg", "pos"), "stanfordnlp/imdb")


class Sst2(HubTask):
    name = "sst2"
    info = TaskInfo("classification", "hub", ("negative", "positive"), "stanfordnlp/sst2", text_column="sentence")


class WikiText2(HubTask):
    name = "wikitext2"
    info = TaskInfo("mlm", "hub", None, "Salesforce/wikitext", "wikitext-2-raw-v1")


class WikiText103(HubTask):
    name = "wikitext103"
    info = TaskInfo("clm", "hub", None, "Salesforce/wikitext", "wikitext-103-raw-v1")


class TinyShakespeare(HubTask):
    name = "tiny_shakespeare"
    info = TaskInfo("clm", "hub", None, "karpathy/tiny_shakespeare")
