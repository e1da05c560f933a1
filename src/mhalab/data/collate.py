"""Batch collation: dynamic padding, and BERT masking (MLM) or shifted targets (CLM).

Every batch is ``{"input_ids": (B, T) long, "padding_mask": (B, T) bool (True = padding), "labels": ...}``,
with T the longest sequence in the batch.  ``labels`` is (B,) for classification and (B, T) for mlm/clm
with -100 where nothing is predicted.
"""

from __future__ import annotations

import torch

IGNORE_INDEX = -100
EVAL_MASK_SEEDS = {"validation": 1_000_003, "test": 2_000_003}  # fixed: val loss comparable across runs


def pad(sequences: list[torch.Tensor], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad 1-D id tensors to the longest; return (input_ids, padding_mask)."""
    lengths = torch.tensor([len(s) for s in sequences])
    input_ids = torch.nn.utils.rnn.pad_sequence(list(sequences), batch_first=True, padding_value=pad_id).long()
    padding_mask = torch.arange(input_ids.shape[1])[None, :] >= lengths[:, None]
    return input_ids, padding_mask


def unpadded(input_ids: torch.Tensor) -> torch.Tensor:
    """The padding mask (B, T) of a batch of sequences of one length: all False."""
    return torch.zeros(input_ids.shape, dtype=torch.bool)


class ClassificationCollator:
    """``[CLS] + tokens`` examples with one label each; also a batch read as whole columns (``Columns``)."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        if isinstance(examples, dict):  # Columns: (B, T) ids of one length, (B,) labels
            ids = examples["input_ids"]
            return {"input_ids": ids, "padding_mask": unpadded(ids), "labels": examples["label"]}
        input_ids, padding_mask = pad([e["input_ids"] for e in examples], self.pad_id)
        labels = torch.tensor([int(e["label"]) for e in examples], dtype=torch.long)
        return {"input_ids": input_ids, "padding_mask": padding_mask, "labels": labels}


class CausalLMCollator:
    """Next-token targets: ``labels[t] = input_ids[t + 1]``; the last position and padding get -100."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        input_ids, padding_mask = pad([e["input_ids"] for e in examples], self.pad_id)
        labels = torch.full_like(input_ids, IGNORE_INDEX)
        labels[:, :-1] = input_ids[:, 1:].masked_fill(padding_mask[:, 1:], IGNORE_INDEX)
        return {"input_ids": input_ids, "padding_mask": padding_mask, "labels": labels}


class LabelledCollator:
    """Examples that carry their own per-position ``labels`` (synthetic tasks): padded, passed through; also a
    batch read as whole columns (``Columns``)."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        if isinstance(examples, dict):  # Columns: (B, T) ids and labels of one length
            ids = examples["input_ids"]
            return {"input_ids": ids, "padding_mask": unpadded(ids), "labels": examples["labels"]}
        input_ids, padding_mask = pad([e["input_ids"] for e in examples], self.pad_id)
        labels, _ = pad([e["labels"] for e in examples], IGNORE_INDEX)
        return {"input_ids": input_ids, "padding_mask": padding_mask, "labels": labels}


class MLMCollator:
    """BERT masking: each non-special token is chosen with ``mlm_probability``; a chosen token becomes
    [MASK] (80%), a random non-special token (10%) or stays (10%); ``labels`` hold the original id there.

    Every example is masked by its own generator, seeded from (seed, epoch, example index): with an ``eval_seed``
    the masks are the same in every epoch, run, batch size and worker layout (validation, test); with a
    ``train_seed`` they are fresh every epoch (the example's ``epoch`` field, set by ``EpochIndexed``). Nothing
    depends on the collator's own state, so worker processes mask exactly as the main process would. Every
    sequence with a maskable token gets at least one prediction so that the loss is always defined.
    """

    def __init__(
        self, pad_id: int, mask_id: int, n_special: int, vocab_size: int, mlm_probability: float,
        eval_seed: int | None = None, train_seed: int | None = None,
    ) -> None:
        if (eval_seed is None) == (train_seed is None):
            raise ValueError("MLMCollator needs exactly one of eval_seed and train_seed")
        self.pad_id, self.mask_id, self.n_special, self.vocab_size = pad_id, mask_id, n_special, vocab_size
        self.p = mlm_probability
        self.eval_seed, self.train_seed = eval_seed, train_seed

    def seed_of(self, example: dict) -> int:
        if self.eval_seed is not None:
            return self.eval_seed + int(example["idx"])
        return self.train_seed * 1_000_003 + int(example.get("epoch", 0)) * 10_000_019 + int(example["idx"])

    def mask(self, ids: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Mask one 1-D sequence; return (masked ids, labels)."""
        ids = ids.long()
        u_choose, u_kind = torch.rand(2, len(ids), generator=generator)
        random_ids = torch.randint(self.n_special, self.vocab_size, ids.shape, generator=generator)
        maskable = ids >= self.n_special
        chosen = maskable & (u_choose < self.p)
        if maskable.any() and not chosen.any():
            chosen[torch.argmax(torch.where(maskable, u_choose.neg(), -2.0))] = True  # the likeliest one
        labels = torch.where(chosen, ids, IGNORE_INDEX)
        out = torch.where(chosen & (u_kind < 0.8), self.mask_id, ids)
        out = torch.where(chosen & (u_kind >= 0.9), random_ids, out)
        return out, labels

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        masked, labels = [], []
        for e in examples:
            m, lab = self.mask(e["input_ids"], torch.Generator().manual_seed(self.seed_of(e)))
            masked.append(m)
            labels.append(lab)
        input_ids, padding_mask = pad(masked, self.pad_id)
        label_ids, _ = pad(labels, IGNORE_INDEX)
        return {"input_ids": input_ids, "padding_mask": padding_mask, "labels": label_ids}
