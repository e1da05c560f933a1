"""Reference levels of a task, the lines a result is read against: what a model that ignores the input scores.

Keys name the level and the metric's unit (`<level>_<metric>`), so a report draws each on the plots of that metric:
- classification: `chance_acc` = 1 / classes; `majority_acc` = the training split's most frequent class, scored on
  the validation split;
- language modelling on text: `unigram_bpb` and `unigram_acc`: the training split's token frequencies (add-one
  smoothed) as the prediction of every predicted validation token, in bits per byte and accuracy.
"""

from __future__ import annotations

import math
from collections import Counter


def classification_levels(train_labels, val_labels, n_classes: int) -> dict[str, float]:
    train, val = Counter(int(x) for x in train_labels), [int(x) for x in val_labels]
    majority = train.most_common(1)[0][0] if train else 0
    return {"chance_acc": 1.0 / n_classes,
            "majority_acc": sum(v == majority for v in val) / max(len(val), 1)}


def unigram_levels(train_tokens, val_tokens, vocab_size: int, token_bytes) -> dict[str, float]:
    """train_tokens / val_tokens: 1-D integer arrays of predicted token ids; token_bytes: (vocab,) bytes per id."""
    import numpy as np

    counts = np.bincount(np.asarray(train_tokens, dtype=np.int64), minlength=vocab_size).astype(np.float64)
    logp = np.log((counts + 1.0) / (counts.sum() + vocab_size))  # add-one smoothing
    val = np.asarray(val_tokens, dtype=np.int64)
    nats = -float(logp[val].sum())
    nbytes = float(np.asarray(token_bytes, dtype=np.float64)[val].sum())
    return {"unigram_bpb": nats / (math.log(2) * max(nbytes, 1.0)),
            "unigram_acc": float((val == int(counts.argmax())).mean()) if val.size else 0.0}
